#!/usr/bin/env python3
"""Draws grafana/dashboard.json from its own queries, without Grafana: for the README's picture of
the dashboard with the data of the node agent's end-to-end test (no Grafana runs where the
pictures are made).

It reads the dashboard's panels (title, type, gridPos, targets, legendFormat, unit, stacking,
thresholds, value mappings, the overrides that dash or unfill a series) and its annotations,
fills in the template variables it is given, asks a Prometheus's HTTP API what Grafana's
Prometheus data source would ask (query_range for each target, an instant query for targets
marked `instant`), and draws every panel as SVG inside an HTML page laid out by gridPos on
Grafana's 24-column grid. Annotations are asked at the panels' step (not their own 30 s, which
is longer than the test's whole story) and drawn as bands on every time series. It is an
approximation of Grafana's look, not Grafana: fonts, axis ticks and colours differ; the numbers
and series are exactly what the queries return.

usage: python3 docs/tools/render_dashboard.py --prometheus http://HOST:PORT --start UNIX
         --end UNIX [--step 1] --var instance=NODE --var gpu=0 --var namespace=NS --var pod=POD
         [--var __rate_interval=4s] --html OUT.html [--width 1280]
(`.*`, a variable's All, is shown as All; `(a|b)`, two values picked, as a + b.) Prints the page's size as JSON. Standard library
only. The README's picture: `cargo test --release --test it -- --ignored e2e::pictures` runs
the end-to-end test's node slowly, this script on its Prometheus, and headless Chromium.
"""

import argparse
import html
import json
import math
import os
import re
import sys
import urllib.parse
import urllib.request

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# Grafana's grid: 24 columns, rows of 30 px, 8 px between panels.
COLUMNS, ROW_PX, GAP_PX = 24, 30, 8
HEADER_PX = 74
# Grafana's classic palette, in its order, and its named colours.
PALETTE = ["#7EB26D", "#EAB839", "#6ED0E0", "#EF843C", "#E24D42", "#1F78C1", "#BA43A6",
           "#705DA0", "#508642", "#CCA300", "#447EBC", "#C15C17", "#890F02", "#0A437C"]
NAMED = {"green": "#73BF69", "yellow": "#FADE2A", "orange": "#FF9830", "red": "#F2495C",
         "blue": "#5794F2", "purple": "#B877D9", "transparent": "none"}
BACKGROUND, PANEL, TEXT, DIM, GRID = "#111217", "#181b1f", "#ccccdc", "#8e8e9e", "#2c3036"


def colour(name):
    return NAMED.get(name, name)


def substitute(text, values):
    """$name, ${name} and ${name:format} replaced by their values (an unknown one is an error)."""
    def one(match):
        name = match.group(1) or match.group(2)
        if name not in values:
            sys.exit(f"no value for the variable ${name} in {text}")
        return values[name]
    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", one, text)


class Prometheus:
    def __init__(self, url):
        self.url = url.rstrip("/")

    def get(self, path, params):
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=30) as reply:
            body = json.load(reply)
        if body.get("status") != "success":
            raise RuntimeError(f"{params}: {body.get('error')}")
        return body["data"]["result"]

    def range(self, promql, start, end, step):
        result = self.get("/api/v1/query_range",
                          {"query": promql, "start": start, "end": end, "step": step})
        return [(s["metric"], [(float(t), float(v)) for t, v in s["values"]]) for s in result]

    def instant(self, promql, at):
        result = self.get("/api/v1/query", {"query": promql, "time": at})
        return [(s["metric"], [(float(s["value"][0]), float(s["value"][1]))]) for s in result]


def legend(fmt, metric):
    if not fmt:
        return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(metric.items())) + "}"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt)


