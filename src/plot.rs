//! Dependency-free SVG line charts (memory over a trace, and the like); `gpumem::safe_fs` writes
//! them.

use std::fmt::Write as _;

/// One line on a chart. `color` is any SVG colour (`#1f77b4`, `teal`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Series<'a> {
    pub label: &'a str,
    pub color: &'a str,
    pub points: &'a [(f64, f64)],
}

const WIDTH: f64 = 900.0;
const HEIGHT: f64 = 420.0;
/// Plot area, inside the margins that hold the title, legend, ticks and axis labels.
const LEFT: f64 = 84.0;
const RIGHT: f64 = WIDTH - 24.0;
const TOP: f64 = 62.0;
const BOTTOM: f64 = HEIGHT - 56.0;
const TARGET_TICKS: usize = 5;
/// Points kept per series; each bucket keeps its minimum and maximum so peaks survive.
const MAX_POINTS: usize = 1500;
const FONT: &str = "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif";

/// Renders a line chart as a standalone SVG document (900x420 viewBox). Y tick labels are
/// byte sizes ("512 MiB") when `y_label` mentions "bytes". Non-finite points are skipped;
/// empty input gives empty axes, never `NaN` coordinates.
pub(crate) fn line_chart_svg(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
) -> String {
    let reduced: Vec<Vec<(f64, f64)>> = series
        .iter()
        .map(|s| downsample(s.points, MAX_POINTS))
        .collect();
    let all = || reduced.iter().flatten();
    let x_range = data_range(all().map(|p| p.0));
    // Memory charts read honestly from zero: the y axis includes it.
    let y_range = data_range(all().map(|p| p.1).chain([0.0]));
    let bytes = y_label.to_ascii_lowercase().contains("bytes");
    let x_axis = Axis::tight(x_range);
    let y_axis = if bytes {
        Axis::loose(y_range, byte_step(y_range.1 - y_range.0))
    } else {
        Axis::loose(y_range, nice_step(y_range.1 - y_range.0))
    };

    let sx = |x: f64| LEFT + (x - x_axis.min) / (x_axis.max - x_axis.min) * (RIGHT - LEFT);
    let sy = |y: f64| BOTTOM - (y - y_axis.min) / (y_axis.max - y_axis.min) * (BOTTOM - TOP);

    let mut svg =
        String::with_capacity(16 * 1024 + 24 * reduced.iter().map(Vec::len).sum::<usize>());
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" font-family="{FONT}" role="img">"#
    );
    let _ = write!(svg, "\n<title>{}</title>", escape(title));
    let _ = write!(
        svg,
        "\n<rect width=\"{WIDTH}\" height=\"{HEIGHT}\" fill=\"#ffffff\"/>"
    );
    let _ = write!(
        svg,
        "\n<defs><clipPath id=\"plot-area\"><rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{}\" height=\"{}\"/></clipPath></defs>",
        RIGHT - LEFT,
        BOTTOM - TOP
    );
    let _ = write!(
        svg,
        "\n<text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"17\" font-weight=\"600\" fill=\"#222\">{}</text>",
        WIDTH / 2.0,
        escape(title)
    );

    // Grid lines and tick labels.
    for &y in &y_axis.ticks {
        let py = sy(y);
        let label = if bytes {
            format_bytes(y)
        } else {
            format_number(y, y_axis.step)
        };
        let _ = write!(
            svg,
            "\n<line x1=\"{LEFT}\" y1=\"{py:.1}\" x2=\"{RIGHT}\" y2=\"{py:.1}\" stroke=\"#e3e3e3\"/>\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\" font-size=\"12\" fill=\"#444\">{}</text>",
            LEFT - 8.0,
            py + 4.0,
            escape(&label)
        );
    }
    for &x in &x_axis.ticks {
        let px = sx(x);
        let _ = write!(
            svg,
            "\n<line x1=\"{px:.1}\" y1=\"{BOTTOM}\" x2=\"{px:.1}\" y2=\"{}\" stroke=\"#888\"/>\
             <text x=\"{px:.1}\" y=\"{}\" text-anchor=\"middle\" font-size=\"12\" fill=\"#444\">{}</text>",
            BOTTOM + 5.0,
            BOTTOM + 20.0,
            escape(&format_number(x, x_axis.step))
        );
    }
    let _ = write!(
        svg,
        "\n<polyline points=\"{LEFT},{TOP} {LEFT},{BOTTOM} {RIGHT},{BOTTOM}\" fill=\"none\" stroke=\"#888\"/>"
    );
    let _ = write!(
        svg,
        "\n<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"13\" fill=\"#222\">{}</text>",
        (LEFT + RIGHT) / 2.0,
        HEIGHT - 12.0,
        escape(x_label)
    );
    let _ = write!(
        svg,
        "\n<text transform=\"translate(18 {:.1}) rotate(-90)\" text-anchor=\"middle\" font-size=\"13\" fill=\"#222\">{}</text>",
        (TOP + BOTTOM) / 2.0,
        escape(y_label)
    );

    // The data.
    for (s, points) in series.iter().zip(&reduced) {
        let color = escape(s.color);
        match points.as_slice() {
            [] => {}
            [(x, y)] => {
                let _ = write!(
                    svg,
                    "\n<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{color}\"/>",
                    sx(*x),
                    sy(*y)
                );
            }
            many => {
                let _ = write!(
                    svg,
                    "\n<polyline clip-path=\"url(#plot-area)\" fill=\"none\" stroke=\"{color}\" stroke-width=\"1.6\" stroke-linejoin=\"round\" points=\""
                );
                for (i, (x, y)) in many.iter().enumerate() {
                    let sep = if i == 0 { "" } else { " " };
                    let _ = write!(svg, "{sep}{:.1},{:.1}", sx(*x), sy(*y));
                }
                svg.push_str("\"/>");
            }
        }
    }

    // Legend: one row between the title and the plot, right-aligned by estimated text width.
    let entry_width = |label: &str| 28.0 + 7.0 * label.chars().count() as f64 + 18.0;
    let total: f64 = series.iter().map(|s| entry_width(s.label)).sum();
    let mut x = (RIGHT - total).max(LEFT);
    for s in series {
        let _ = write!(
            svg,
            "\n<line x1=\"{x:.1}\" y1=\"44\" x2=\"{:.1}\" y2=\"44\" stroke=\"{}\" stroke-width=\"3\"/>\
             <text x=\"{:.1}\" y=\"48\" font-size=\"12\" fill=\"#222\">{}</text>",
            x + 22.0,
            escape(s.color),
            x + 28.0,
            escape(s.label)
        );
        x += entry_width(s.label);
    }
    svg.push_str("\n</svg>\n");
    svg
}

