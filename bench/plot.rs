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
//!
//! With `--scale`, the CSV is `bench/scale.sh --csv FILE`'s instead (header
//! `system,label,ranks,pattern,pss_mib,a2a_s,lat_alone_us,lat_peers_us`), drawn as
//! seed 003's figures 3-6 are: against the number of ranks on the host, the memory
//! per process of hello world and of all-to-all, the all-to-all time, and the
//! zero-byte latency of one pair with every other rank connected and idle, relative
//! to the same pair alone.

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

/// The lines of one of the CSVs: the first `#` comment (the caption), and each data
/// line's number (from 1) and its fields, which must be `header`'s many; the header
/// line and empty lines are skipped.
type Records<'a> = (Option<String>, Vec<(usize, Vec<&'a str>)>);

fn records<'a>(text: &'a str, header: &str) -> Result<Records<'a>, String> {
    let want = header.split(',').count();
    let mut caption = None;
    let mut out = Vec::new();
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
        if f.len() != want {
            return Err(format!(
                "line {}: {} fields, expected {header}",
                n + 1,
                f.len()
            ));
        }
        out.push((n + 1, f));
    }
    Ok((caption, out))
}

/// A value field of line `n`: none where it is empty or `-`, and none where it is
/// zero or less (a log axis has no place for it).
fn positive(s: &str, n: usize) -> Result<Option<f64>, String> {
    match s {
        "" | "-" => Ok(None),
        _ => s
            .parse::<f64>()
            .map(|v| Some(v).filter(|&v| v > 0.0))
            .map_err(|_| format!("line {n}: '{s}' is not a number")),
    }
}

/// The comment that becomes the caption, and the series in order of first appearance.
fn parse(text: &str) -> Result<(Option<String>, Vec<Series>), String> {
    let (caption, lines) = records(text, "system,label,size,latency_us,bw_GBps")?;
    let mut series: Vec<Series> = Vec::new();
    for (n, f) in lines {
        let size: f64 = f[2]
            .parse()
            .map_err(|_| format!("line {n}: size '{}' is not a number", f[2]))?;
        let point = Point {
            size,
            latency_us: positive(f[3], n)?,
            bw_gbps: positive(f[4], n)?,
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
    if v <= 0.0 {
        return "0".to_string();
    }
    // A linear axis has ticks like 0.2: one decimal for them, at most six.
    let decimals = (-v.log10().floor()).clamp(0.0, 6.0) as usize;
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

/// One row of `bench/scale.sh`'s CSV.
struct ScaleRow {
    system: String,
    label: String,
    ranks: f64,
    pattern: String,
    pss_mib: Option<f64>,
    a2a_s: Option<f64>,
    lat_ratio: Option<f64>,
}

fn parse_scale(text: &str) -> Result<(Option<String>, Vec<ScaleRow>), String> {
    let (caption, lines) = records(
        text,
        "system,label,ranks,pattern,pss_mib,a2a_s,lat_alone_us,lat_peers_us",
    )?;
    let mut rows = Vec::new();
    for (n, f) in lines {
        let ranks = positive(f[2], n)?.ok_or(format!("line {n}: no rank count"))?;
        let (alone, peers) = (positive(f[6], n)?, positive(f[7], n)?);
        rows.push(ScaleRow {
            system: f[0].to_string(),
            label: f[1].to_string(),
            ranks,
            pattern: f[3].to_string(),
            pss_mib: positive(f[4], n)?,
            a2a_s: positive(f[5], n)?,
            lat_ratio: alone.zip(peers).map(|(a, p)| p / a),
        });
    }
    Ok((caption, rows))
}

/// One panel of the scale figure: for `pattern`'s rows, `value` against the rank
/// count, a line per system, on a log-log plot (`log_y`) or a linear y axis.
fn scale_panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    what: &str,
    rows: &[ScaleRow],
    pattern: &str,
    value: fn(&ScaleRow) -> Option<f64>,
    log_y: bool,
) -> Result<(), Box<dyn Error>> {
    let mut systems: Vec<(&str, &str)> = Vec::new();
    for r in rows {
        if !systems.iter().any(|(s, _)| *s == r.system) {
            systems.push((&r.system, &r.label));
        }
    }
    let line = |system: &str| -> Vec<(f64, f64)> {
        let mut l: Vec<(f64, f64)> = rows
            .iter()
            .filter(|r| r.system == system && r.pattern == pattern)
            .filter_map(|r| value(r).map(|v| (r.ranks, v)))
            .collect();
        l.sort_by(|a, b| a.0.total_cmp(&b.0));
        l
    };
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, 0f64, f64::MAX, 0f64);
    for (x, y) in systems.iter().flat_map(|(s, _)| line(s)) {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    if x1 == 0.0 {
        return Err(format!("no {what} values to draw").into());
    }
    let mut builder = ChartBuilder::on(area);
    builder
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .caption(what, ("sans-serif", 18));
    let x = (x0 / 1.3..x1 * 1.3).log_scale().base(2.0);
    // Two sets of calls: a log and a linear y axis are different chart types.
    macro_rules! draw {
        ($chart:expr, $y_label:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .light_line_style(WHITE)
                .x_desc("ranks on the host")
                .y_desc(what)
                .x_label_formatter(&|v| format!("{v:.0}"))
                .y_label_formatter($y_label)
                .draw()?;
            for (i, (system, label)) in systems.iter().enumerate() {
                let points = line(system);
                if points.is_empty() {
                    continue;
                }
                let colour = COLOURS[i % COLOURS.len()];
                let width = if system.starts_with("rch") && !system.contains('(') {
                    4
                } else {
                    2
                };
                chart
                    .draw_series(LineSeries::new(points, colour.stroke_width(width)).point_size(3))?
                    .label(*label)
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(width))
                    });
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .label_font(("sans-serif", 13))
                .draw()?;
        }};
    }
    if log_y {
        draw!(
            builder.build_cartesian_2d(x, (y0 / 1.5..y1 * 1.5).log_scale())?,
            &|v: &f64| number(*v)
        );
    } else {
        draw!(
            builder.build_cartesian_2d(x, 0.0..(y1 * 1.2).max(1.2))?,
            &|v: &f64| format!("{v:.1}")
        );
    }
    Ok(())
}