def fmt_value(value, unit):
    """A value as Grafana's unit would show it (bytes are IEC)."""
    if value is None or math.isnan(value):
        return "–"
    if unit == "bytes":
        for suffix, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if abs(value) >= size:
                return f"{value / size:.3g} {suffix}"
        return f"{value:.0f} B"
    if unit == "percentunit":
        return f"{value * 100:.3g}%"
    if unit == "s":
        for suffix, size in (("hour", 3600), ("min", 60)):
            if abs(value) >= size:
                return f"{value / size:.3g} {suffix}"
        return f"{value:.3g} s"
    if unit == "ops":
        return f"{value:.3g} ops/s"
    for suffix, size in (("Mil", 1e6), ("K", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.3g} {suffix}"
    return f"{value:.3g}"


def threshold_colour(value, steps):
    chosen = steps[0]["color"] if steps else "green"
    for step in steps:
        if step.get("value") is not None and value is not None and value >= step["value"]:
            chosen = step["color"]
    return colour(chosen)


def overridden(name, overrides):
    """The override properties whose byRegexp matcher matches a series' display name."""
    props = {}
    for override in overrides:
        matcher = override.get("matcher", {})
        if matcher.get("id") == "byRegexp" and re.fullmatch(matcher.get("options", ""), name):
            for prop in override.get("properties", []):
                props[prop["id"]] = prop["value"]
    return props


def last(points):
    values = [v for _, v in points if not math.isnan(v)]
    return values[-1] if values else None


def calc(name, points):
    values = [v for _, v in points if not math.isnan(v)]
    if not values:
        return None
    return {"lastNotNull": values[-1], "max": max(values), "min": min(values),
            "mean": sum(values) / len(values)}.get(name)


def nice_ticks(low, high, unit, count=4):
    """About `count` round ticks from low to high; a byte axis is round in the IEC unit its
    values are shown in (10 GiB steps, not 10.7 GB ones)."""
    if high <= low:
        high = low + 1
    scale = 1
    if unit == "bytes":
        scale = next((size for size in (1 << 40, 1 << 30, 1 << 20, 1 << 10) if high >= size), 1)
    raw = (high - low) / scale / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw) * scale
    ticks, tick = [], math.floor(low / step) * step
    while tick < high + step:
        ticks.append(tick)
        tick += step
    return ticks