/// An axis: its range and the tick values inside it.
struct Axis {
    min: f64,
    max: f64,
    step: f64,
    ticks: Vec<f64>,
}

impl Axis {
    /// Range widened outward to whole steps (for y: the top grid line clears the peak).
    fn loose((lo, hi): (f64, f64), step: f64) -> Axis {
        let min = (lo / step).floor() * step;
        let max = (hi / step).ceil() * step;
        Axis::new(min, max, step)
    }

    /// Range exactly the data's (for x: no empty margin), ticks at whole steps inside it.
    fn tight((lo, hi): (f64, f64)) -> Axis {
        Axis::new(lo, hi, nice_step(hi - lo))
    }

    fn new(min: f64, max: f64, step: f64) -> Axis {
        let first = (min / step - 1e-9).ceil() as i64;
        let last = (max / step + 1e-9).floor() as i64;
        let ticks = (first..=last).map(|i| i as f64 * step).collect();
        Axis {
            min,
            max,
            step,
            ticks,
        }
    }
}

/// The finite range of `values`, widened when empty or a single value, so it always has
/// positive width.
fn data_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if lo > hi {
        return (0.0, 1.0);
    }
    if hi - lo > hi.abs().max(lo.abs()) * 1e-12 {
        return (lo, hi);
    }
    let pad = if lo == 0.0 { 1.0 } else { lo.abs() * 0.5 };
    (lo - pad, hi + pad)
}

