//! `perf_plot`: draws time and bus bandwidth against message size from benchmark results, as
//! one SVG with two panels (time in us, log scale; bus bandwidth in GB/s), one line per input.
//!
//! Inputs: `coll_perf --json FILE` results, or the text output of nccl-tests (NCCL's
//! `all_reduce_perf` & co.) or of `coll_perf` itself. The out-of-place columns are drawn.

use std::path::Path;

use plotters::prelude::*;

const USAGE: &str = "perf_plot --out FILE.svg [--title TEXT] [--in-place] [LABEL=]RESULT...
  RESULT        a coll_perf --json file (.json), or nccl-tests / coll_perf text output
  LABEL=        the line's name in the legend (default: the file name without its extension)
  --in-place    draw the in-place columns instead of the out-of-place ones
  --title TEXT  the picture's title (default: the collective and rank count of the first input)
Draws time (us, log scale) and bus bandwidth (GB/s) against message size (bytes, log scale).
Exit status 2 on bad arguments or unreadable input.";

/// One measured size of one input.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Point {
    bytes: f64,
    time_us: f64,
    busbw: f64,
}

/// One input: its legend label, what it measured (for the default title) and its points.
#[derive(Debug)]
struct Series {
    label: String,
    what: String,
    points: Vec<Point>,
}

/// The command line.
#[derive(Debug)]
struct Opts {
    out: String,
    title: Option<String>,
    in_place: bool,
    inputs: Vec<(Option<String>, String)>,
}

fn parse_args(args: &[String]) -> Result<Opts, String> {
    let (mut out, mut title, mut in_place, mut inputs) = (None, None, false, Vec::new());
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |flag: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag}: expected a value"))
        };
        match a.as_str() {
            "--out" | "-o" => out = Some(value(a)?),
            "--title" => title = Some(value(a)?),
            "--in-place" => in_place = true,
            "-h" | "--help" => return Err(String::new()),
            s if s.starts_with('-') => return Err(format!("unknown option `{s}`")),
            s => inputs.push(match s.split_once('=') {
                Some((l, p)) if !l.is_empty() && !l.contains('/') => {
                    (Some(l.to_string()), p.to_string())
                }
                _ => (None, s.to_string()),
            }),
        }
    }
    let out = out.ok_or("--out FILE.svg: expected the picture's path")?;
    if inputs.is_empty() {
        return Err("expected at least one result file".into());
    }
    Ok(Opts {
        out,
        title,
        in_place,
        inputs,
    })
}

/// The rows of a `coll_perf --json` file.
fn parse_json(text: &str, in_place: bool) -> Result<(String, Vec<Point>), String> {
    let rows: Vec<serde_json::Value> =
        serde_json::from_str(text).map_err(|e| format!("not coll_perf JSON: {e}"))?;
    let mut what = String::new();
    let mut points = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        let num = |v: &serde_json::Value, key: &str| {
            v.get(key)
                .and_then(serde_json::Value::as_f64)
                .ok_or_else(|| format!("row {i}: expected a number `{key}`"))
        };
        let m = r
            .get(if in_place { "in_place" } else { "out_of_place" })
            .ok_or_else(|| format!("row {i}: expected `out_of_place` and `in_place`"))?;
        points.push(Point {
            bytes: num(r, "size")?,
            time_us: num(m, "time_us")?,
            busbw: num(m, "busbw")?,
        });
        if what.is_empty() {
            let coll = r.get("collective").and_then(|v| v.as_str()).unwrap_or("");
            what = format!("{coll}, {} ranks", num(r, "nranks")?);
        }
    }
    Ok((what, points))
}

/// The data rows of nccl-tests' (or coll_perf's) text report: size count type redop root, then
/// time algbw busbw #wrong out of place and the same in place.
fn parse_text(text: &str, in_place: bool) -> Result<(String, Vec<Point>), String> {
    let mut points = Vec::new();
    let mut what = String::new();
    let at = if in_place { 9 } else { 5 };
    for line in text.lines() {
        let t = line.trim();
        if let Some(h) = t.strip_prefix("# coll_perf: ") {
            what = h.split(" (").next().unwrap_or(h).to_string();
        }
        if t.starts_with('#') || t.is_empty() {
            continue;
        }
        let f: Vec<&str> = t.split_whitespace().collect();
        let num = |i: usize| f.get(i).and_then(|s| s.parse::<f64>().ok());
        // nccl-tests' data rows start with the size and the count; other lines are skipped.
        let (Some(bytes), Some(_count)) = (num(0), num(1)) else {
            continue;
        };
        let (Some(time_us), Some(busbw)) = (num(at), num(at + 2)) else {
            continue;
        };
        points.push(Point {
            bytes,
            time_us,
            busbw,
        });
    }
    if points.is_empty() {
        return Err("no data rows (expected nccl-tests or coll_perf output, or --json)".into());
    }
    Ok((what, points))
}