def svg_timeseries(panel, series, bands, box, span):
    """Lines (stacked where the panel stacks), y axis in the panel's unit, annotation bands,
    threshold lines, and a legend table with the panel's calcs."""
    width, height = box
    defaults = panel.get("fieldConfig", {}).get("defaults", {})
    custom = defaults.get("custom", {})
    overrides = panel.get("fieldConfig", {}).get("overrides", [])
    unit = defaults.get("unit", "short")
    calcs = panel.get("options", {}).get("legend", {}).get("calcs", [])
    stacked = custom.get("stacking", {}).get("mode") == "normal"
    legend_rows = min(len(series), 6)
    legend_px = 18 * (legend_rows + 1) + 4
    left, right, top = 64, 10, 6
    plot_w, plot_h = width - left - right, max(height - legend_px - top - 20, 30)
    t0, t1 = span
    # Stack: each series on top of those before it, point by point (same timestamps: one query
    # step for all).
    drawn, base = [], {}
    for name, points in series:
        props = overridden(name, overrides)
        if stacked:
            stacked_points = []
            for t, v in points:
                below = base.get(t, 0.0)
                stacked_points.append((t, v + below, below))
                base[t] = v + below
        else:
            stacked_points = [(t, v, 0.0) for t, v in points]
        drawn.append((name, points, stacked_points, props))
    values = [v for _, _, sp, _ in drawn for _, v, _ in sp if not math.isnan(v)]
    # The axis starts at the panel's min (or soft min, 0 here) and ends at its max, or a tick
    # above the data.
    soft_min = defaults.get("min", custom.get("axisSoftMin"))
    low = min([soft_min] + values) if soft_min is not None else min(values or [0])
    ticks = nice_ticks(low, defaults.get("max", max(values or [1]) or 1), unit)
    high = defaults.get("max", ticks[-1])
    x = lambda t: left + (t - t0) / max(t1 - t0, 1e-9) * plot_w
    y = lambda v: top + plot_h - (v - low) / max(high - low, 1e-9) * plot_h
    out = [f'<svg width="{width}" height="{height}" font-size="11" fill="{DIM}">']
    for tick in ticks:
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" stroke="{GRID}"/>')
        out.append(f'<text x="{left - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">{html.escape(fmt_value(tick, unit))}</text>')
    for i in range(5):
        t = t0 + (t1 - t0) * i / 4
        label = f"{int(t - t0)} s"
        out.append(f'<text x="{x(t):.1f}" y="{top + plot_h + 14}" text-anchor="middle">{label}</text>')
    for start, end, band_colour in bands:
        out.append(f'<rect x="{x(start):.1f}" y="{top}" width="{max(x(end) - x(start), 2):.1f}" height="{plot_h}" fill="{band_colour}" fill-opacity="0.18"/>')
        out.append(f'<line x1="{x(start):.1f}" x2="{x(start):.1f}" y1="{top}" y2="{top + plot_h}" stroke="{band_colour}" stroke-dasharray="3,3"/>')
    if custom.get("thresholdsStyle", {}).get("mode") == "line":
        for step in defaults.get("thresholds", {}).get("steps", []):
            if step.get("value") is not None and low <= step["value"] <= high:
                out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y(step["value"]):.1f}" y2="{y(step["value"]):.1f}" stroke="{colour(step["color"])}" stroke-dasharray="4,4"/>')
    for index, (name, points, stacked_points, props) in enumerate(drawn):
        line_colour = colour(props.get("color", {}).get("fixedColor", PALETTE[index % len(PALETTE)]))
        fill = props.get("custom.fillOpacity", custom.get("fillOpacity", 0)) / 100
        line_width = props.get("custom.lineWidth", custom.get("lineWidth", 1))
        dash = "8,6" if props.get("custom.lineStyle", {}).get("fill") == "dash" else ""
        # Gaps where the series has no point (spanNulls false): one path per run of points.
        runs, run, step = [], [], None
        times = [t for t, _, _ in stacked_points]
        if len(times) > 1:
            step = min(b - a for a, b in zip(times, times[1:]))
        for point in stacked_points:
            if run and step and point[0] - run[-1][0] > step * 1.5:
                runs.append(run)
                run = []
            run.append(point)
        if run:
            runs.append(run)
        for run in runs:
            line = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v, _ in run)
            if fill > 0:
                under = " ".join(f"{x(t):.1f},{y(b):.1f}" for t, _, b in reversed(run))
                out.append(f'<polygon points="{line} {under}" fill="{line_colour}" fill-opacity="{fill:.2f}" stroke="none"/>')
            out.append(f'<polyline points="{line}" fill="none" stroke="{line_colour}" stroke-width="{line_width}" stroke-dasharray="{dash}"/>')
    # The legend table: name, then each calc.
    ly = top + plot_h + 22
    lx = 8
    # What fits before the calc columns: about 6.5 px a character at 11 px.
    fits = max(int((width - lx - 18 - 86 * len(calcs)) / 6.5), 8)
    short = lambda name: name if len(name) <= fits else name[:fits - 1] + "…"
    out.append(f'<text x="{lx}" y="{ly + 10}" fill="{DIM}">Name</text>')
    for c, name in enumerate(calcs):
        out.append(f'<text x="{width - 12 - (len(calcs) - 1 - c) * 86}" y="{ly + 10}" text-anchor="end">{"Last *" if name == "lastNotNull" else name.capitalize()}</text>')
    for index, (name, points, _, props) in enumerate(drawn[:legend_rows]):
        row_y = ly + 18 * (index + 1) + 10
        swatch = colour(props.get("color", {}).get("fixedColor", PALETTE[index % len(PALETTE)]))
        out.append(f'<rect x="{lx}" y="{row_y - 6}" width="12" height="4" fill="{swatch}"/>')
        out.append(f'<text x="{lx + 18}" y="{row_y}" fill="{TEXT}">{html.escape(short(name))}</text>')
        for c, calc_name in enumerate(calcs):
            out.append(f'<text x="{width - 12 - (len(calcs) - 1 - c) * 86}" y="{row_y}" text-anchor="end" fill="{TEXT}">{html.escape(fmt_value(calc(calc_name, points), unit))}</text>')
    if len(drawn) > legend_rows:
        out.append(f'<text x="{lx}" y="{ly + 18 * (legend_rows + 1) + 8}">and {len(drawn) - legend_rows} more</text>')
    out.append("</svg>")
    return "".join(out)