/// A step of 1, 2 or 5 times a power of ten giving about `TARGET_TICKS` ticks over `span`.
fn nice_step(span: f64) -> f64 {
    let raw = span / TARGET_TICKS as f64;
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let magnitude = 10f64.powf(raw.log10().floor());
    let fraction = raw / magnitude;
    let nice = match fraction {
        f if f < 1.5 => 1.0,
        f if f < 3.5 => 2.0,
        f if f < 7.5 => 5.0,
        _ => 10.0,
    };
    nice * magnitude
}

/// A power-of-two step (128 MiB, 512 MiB, 1 GiB) giving about `TARGET_TICKS` ticks over
/// `span` bytes, so byte labels come out round ("1.5 GiB", not "476.84 MiB").
fn byte_step(span: f64) -> f64 {
    let raw = span / TARGET_TICKS as f64;
    if !(raw.is_finite() && raw > 1.0) {
        return 1.0;
    }
    2f64.powf(raw.log2().round())
}

/// A plain number for a tick, with as many decimals as the step needs; large values get
/// a k/M/G suffix ("250k", "1.5M").
fn format_number(value: f64, step: f64) -> String {
    if value == 0.0 {
        return "0".to_string();
    }
    let (scale, suffix) = match value.abs().max(step.abs()) {
        m if m >= 1e9 => (1e9, "G"),
        m if m >= 1e6 => (1e6, "M"),
        m if m >= 1e4 => (1e3, "k"),
        _ => (1.0, ""),
    };
    let decimals = (-(step / scale).log10().floor()).clamp(0.0, 6.0) as usize;
    let text = format!("{:.*}", decimals, value / scale);
    let text = if text
        .trim_start_matches('-')
        .chars()
        .all(|c| c == '0' || c == '.')
    {
        "0".to_string() // no "-0" or "0.00"
    } else {
        text
    };
    format!("{text}{suffix}")
}