/// The `--scale` figure: four panels, 2 x 2.
fn draw_scale(text: &str, out: &std::path::Path) -> Result<(), Box<dyn Error>> {
    let (caption, rows) = parse_scale(text)?;
    if rows.is_empty() {
        return Err("no rows".into());
    }
    let root = SVGBackend::new(out, (1400, 1100)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = match &caption {
        Some(c) => root.titled(c, ("sans-serif", 16))?,
        None => root,
    };
    let panels = root.split_evenly((2, 2));
    scale_panel(
        &panels[0],
        "PSS per rank, hello world (MiB)",
        &rows,
        "hello",
        |r| r.pss_mib,
        true,
    )?;
    scale_panel(
        &panels[1],
        "PSS per rank, all-to-all (MiB)",
        &rows,
        "alltoall",
        |r| r.pss_mib,
        true,
    )?;
    scale_panel(
        &panels[2],
        "all-to-all time (s)",
        &rows,
        "alltoall",
        |r| r.a2a_s,
        true,
    )?;
    scale_panel(
        &panels[3],
        "0 B latency, idle peers connected / alone",
        &rows,
        "idle",
        |r| r.lat_ratio,
        false,
    )?;
    root.present()?;
    Ok(())
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.windows(2).find(|w| w[0] == name).map(|w| w[1].clone())
}

fn main() -> Result<(), Box<dyn Error>> {
    // cargo bench passes --bench; only --csv and --out matter.
    let csv =
        PathBuf::from(arg("--csv").ok_or("usage: plot [--scale] --csv FILE [--out FILE.svg]")?);
    let out = arg("--out")
        .map(PathBuf::from)
        .unwrap_or_else(|| csv.with_extension("svg"));
    let text = std::fs::read_to_string(&csv).map_err(|e| format!("{}: {e}", csv.display()))?;
    if std::env::args().any(|a| a == "--scale") {
        draw_scale(&text, &out).map_err(|e| format!("{}: {e}", csv.display()))?;
        println!("{}", out.display());
        return Ok(());
    }
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
