"""The Markdown tables of one frontier.sh run: every trace beside the driver pool at the default
and at its named setting, cold misses by size, and PyTorch end to end, each with its verdict
against the allocator issue's targets.

usage: python3 frontier_report.py OUT_DIR > tables.md   (OUT_DIR: what frontier.sh wrote, or
its results.tgz unpacked)
"""
import json
import os
import statistics
import subprocess
import sys

from byte_sizes import size_name

HERE = os.path.dirname(os.path.abspath(__file__))
BOUND = 1.03


def fail(message):
    print(f"frontier_report.py: {message}", file=sys.stderr)
    sys.exit(2)


def records(out, name):
    """The JSON lines of one result file; a missing file is an empty step (the run's budget ran out)."""
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return []
    rows = []
    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if line.strip():
                    try:
                        row = json.loads(line)
                    except ValueError:
                        row = None
                    if not isinstance(row, dict):
                        fail(f"{path}, line {number}: not a JSON object; is this a frontier.sh result directory?")
                    rows.append(row)
    except (OSError, UnicodeDecodeError) as why:
        fail(f"cannot read {path}: {why}")
    return rows


def pairs(rows):
    """{trace: (gpumem, pool)} from `replay --against-driver-pool --json` lines."""
    by_trace = {}
    for r in rows:
        slot = 1 if r.get("strategy") == "driver-pool" else 0
        by_trace.setdefault(r["trace"], [None, None])[slot] = r
    return {t: tuple(p) for t, p in by_trace.items() if None not in p}


def wins_both(ours, pool):
    return ours["reserved_over_peak"] <= pool["reserved_over_peak"] and ours["ns_per_op"] <= pool["ns_per_op"]


def cell(ours, pool):
    text = f"{ours['reserved_over_peak']:.4f} · {ours['ns_per_op']:,.0f} · {ours['ns_per_op'] / pool['ns_per_op']:.2f}×"
    return f"**{text}**" if wins_both(ours, pool) else text


def traces_table(out):
    default, placed, swept = (pairs(records(out, n)) for n in ("default.jsonl", "placed.jsonl", "own.jsonl"))
    if not default:
        return "No trace replays in this run.\n"
    lines = [
        "| trace | default: reserved/peak · ns/op · × pool | named setting | named: reserved/peak · ns/op · × pool "
        "| placed, 32 MiB (every trace) | pool reserved/peak | pool ns/op (default's round) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    over, under_pool_memory, default_both, named_both, placed_both, missing = [], 0, 0, 0, 0, []
    for trace in sorted(default):
        ours, pool = default[trace]
        under_pool_memory += ours["reserved_over_peak"] <= pool["reserved_over_peak"]
        if ours["reserved_over_peak"] > BOUND:
            over.append(f"{trace} {ours['reserved_over_peak']:.4f}")
        placed_cell = cell(*placed[trace]) if trace in placed else "not run"
        placed_both += trace in placed and wins_both(*placed[trace])
        if wins_both(ours, pool):
            # The default itself is the named setting where it already wins both axes.
            default_both += 1
            named_both += 1
            named, named_cell = "the default", "(as the default)"
        else:
            named, source = ("the sweep's", swept) if trace in swept else ("placed, 32 MiB", placed)
            if trace in source:
                named_both += wins_both(*source[trace])
                named_cell = cell(*source[trace])
            else:
                missing.append(trace)
                named_cell = "not run"
        lines.append(f"| {trace} | {cell(ours, pool)} | {named} | {named_cell} | {placed_cell} "
                     f"| {pool['reserved_over_peak']:.4f} | {pool['ns_per_op']:,.0f} |")
    count = len(default)
    lines += [
        "",
        f"- At the default: at or under the pool's memory on {under_pool_memory} of {count}; at or under it on "
        f"both axes on {default_both}; over {BOUND}: {', '.join(over) or 'none'}.",
        f"- At the named setting (the default where it wins both axes): at or under the pool on both axes on "
        f"{named_both} of {count}." + (f" Not run: {', '.join(missing)}." if missing else ""),
        f"- Placed on mapped pages with 32 MiB chunks, one setting for every trace: at or under the pool on both "
        f"axes on {placed_both} of {count}.",
    ]
    for trace in ("cnn_serve_large", "gpt2_train_large"):
        if trace in default:
            ours, pool = default[trace]
            runs = lambda r: ", ".join(f"{v:,.0f}" for v in r.get("ns_per_op_runs", []))
            lines.append(f"- {trace} at the default: {ours['ns_per_op']:,.0f} ns/op against the pool's "
                         f"{pool['ns_per_op']:,.0f} ({ours['ns_per_op'] / pool['ns_per_op']:.2f}×; rounds "
                         f"{runs(ours)} against {runs(pool)}).")
    return "\n".join(lines) + "\n"


def micros(ns):
    return f"{ns / 1000:,.1f} µs" if ns < 1_000_000 else f"{ns / 1e6:.2f} ms"


def misses_table(out):
    runs = [records(out, f"cold{i}.jsonl") for i in (1, 2)]
    if not any(runs):
        return "No cold-miss runs in this run.\n"
    by_size = {}
    for run in runs:
        for r in run:
            by_size.setdefault(r["size_bytes"], {}).setdefault(r["allocator"], []).append(r["median_ns"])
    lines = ["| size | gpumem, cold miss (each run) | driver pool's own miss (each run) | ratio of the medians |",
             "| --- | --- | --- | --- |"]
    for size in sorted(by_size):
        ours = by_size[size].get("pool-miss-cold", [])
        pool = by_size[size].get("driver-async-miss", [])
        ratio = f"{statistics.median(ours) / statistics.median(pool):.2f}×" if ours and pool else "-"
        lines.append(f"| {size_name(size)} | {', '.join(map(micros, ours))} | {', '.join(map(micros, pool))} | {ratio} |")
    return "\n".join(lines) + "\n"


def torch_tables(out):
    results = os.path.join(out, "torch", "results.jsonl")
    if not os.path.exists(results):
        return "No PyTorch runs in this run.\n"
    shown = subprocess.run([sys.executable, os.path.join(HERE, "torch_workloads.py"), "--table", results],
                           capture_output=True, text=True)
    if shown.returncode != 0:
        fail(f"torch_workloads.py --table {results}: {shown.stderr.strip()}")
    return shown.stdout


def device_line(out):
    path = os.path.join(out, "device.txt")
    if not os.path.exists(path):
        return "unknown"
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError) as why:
        fail(f"cannot read {path}: {why}")


def main():
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        sys.exit(0 if len(sys.argv) == 2 else 2)
    out = sys.argv[1]
    if not os.path.isdir(out):
        fail(f"{out} is not a directory (give the OUT_DIR of frontier.sh)")
    # Every file is read before anything is printed, so a bad one leaves no half-written report.
    try:
        sections = [
            f"Device: {device_line(out)}\n",
            "### Every trace beside the driver pool (medians of 3 alternated rounds; bold: at or under the "
            "pool on both axes)\n",
            traces_table(out),
            "### Cold misses by size (`gpumem bench`, medians)\n",
            misses_table(out),
            "### PyTorch end to end\n",
            torch_tables(out),
        ]
    except (KeyError, TypeError, ZeroDivisionError) as why:
        fail(f"{out} holds a result without the fields replay and bench write ({why!r}); "
             "is it a frontier.sh result directory?")
    print("\n".join(sections))


if __name__ == "__main__":
    main()