fn load(label: &Option<String>, path: &str, in_place: bool) -> Result<Series, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading {path}: {e}"))?;
    let (what, mut points) = if path.ends_with(".json") {
        parse_json(&text, in_place)
    } else {
        parse_text(&text, in_place)
    }
    .map_err(|e| format!("{path}: {e}"))?;
    // Log scales: only positive sizes and times can be drawn.
    points.retain(|p| p.bytes > 0.0 && p.time_us > 0.0 && p.busbw.is_finite());
    if points.is_empty() {
        return Err(format!("{path}: no row with a positive size and time"));
    }
    points.sort_by(|a, b| a.bytes.total_cmp(&b.bytes));
    let label = label.clone().unwrap_or_else(|| {
        Path::new(path)
            .file_stem()
            .map_or_else(|| path.to_string(), |s| s.to_string_lossy().into_owned())
    });
    Ok(Series {
        label,
        what,
        points,
    })
}

/// 1024 -> "1K", 4194304 -> "4M": the axis labels of message sizes.
fn human_size(bytes: f64) -> String {
    let mut v = bytes;
    for unit in ["", "K", "M", "G"] {
        if v < 1024.0 || unit == "G" {
            return if v.fract() == 0.0 {
                format!("{v}{unit}")
            } else {
                format!("{v:.1}{unit}")
            };
        }
        v /= 1024.0;
    }
    unreachable!("the loop returns at G")
}

/// The (min, max) of `f` over every point, widened so that a log axis has some range.
fn bounds(all: &[Series], f: impl Fn(&Point) -> f64) -> (f64, f64) {
    let (lo, hi) = all
        .iter()
        .flat_map(|s| s.points.iter().map(&f))
        .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    (lo, hi.max(lo * 1.01))
}

/// Draws `s` (its points' `y`) on `chart` as a line with dots, in colour `i`, with a legend entry.
fn add_series<'a, DB: DrawingBackend + 'a, Y: Ranged<ValueType = f64>>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<LogCoord<f64>, Y>>,
    s: &Series,
    i: usize,
    y: fn(&Point) -> f64,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let color = Palette99::pick(i).to_rgba();
    let style = color.stroke_width(2);
    chart
        .draw_series(LineSeries::new(
            s.points.iter().map(|p| (p.bytes, y(p))),
            style,
        ))?
        .label(s.label.clone())
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
    chart.draw_series(
        s.points
            .iter()
            .map(|p| Circle::new((p.bytes, y(p)), 3, color.filled())),
    )?;
    Ok(())
}

/// The legend box of `chart`, upper left.
fn legend<'a, DB: DrawingBackend + 'a, Y: Ranged<ValueType = f64>>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<LogCoord<f64>, Y>>,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
}