def svg_stat(panel, series, box):
    """One tile per series: its last value on the threshold's colour, name below."""
    width, height = box
    defaults = panel.get("fieldConfig", {}).get("defaults", {})
    steps = defaults.get("thresholds", {}).get("steps", [])
    unit = defaults.get("unit", "short")
    out = [f'<svg width="{width}" height="{height}">']
    tile_w = width / max(len(series), 1)
    for i, (name, points) in enumerate(series):
        value = last(points)
        out.append(f'<rect x="{i * tile_w + 2:.1f}" y="2" width="{tile_w - 4:.1f}" height="{height - 4}" rx="3" fill="{threshold_colour(value, steps)}"/>')
        values = [v for _, v in points if not math.isnan(v)]
        if len(values) > 1:
            lo, hi = min(values), max(values)
            pts = " ".join(
                f"{i * tile_w + 2 + (tile_w - 4) * k / (len(values) - 1):.1f},{height - 4 - (v - lo) / max(hi - lo, 1e-9) * (height * 0.35):.1f}"
                for k, v in enumerate(values))
            out.append(f'<polyline points="{pts}" fill="none" stroke="#ffffff" stroke-opacity="0.35" stroke-width="1.5"/>')
        size = min(26, tile_w / 5)
        # What fits under the value: about 6 px a character at 10 px.
        fits = max(int((tile_w - 8) / 6), 4)
        name = name if len(name) <= fits else name[:fits - 1] + "…"
        out.append(f'<text x="{i * tile_w + tile_w / 2:.1f}" y="{height / 2:.1f}" text-anchor="middle" font-size="{size:.0f}" font-weight="600" fill="#fff">{html.escape(fmt_value(value, unit))}</text>')
        out.append(f'<text x="{i * tile_w + tile_w / 2:.1f}" y="{height / 2 + 16:.1f}" text-anchor="middle" font-size="10" fill="#fff">{html.escape(name)}</text>')
    out.append("</svg>")
    return "".join(out)


def svg_bargauge(panel, series, box):
    """Horizontal bars, largest first as the query sorts them, green to red by share of the max."""
    width, height = box
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
    out = [f'<svg width="{width}" height="{height}" font-size="11">']
    values = [last(points) or 0 for _, points in series]
    top = max(values + [1])
    bar_h = min(40, (height - 4) / max(len(series), 1) - 18)
    for i, (name, points) in enumerate(series):
        value = last(points) or 0
        share = value / top
        hue = 120 * (1 - share)
        y0 = 4 + i * (bar_h + 18)
        out.append(f'<text x="4" y="{y0 + 11}" fill="{TEXT}">{html.escape(name)}</text>')
        out.append(f'<rect x="4" y="{y0 + 15}" width="{width - 90}" height="{bar_h}" fill="{GRID}"/>')
        out.append(f'<rect x="4" y="{y0 + 15}" width="{(width - 90) * share:.1f}" height="{bar_h}" fill="hsl({hue:.0f},70%,50%)"/>')
        out.append(f'<text x="{width - 4}" y="{y0 + 15 + bar_h / 2 + 4}" text-anchor="end" fill="hsl({hue:.0f},70%,60%)" font-size="14">{html.escape(fmt_value(value, unit))}</text>')
    out.append("</svg>")
    return "".join(out)