/// A byte count in the largest binary unit that keeps it at least 1: "512 MiB", "1.5 GiB".
fn format_bytes(value: f64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut scaled = value;
    let mut unit = 0;
    while scaled.abs() >= 1024.0 && unit + 1 < UNITS.len() {
        scaled /= 1024.0;
        unit += 1;
    }
    let text = format!("{scaled:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    let text = if text == "-0" { "0" } else { text };
    format!("{text} {}", UNITS[unit])
}

/// Keeps at most about `max_points` points: the first, the last, and per bucket of
/// consecutive points the lowest and highest, in their original order.
fn downsample(points: &[(f64, f64)], max_points: usize) -> Vec<(f64, f64)> {
    let finite: Vec<(f64, f64)> = points
        .iter()
        .copied()
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .collect();
    if finite.len() <= max_points {
        return finite;
    }
    let buckets = (max_points.saturating_sub(2) / 2).max(1);
    let bucket_len = finite.len().div_ceil(buckets);
    let mut kept = Vec::with_capacity(max_points);
    if let Some(first) = finite.first() {
        kept.push(*first);
    }
    for chunk in finite.chunks(bucket_len) {
        let mut low = 0;
        let mut high = 0;
        for (i, p) in chunk.iter().enumerate() {
            if p.1 < chunk[low].1 {
                low = i;
            }
            if p.1 > chunk[high].1 {
                high = i;
            }
        }
        let (a, b) = (low.min(high), low.max(high));
        kept.push(chunk[a]);
        if b != a {
            kept.push(chunk[b]);
        }
    }
    if let Some(last) = finite.last() {
        kept.push(*last);
    }
    kept
}

/// Escapes text for XML content and attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart(points: &[(f64, f64)]) -> String {
        line_chart_svg(
            "t",
            "event",
            "requested bytes",
            &[Series {
                label: "a",
                color: "#1f77b4",
                points,
            }],
        )
    }

    fn assert_clean(svg: &str) {
        assert!(!svg.contains("NaN"), "NaN in {svg}");
        assert!(!svg.contains("inf"), "inf in {svg}");
        assert!(svg.starts_with("<svg ") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("viewBox=\"0 0 900 420\""));
    }

    #[test]
    fn degenerate_inputs_draw_without_nan() {
        assert_clean(&line_chart_svg("empty", "x", "y", &[]));
        assert_clean(&chart(&[]));
        assert_clean(&chart(&[(3.0, 7.0)]));
        assert_clean(&chart(&[(0.0, 0.0)]));
        assert_clean(&chart(&[(0.0, 0.0), (1.0, 0.0), (2.0, 0.0)]));
        assert_clean(&chart(&[(5.0, 1.0), (5.0, 2.0)]));
        assert_clean(&chart(&[(f64::NAN, 1.0), (1.0, f64::INFINITY), (2.0, 3.0)]));
        assert!(
            chart(&[(3.0, 7.0)]).contains("<circle"),
            "a lone point is still drawn"
        );
    }

    #[test]
    fn nice_ticks_and_byte_labels() {
        let gib = 1024.0 * 1024.0 * 1024.0;
        let svg = chart(&[(0.0, 0.0), (281_928.0, 574_953_984.0)]);
        for label in [
            ">0 B<",
            ">128 MiB<",
            ">512 MiB<",
            ">640 MiB<",
            ">0<",
            ">50k<",
            ">250k<",
        ] {
            assert!(svg.contains(label), "{label} missing from {svg}");
        }
        let axis = Axis::loose((0.0, 3.15 * gib), byte_step(3.15 * gib));
        let labels: Vec<String> = axis.ticks.iter().map(|&t| format_bytes(t)).collect();
        assert_eq!(
            labels,
            ["0 B", "512 MiB", "1 GiB", "1.5 GiB", "2 GiB", "2.5 GiB", "3 GiB", "3.5 GiB"]
        );
        assert_eq!(format_bytes(0.5 * gib), "512 MiB");
        assert_eq!(format_bytes(1.5 * gib), "1.5 GiB");
        assert_eq!(format_bytes(0.0), "0 B");
        assert_eq!(format_number(1_500_000.0, 500_000.0), "1.5M");
        assert_eq!(format_number(0.25, 0.05), "0.25");
        assert_eq!(format_number(-0.0, 1.0), "0");
        let plain = line_chart_svg(
            "t",
            "x",
            "ratio",
            &[Series {
                label: "r",
                color: "red",
                points: &[(0.0, 1.0), (1.0, 1.2)],
            }],
        );
        assert!(!plain.contains("MiB") && !plain.contains(" B<"), "{plain}");
    }

    #[test]
    fn downsampling_keeps_the_peak() {
        let mut points: Vec<(f64, f64)> =
            (0..200_000).map(|i| (i as f64, (i % 100) as f64)).collect();
        points[123_457].1 = 1e6;
        points[77].1 = -5.0;
        let kept = downsample(&points, MAX_POINTS);
        assert!(kept.len() <= MAX_POINTS + 2, "{} points", kept.len());
        assert!(kept.contains(&(123_457.0, 1e6)));
        assert!(kept.contains(&(77.0, -5.0)));
        assert!(kept.windows(2).all(|w| w[0].0 <= w[1].0), "order kept");
        let svg = chart(&points);
        assert!(svg.len() < 200_000, "{} bytes of SVG", svg.len());
        // The peak's y coordinate is the top of the data: the plot's smallest y value.
        let polyline = svg.split("points=\"").last().unwrap_or_default();
        let min_y = polyline
            .split(['"', ' '])
            .filter_map(|p| p.split_once(',').and_then(|(_, y)| y.parse::<f64>().ok()))
            .fold(f64::INFINITY, f64::min);
        assert!(
            min_y < TOP + 0.2 * (BOTTOM - TOP),
            "peak drawn at y={min_y}"
        );
    }

    #[test]
    fn escapes_text() {
        let svg = line_chart_svg(
            "a < b & \"c\"",
            "x's",
            "<y>",
            &[Series {
                label: "l&l",
                color: "\"red",
                points: &[(0.0, 1.0), (1.0, 2.0)],
            }],
        );
        assert!(svg.contains("a &lt; b &amp; &quot;c&quot;"));
        assert!(svg.contains("x&apos;s") && svg.contains("&lt;y&gt;") && svg.contains("l&amp;l"));
        assert!(svg.contains("&quot;red"));
        assert!(!svg.contains("a < b"));
    }
}
