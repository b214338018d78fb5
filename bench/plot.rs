//! Draws a benchmark table as curves: one-way latency and bandwidth against message
//! size, both log-log, one line per system, two panels side by side, into an SVG.
//!
//! ```text
//! cargo bench --bench plot -- --csv target/peers/peers.csv --out bench/results/peers.svg
//! ```
//!
//! The input is the CSV that `bench/peers.sh` and `cargo bench --bench pingpong --
//! --csv FILE` write: a header line `system,label,size,latency_us,bw_GBps`, then one
//! line per system and size. Lines starting with `#` are comments; the first one is
//! the figure's caption (the scripts put the date and the rounds there, so a picture
//! says when it was measured). An empty or `-` value is no point: memcpy has no
//! latency, and a system without a kept round has neither. Labels carry no commas
//! (there is no quoting). `--out` defaults to the CSV's path with `.svg`.

use std::error::Error;
use std::path::PathBuf;

use plotters::coord::Shift;
use plotters::prelude::*;

/// One size of one system; a value is absent where the table has none.
struct Point {
    size: f64,
    latency_us: Option<f64>,
    bw_gbps: Option<f64>,
}

/// One line of the figure.
struct Series {
    system: String,
    label: String,
    /// Sorted by size.
    points: Vec<Point>,
}

/// The comment that becomes the caption, and the series in order of first appearance.
fn parse(text: &str) -> Result<(Option<String>, Vec<Series>), String> {
    let mut caption = None;
    let mut series: Vec<Series> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if let Some(c) = line.strip_prefix('#') {
            caption.get_or_insert_with(|| c.trim().to_string());
            continue;
        }
        if line.is_empty() || line.starts_with("system,") {
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        if f.len() != 5 {
            return Err(format!(
                "line {}: {} fields, expected system,label,size,latency_us,bw_GBps",
                n + 1,
                f.len()
            ));
        }
        let size: f64 = f[2]
            .parse()
            .map_err(|_| format!("line {}: size '{}' is not a number", n + 1, f[2]))?;
        let value = |s: &str| -> Result<Option<f64>, String> {
            match s {
                "" | "-" => Ok(None),
                _ => s
                    .parse::<f64>()
                    .map(Some)
                    .map_err(|_| format!("line {}: '{s}' is not a number", n + 1)),
            }
        };
        // A log axis has no place for zero or less.
        let positive = |v: Option<f64>| v.filter(|&v| v > 0.0);
        let point = Point {
            size,
            latency_us: positive(value(f[3])?),
            bw_gbps: positive(value(f[4])?),
        };
        match series.iter_mut().find(|s| s.system == f[0]) {
            Some(s) => s.points.push(point),
            None => series.push(Series {
                system: f[0].to_string(),
                label: f[1].to_string(),
                points: vec![point],
            }),
        }
    }
    for s in &mut series {
        s.points.sort_by(|a, b| a.size.total_cmp(&b.size));
    }
    Ok((caption, series))
}

/// 8 B, 4 KiB, 1 MiB.
fn bytes(v: f64) -> String {
    match v {
        v if v >= 1048576.0 => format!("{} MiB", v / 1048576.0),
        v if v >= 1024.0 => format!("{} KiB", v / 1024.0),
        v => format!("{v} B"),
    }
}

/// A tick value with as many decimals as it needs (0.01, 0.1, 1, 10).
fn number(v: f64) -> String {
    let decimals = (-v.log10().floor()).max(0.0) as usize;
    format!("{v:.decimals$}")
}

/// Distinguishable on white: Tableau 10, then black and a light orange (peers.sh
/// draws eleven systems).
const COLOURS: [RGBColor; 12] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(0, 0, 0),
    RGBColor(255, 187, 120),
];

/// One panel: `value` of every series against size, with a legend of the series it
/// has at `legend` (a corner the curves, all rising with size, leave free).
fn panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    what: &str,
    series: &[Series],
    value: fn(&Point) -> Option<f64>,
    legend: SeriesLabelPosition,
) -> Result<(), Box<dyn Error>> {
    let pts = || {
        series.iter().flat_map(|s| {
            s.points
                .iter()
                .filter_map(|p| value(p).map(|v| (p.size, v)))
        })
    };
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, 0f64, f64::MAX, 0f64);
    for (x, y) in pts() {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    if x1 == 0.0 {
        return Err(format!("no {what} values to draw").into());
    }
    let mut chart = ChartBuilder::on(area)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .caption(what, ("sans-serif", 18))
        // Sizes are powers of two: ticks at powers of 4 fall on the usual ones.
        .build_cartesian_2d(
            (x0 / 1.5..x1 * 1.5).log_scale().base(4.0),
            (y0 / 1.5..y1 * 1.5).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_labels(12)
        // Only the labelled lines: the log axes' minor lines crowd a small figure.
        .light_line_style(WHITE)
        .x_desc("message size")
        .y_desc(what)
        .x_label_formatter(&|v| bytes(*v))
        .y_label_formatter(&|v| number(*v))
        .draw()?;
    for (i, s) in series.iter().enumerate() {
        let line: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter_map(|p| value(p).map(|v| (p.size, v)))
            .collect();
        if line.is_empty() {
            continue;
        }
        let colour = COLOURS[i % COLOURS.len()];
        // Ours drawn heavier: the figure is about where it stands among the others.
        let width = if s.system.starts_with("rdma-channel") {
            4
        } else {
            2
        };
        chart
            .draw_series(LineSeries::new(line, colour.stroke_width(width)).point_size(3))?
            .label(s.label.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(width))
            });
    }
    chart
        .configure_series_labels()
        .position(legend)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()?;
    Ok(())
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.windows(2).find(|w| w[0] == name).map(|w| w[1].clone())
}

fn main() -> Result<(), Box<dyn Error>> {
    // cargo bench passes --bench; only --csv and --out matter.
    let csv = PathBuf::from(arg("--csv").ok_or("usage: plot --csv FILE [--out FILE.svg]")?);
    let out = arg("--out")
        .map(PathBuf::from)
        .unwrap_or_else(|| csv.with_extension("svg"));
    let text = std::fs::read_to_string(&csv).map_err(|e| format!("{}: {e}", csv.display()))?;
    let (caption, series) = parse(&text).map_err(|e| format!("{}: {e}", csv.display()))?;
    if series.is_empty() {
        return Err(format!("{}: no rows", csv.display()).into());
    }
    let root = SVGBackend::new(&out, (1400, 620)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = match &caption {
        Some(c) => root.titled(c, ("sans-serif", 16))?,
        None => root,
    };
    let (left, right) = root.split_horizontally(700);
    let (latency, bandwidth) = ("one-way latency (us)", "bandwidth (GB/s, 64 in flight)");
    use SeriesLabelPosition::{LowerRight, UpperLeft};
    panel(&left, latency, &series, |p| p.latency_us, UpperLeft)?;
    panel(&right, bandwidth, &series, |p| p.bw_gbps, LowerRight)?;
    root.present()?;
    println!("{}", out.display());
    Ok(())
}