def svg_state_timeline(panel, series, box, span):
    """One row per series, coloured by the panel's value mappings; a legend of the mappings."""
    width, height = box
    defaults = panel.get("fieldConfig", {}).get("defaults", {})
    mapping = {}
    for m in defaults.get("mappings", []):
        mapping.update(m.get("options", {}))
    steps = defaults.get("thresholds", {}).get("steps", [])
    left = min(200, width * 0.35)
    rows = max(len(series), 1)
    row_h = min(40, (height - 30) / rows)
    t0, t1 = span
    x = lambda t: left + (t - t0) / max(t1 - t0, 1e-9) * (width - left - 8)
    out = [f'<svg width="{width}" height="{height}" font-size="11">']
    for r, (name, points) in enumerate(series):
        y0 = 4 + r * row_h
        out.append(f'<text x="4" y="{y0 + row_h / 2 + 4:.1f}" fill="{TEXT}">{html.escape(name)}</text>')
        step = (points[1][0] - points[0][0]) if len(points) > 1 else 1
        for t, v in points:
            key = str(int(v)) if v == int(v) else str(v)
            fill = colour(mapping.get(key, {}).get("color") or threshold_colour(v, steps))
            out.append(f'<rect x="{x(t):.1f}" y="{y0:.1f}" width="{x(t + step) - x(t) + 0.6:.1f}" height="{row_h * 0.8:.1f}" fill="{fill}" fill-opacity="0.8"/>')
    lx = 4
    for key, m in sorted(mapping.items(), key=lambda kv: kv[1].get("index", 0)):
        out.append(f'<rect x="{lx}" y="{height - 14}" width="10" height="10" fill="{colour(m["color"])}"/>')
        out.append(f'<text x="{lx + 14}" y="{height - 5}" fill="{DIM}">{html.escape(m["text"])}</text>')
        lx += 24 + 7 * len(m["text"])
    out.append("</svg>")
    return "".join(out)


def panels_of(board):
    for panel in board.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def annotation_bands(board, prom, values, start, end, step):
    """Where each annotation query had a value: (start, end, colour) bands."""
    bands = []
    for annotation in board.get("annotations", {}).get("list", []):
        if annotation.get("datasource", {}).get("type") != "prometheus" or not annotation.get("enable"):
            continue
        promql = substitute(annotation["expr"], values)
        mark = colour(annotation.get("iconColor", "red"))
        for _, points in prom.range(promql, start, end, step):
            # Consecutive steps with a value are one region, as Grafana draws them.
            for t, _ in points:
                if bands and bands[-1][2] == mark and t - bands[-1][1] <= step * 0.01:
                    bands[-1] = (bands[-1][0], t + step, mark)
                else:
                    bands.append((t, t + step, mark))
    return bands


def shown_value(value):
    """A variable's value as Grafana's picker shows it: its All (the allValue `.*`) as All, a
    multi-value selection (`(a|b)`, Grafana's regex format) as its values."""
    if value == ".*":
        return "All"
    multi = re.fullmatch(r"\((.*\|.*)\)", value)
    return " + ".join(multi.group(1).split("|")) if multi else value