fn draw(out: &str, title: &str, all: &[Series]) -> Result<(), String> {
    let e = |x: DrawingAreaErrorKind<std::io::Error>| format!("drawing {out}: {x}");
    let root = SVGBackend::new(out, (1200, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(e)?;
    let root = root.titled(title, ("sans-serif", 22)).map_err(e)?;
    let (left, right) = root.split_horizontally(600);
    let (x0, x1) = bounds(all, |p| p.bytes);
    let (t0, t1) = bounds(all, |p| p.time_us);
    let (_, b1) = bounds(all, |p| p.busbw);
    let size_fmt = |v: &f64| human_size(*v);

    let mut time = ChartBuilder::on(&left)
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .caption("time per call", ("sans-serif", 18))
        .build_cartesian_2d((x0..x1).log_scale(), (t0 * 0.8..t1 * 1.25).log_scale())
        .map_err(e)?;
    time.configure_mesh()
        .x_desc("message size (bytes)")
        .y_desc("time (us)")
        .x_label_formatter(&size_fmt)
        .draw()
        .map_err(e)?;
    let mut bw = ChartBuilder::on(&right)
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .caption("bus bandwidth", ("sans-serif", 18))
        .build_cartesian_2d((x0..x1).log_scale(), 0.0..b1 * 1.1)
        .map_err(e)?;
    bw.configure_mesh()
        .x_desc("message size (bytes)")
        .y_desc("bus bandwidth (GB/s)")
        .x_label_formatter(&size_fmt)
        .draw()
        .map_err(e)?;
    for (i, s) in all.iter().enumerate() {
        add_series(&mut time, s, i, |p| p.time_us).map_err(e)?;
        add_series(&mut bw, s, i, |p| p.busbw).map_err(e)?;
    }
    legend(&mut time).map_err(e)?;
    legend(&mut bw).map_err(e)?;
    root.present().map_err(e)
}

fn run(args: &[String]) -> Result<(), String> {
    let o = parse_args(args)?;
    let all = o
        .inputs
        .iter()
        .map(|(label, path)| load(label, path, o.in_place))
        .collect::<Result<Vec<_>, _>>()?;
    let title = o.title.clone().unwrap_or_else(|| {
        let what = &all[0].what;
        let place = if o.in_place {
            "in place"
        } else {
            "out of place"
        };
        if what.is_empty() {
            place.to_string()
        } else {
            format!("{what} ({place})")
        }
    });
    draw(&o.out, &title, &all)?;
    let n: usize = all.iter().map(|s| s.points.len()).sum();
    println!(
        "perf_plot: wrote {} ({} lines, {n} points)",
        o.out,
        all.len()
    );
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err(e) = run(&args) {
        if e.is_empty() {
            println!("{USAGE}");
            return;
        }
        eprintln!("perf_plot: {e}\n{USAGE}");
        std::process::exit(2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NCCL_TESTS: &str = "# nThread 1 nGpus 1 minBytes 1024 maxBytes 4096 step: 4(factor)
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
        1024           256     float     sum      -1    10.50    0.10    0.15      0    11.00    0.09    0.14      0
        4096          1024     float     sum      -1    12.00    0.34    0.51      0    12.50    0.33    0.49      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 0.33
";

    #[test]
    fn nccl_tests_rows_parse_out_of_and_in_place() {
        let (_, p) = parse_text(NCCL_TESTS, false).expect("rows");
        assert_eq!(
            p,
            vec![
                Point {
                    bytes: 1024.0,
                    time_us: 10.5,
                    busbw: 0.15
                },
                Point {
                    bytes: 4096.0,
                    time_us: 12.0,
                    busbw: 0.51
                },
            ]
        );
        let (_, p) = parse_text(NCCL_TESTS, true).expect("rows");
        assert_eq!(
            p[1],
            Point {
                bytes: 4096.0,
                time_us: 12.5,
                busbw: 0.49
            }
        );
        assert!(parse_text("# only comments\n", false).is_err());
    }

    #[test]
    fn coll_perf_json_parses_and_names_what_it_measured() {
        let json = r#"[{"collective":"allreduce","size":1024,"count":512,"dtype":"half",
            "redop":"sum","root":-1,"algorithm":"packet","nranks":4,
            "out_of_place":{"time_us":100.0,"algbw":0.01,"busbw":0.015,"wrong":0},
            "in_place":{"time_us":90.0,"algbw":0.011,"busbw":0.017,"wrong":0}}]"#;
        let (what, p) = parse_json(json, false).expect("json");
        assert_eq!(what, "allreduce, 4 ranks");
        assert_eq!(
            p,
            vec![Point {
                bytes: 1024.0,
                time_us: 100.0,
                busbw: 0.015
            }]
        );
        let (_, p) = parse_json(json, true).expect("json");
        assert_eq!(p[0].time_us, 90.0);
        let bad = parse_json(r#"[{"size":1}]"#, false).expect_err("missing columns");
        assert!(bad.contains("row 0: expected `out_of_place`"), "{bad}");
    }

    #[test]
    fn sizes_are_labelled_in_binary_units() {
        assert_eq!(human_size(512.0), "512");
        assert_eq!(human_size(1024.0), "1K");
        assert_eq!(human_size(4.0 * 1048576.0), "4M");
        assert_eq!(human_size(1536.0), "1.5K");
    }

    #[test]
    fn arguments_are_checked() {
        let a = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        assert!(parse_args(&a("x.json")).unwrap_err().contains("--out"));
        assert!(parse_args(&a("--out p.svg"))
            .unwrap_err()
            .contains("at least one"));
        let o = parse_args(&a("--out p.svg ours=a.json b.txt")).expect("ok");
        assert_eq!(o.inputs[0], (Some("ours".into()), "a.json".into()));
        assert_eq!(o.inputs[1], (None, "b.txt".into()));
    }

    #[test]
    fn a_picture_is_written_with_every_series() {
        let dir = std::env::temp_dir().join(format!("perf_plot_test_{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let txt = dir.join("nccl.txt");
        std::fs::write(&txt, NCCL_TESTS).expect("write");
        let out = dir.join("p.svg");
        let args = vec![
            "--out".to_string(),
            out.display().to_string(),
            format!("NCCL={}", txt.display()),
        ];
        run(&args).expect("draws");
        let svg = std::fs::read_to_string(&out).expect("svg");
        std::fs::remove_dir_all(&dir).expect("cleanup");
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
        assert!(svg.contains("NCCL"), "the legend names the series");
        assert!(svg.contains("bus bandwidth (GB/s)"));
    }
}