def render(args):
    with open(args.dashboard) as f:
        board = json.load(f)
    values = dict(v.split("=", 1) for v in args.var)
    values.setdefault("__rate_interval", "4s")
    prom = Prometheus(args.prometheus)
    span = (args.start, args.end)
    bands = annotation_bands(board, prom, values, args.start, args.end, args.step)
    unit_w = (args.width - 16 - GAP_PX * (COLUMNS - 1)) / COLUMNS
    bottom, cells = 0, []
    for panel in panels_of(board):
        grid = panel["gridPos"]
        left = 8 + grid["x"] * (unit_w + GAP_PX)
        top = HEADER_PX + grid["y"] * (ROW_PX + GAP_PX)
        width = grid["w"] * unit_w + (grid["w"] - 1) * GAP_PX
        height = grid["h"] * ROW_PX + (grid["h"] - 1) * GAP_PX
        bottom = max(bottom, top + height)
        title = html.escape(panel.get("title", ""))
        if panel["type"] == "row":
            cells.append(f'<div class="row" style="left:{left:.0f}px;top:{top:.0f}px;width:{width:.0f}px">⌄ {title}</div>')
            continue
        series = []
        for target in panel.get("targets", []):
            promql = substitute(target["expr"], values)
            if target.get("instant"):
                result = prom.instant(promql, args.end)
            else:
                result = prom.range(promql, args.start, args.end, args.step)
            series += [(legend(target.get("legendFormat"), m), p) for m, p in result]
        box = (int(width - 16), int(height - 34))
        if not series:
            body = '<div class="nodata">No data</div>'
        elif panel["type"] == "timeseries":
            body = svg_timeseries(panel, series, bands, box, span)
        elif panel["type"] == "stat":
            body = svg_stat(panel, series, box)
        elif panel["type"] == "bargauge":
            body = svg_bargauge(panel, series, box)
        elif panel["type"] == "state-timeline":
            body = svg_state_timeline(panel, series, box, span)
        else:
            sys.exit(f"{panel['title']}: no drawing for panel type {panel['type']}")
        cells.append(f'<div class="panel" style="left:{left:.0f}px;top:{top:.0f}px;width:{width:.0f}px;height:{height:.0f}px">'
                     f'<div class="title">{title}</div>{body}</div>')
    shown = " · ".join(f"{k}: <b>{html.escape(shown_value(v))}</b>"
                       for k, v in values.items() if not k.startswith("__"))
    page = f"""<!doctype html><meta charset="utf-8"><title>{html.escape(board['title'])}</title>
<style>
body {{ margin:0; background:{BACKGROUND}; color:{TEXT}; font:13px Inter, "DejaVu Sans", Helvetica, Arial, sans-serif; }}
.head {{ position:absolute; left:8px; top:8px; right:8px; }}
.head h1 {{ font-size:18px; font-weight:500; margin:0 0 6px 0; }}
.head .vars {{ color:{DIM}; }} .head .vars b {{ color:{TEXT}; font-weight:500; }}
.note {{ position:absolute; right:8px; top:8px; color:#FF9830; font-size:12px; text-align:right; }}
.panel {{ position:absolute; background:{PANEL}; border:1px solid #2a2d33; border-radius:2px; box-sizing:border-box; padding:4px 8px; overflow:hidden; }}
.title {{ font-weight:500; font-size:13px; height:24px; line-height:24px; white-space:nowrap; overflow:hidden; }}
.row {{ position:absolute; font-size:15px; font-weight:500; height:30px; line-height:30px; }}
.nodata {{ color:{DIM}; text-align:center; margin-top:30px; }}
</style>
<div class="head"><h1>{html.escape(board['title'])}</h1><div class="vars">{shown} · last {int(args.end - args.start)} s</div></div>
<div class="note">Drawn by docs/tools/render_dashboard.py from the dashboard's own queries, not by Grafana</div>
{''.join(cells)}
"""
    with open(args.html, "w") as f:
        f.write(page)
    return int(bottom + 8)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prometheus", required=True)
    parser.add_argument("--dashboard", default=os.path.join(REPO, "grafana", "dashboard.json"))
    parser.add_argument("--start", type=float, required=True)
    parser.add_argument("--end", type=float, required=True)
    parser.add_argument("--step", type=float, default=1.0)
    parser.add_argument("--var", action="append", default=[], help="NAME=VALUE")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--html", required=True)
    args = parser.parse_args()
    height = render(args)
    print(json.dumps({"html": args.html, "width": args.width, "height": height}))


if __name__ == "__main__":
    main()
