#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The simulator's charts as a reader sees them (issue 23, "Pictures":
//! `tollgate sim --dataset B-extreme` drew nine lines in eight colours,
//! `counter` and `queue+freq+near` the same orange, and the grey
//! centralized line disappeared under the others): every line has its own
//! colour and dash, the ground truth is drawn on top, and every line's
//! final value is written beside its end, legibly.

use std::collections::HashSet;
use std::sync::OnceLock;

use tollgate_core::Nanos;
use tollgate_sim::chart::{dash_runs, line_chart_svg, LineStyle, Series, HEIGHT};
use tollgate_sim::dataset::{self, Kind, Params};
use tollgate_sim::figures::{figures, strategy_style, styles, Figure};
use tollgate_sim::run::{self, Outcome, SimConfig, SimStrategy};
use tollgate_sim::windows::{self, Contender, WindowParams};

/// Every strategy on a small B-extreme (capacity 20: 430 requests) in a
/// three-node cluster: real runs, made once for all the tests.
fn all_strategies() -> (String, Vec<Outcome>) {
    static RUNS: OnceLock<(String, Vec<Outcome>)> = OnceLock::new();
    RUNS.get_or_init(run_all_strategies).clone()
}

fn run_all_strategies() -> (String, Vec<Outcome>) {
    let set = dataset::generate(
        Kind::BExtreme,
        &Params {
            capacity: 20,
            seed: 1,
            users: None,
        },
    );
    let config = SimConfig {
        nodes: 3,
        ..SimConfig::default()
    };
    let outcomes = SimStrategy::ALL
        .iter()
        .map(|name| {
            let strategy = SimStrategy::parse(name, Nanos::from_millis(300)).unwrap();
            run::run(&set, &strategy, &config, &mut |_| {}).unwrap()
        })
        .collect();
    (set.name, outcomes)
}

fn hex((r, g, b): (u8, u8, u8)) -> String {
    format!("#{r:02X}{g:02X}{b:02X}")
}

fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let start = tag.find(&format!(" {name}=\""))? + name.len() + 3;
    let len = tag[start..].find('"')?;
    Some(&tag[start..start + len])
}

/// A `<polyline>`: its stroke colour, its width and its points.
struct Polyline {
    stroke: String,
    width: u32,
    points: Vec<(i32, i32)>,
}

/// Every `<polyline>`, in document order.
fn polylines(svg: &str) -> Vec<Polyline> {
    svg.split("<polyline")
        .skip(1)
        .map(|rest| {
            let tag = &rest[..rest.find("/>").unwrap()];
            let points = attr(tag, "points")
                .unwrap()
                .split_whitespace()
                .map(|p| {
                    let (x, y) = p.split_once(',').unwrap();
                    (x.parse().unwrap(), y.parse().unwrap())
                })
                .collect();
            Polyline {
                stroke: attr(tag, "stroke").unwrap().to_owned(),
                width: attr(tag, "stroke-width").unwrap().parse().unwrap(),
                points,
            }
        })
        .collect()
}

/// Every `<text>` as (x, y, fill, bold, content).
fn texts(svg: &str) -> Vec<(i32, i32, String, bool, String)> {
    svg.split("<text")
        .skip(1)
        .map(|rest| {
            let end = rest.find('>').unwrap();
            let tag = &rest[..end];
            let content = &rest[end + 1..rest.find("</text>").unwrap()];
            (
                attr(tag, "x").unwrap().parse().unwrap(),
                attr(tag, "y").unwrap().parse().unwrap(),
                attr(tag, "fill").unwrap().to_owned(),
                attr(tag, "font-weight") == Some("bold"),
                content.trim().to_owned(),
            )
        })
        .collect()
}

#[test]
fn every_strategy_and_the_ground_truth_differ_in_colour_and_in_dash() {
    // All the strategies the simulator can run at once, and the
    // centralized limiter: nine lines, nine colours, nine dashes.
    let mut all: Vec<LineStyle> = SimStrategy::ALL
        .iter()
        .map(|name| strategy_style(name).unwrap())
        .collect();
    all.push(LineStyle::REFERENCE);
    let colours: HashSet<_> = all.iter().map(|s| s.color).collect();
    let dashes: HashSet<_> = all.iter().map(|s| s.dash).collect();
    assert_eq!(colours.len(), all.len(), "{all:?}");
    assert_eq!(dashes.len(), all.len(), "{all:?}");
    // Only the ground truth is solid: the others read apart from it in
    // greyscale too.
    assert!(LineStyle::REFERENCE.is_solid());
    assert_eq!(all.iter().filter(|s| s.is_solid()).count(), 1);
    // The colours are told apart by eye, not only by the computer: no two
    // closer than 60 in RGB.
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            let d = |x: u8, y: u8| (f64::from(x) - f64::from(y)).powi(2);
            let (a, b) = (a.color, b.color);
            let distance = (d(a.0, b.0) + d(a.1, b.1) + d(a.2, b.2)).sqrt();
            assert!(distance > 60.0, "{a:?} and {b:?} are {distance:.0} apart");
        }
    }
    // A strategy named twice, or a name that is no strategy, still gets a
    // line of its own.
    let given = styles(&["counter", "counter", "queue+freq+near", "other"]);
    let pairs: HashSet<_> = given.iter().map(|s| (s.color, s.dash)).collect();
    assert_eq!(pairs.len(), given.len(), "{given:?}");
    assert_eq!(given[0], strategy_style("counter").unwrap());
}

#[test]
fn the_ground_truth_runs_to_the_latest_end_whatever_the_order_of_runs() {
    let (name, outcomes) = all_strategies();
    let long = outcomes[0].clone();
    let end = long.series.last().map(|s| s.t).unwrap();
    // The short run comes first and has more samples, packed into half the
    // time: the first run, or the one with the most samples, would both
    // end the line early.
    let mut short = long.clone();
    short.strategy = outcomes[1].strategy.clone();
    for sample in &mut short.series {
        sample.t /= 2.0;
    }
    let last = short.series.last().cloned().unwrap();
    short.series.extend([last.clone(), last]);
    let charts = figures(&name, &[short, long]);
    let truth = charts[0].series.iter().find(|s| s.reference).unwrap();
    assert_eq!(truth.points.last().map(|p| p.0), Some(end));
}

#[test]
fn the_simulations_charts_give_each_line_its_own_look() {
    let (name, outcomes) = all_strategies();
    let charts = figures(&name, &outcomes);
    let files: Vec<&str> = charts.iter().map(|f| f.file).collect();
    assert_eq!(files, ["rejections.svg", "memory.svg", "bandwidth.svg"]);
    for figure in &charts {
        let styles: HashSet<_> = figure
            .series
            .iter()
            .map(|s| (s.style.color, s.style.dash))
            .collect();
        assert_eq!(styles.len(), figure.series.len(), "{}", figure.file);
        // The same strategy looks the same in every chart.
        for s in figure.series.iter().filter(|s| !s.reference) {
            assert_eq!(Some(s.style), strategy_style(&s.name), "{}", s.name);
        }
    }
    let rejections = &charts[0];
    assert_eq!(rejections.series.len(), SimStrategy::ALL.len() + 1);
    let truth: Vec<&Series> = rejections.series.iter().filter(|s| s.reference).collect();
    assert_eq!(truth.len(), 1);
    assert_eq!(truth[0].name, "centralized");
    // Its count reaches the end of the run that ends last.
    let end = outcomes
        .iter()
        .filter_map(|o| o.series.last())
        .map(|s| s.t)
        .fold(f64::NEG_INFINITY, f64::max);
    assert_eq!(truth[0].points.last().map(|p| p.0), Some(end));
    // The lines as drawn: nine strokes, each its own colour.
    let svg = rejections.svg().unwrap();
    let drawn: HashSet<String> = series_strokes(&svg).into_iter().collect();
    let expected: HashSet<String> = rejections
        .series
        .iter()
        .map(|s| hex(s.style.color))
        .collect();
    assert_eq!(drawn, expected);
}

/// The strokes of the data lines in drawing order: polylines as wide as a
/// series (2 or 3 pixels), above the legend (which is below [`HEIGHT`]).
fn series_strokes(svg: &str) -> Vec<String> {
    polylines(svg)
        .into_iter()
        .filter(|p| p.width >= 2 && p.points.iter().all(|&(_, y)| y < HEIGHT as i32))
        .map(|p| p.stroke)
        .collect()
}

#[test]
fn the_ground_truth_is_drawn_on_top() {
    let (name, outcomes) = all_strategies();
    let rejections: Figure = figures(&name, &outcomes).remove(0);
    // The legend lists the centralized limiter first ...
    assert!(rejections.series[0].reference);
    // ... but its line comes after every other line, so none covers it.
    let strokes = series_strokes(&rejections.svg().unwrap());
    let black = hex(LineStyle::REFERENCE.color);
    let first_black = strokes.iter().position(|s| *s == black).unwrap();
    assert!(
        strokes[first_black..].iter().all(|s| *s == black),
        "a line drawn over the ground truth: {strokes:?}"
    );
    assert!(first_black > 0);
}

#[test]
fn every_line_ends_with_its_final_value_and_the_values_do_not_overlap() {
    let (name, outcomes) = all_strategies();
    for figure in figures(&name, &outcomes) {
        assert_final_values(figure.file, &figure.series, &figure.svg().unwrap());
    }
}

/// Each series' last value is written in its colour (the reference's in
/// bold) as the chart shows it, and labels side by side (left edges
/// within 60 pixels) are at least a line of text apart.
fn assert_final_values(file: &str, series: &[Series], svg: &str) {
    let texts = texts(svg);
    let mut labels = Vec::new();
    for s in series {
        let (_, last) = *s.points.last().unwrap();
        let colour = hex(s.style.color);
        // Rejections are whole; memory and bandwidth in KiB have
        // decimals, all alike within a chart: the label is the value to
        // its last digit.
        let shows = |content: &str| {
            let decimals = content.split('.').nth(1).map_or(0, str::len) as i32;
            content
                .parse::<f64>()
                .is_ok_and(|v| (v - last).abs() <= 0.5 * 10f64.powi(-decimals) + 1e-9)
        };
        let found = texts
            .iter()
            .find(|(_, _, fill, bold, content)| {
                *fill == colour && *bold == s.reference && shows(content)
            })
            .unwrap_or_else(|| panic!("{file}: no label {last} in {colour}"));
        labels.push(found.clone());
    }
    for (i, a) in labels.iter().enumerate() {
        for b in &labels[i + 1..] {
            if (a.0 - b.0).abs() < 60 {
                assert!((a.1 - b.1).abs() >= 15, "{file}: {a:?} overlaps {b:?}");
            }
        }
    }
}

#[test]
fn the_window_studys_charts_follow_the_same_rules() {
    let params = WindowParams {
        duration: Nanos::from_secs(5 * 60),
        chart_span: Nanos::from_secs(4 * 60),
        ..WindowParams::default()
    };
    let study = windows::run(&params).unwrap();
    for (file, series) in [
        ("windows-all", study.estimate_series(&Contender::ALL)),
        ("windows-granted", study.granted_series()),
    ] {
        let colours: HashSet<_> = series.iter().map(|s| s.style.color).collect();
        assert_eq!(colours.len(), series.len(), "{file}: colours");
        let dashes: HashSet<_> = series.iter().map(|s| s.style.dash).collect();
        assert_eq!(dashes.len(), series.len(), "{file}: dashes");
        let truth: Vec<&str> = series
            .iter()
            .filter(|s| s.reference)
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(truth, ["perfect sliding window"], "{file}");
        let svg = line_chart_svg(file, "time (s)", "hits", &series).unwrap();
        let strokes = series_strokes(&svg);
        assert_eq!(
            strokes.last().map(String::as_str),
            Some(hex(LineStyle::REFERENCE.color).as_str()),
            "{file}: the perfect window is drawn last"
        );
        assert_final_values(file, &series, &svg);
    }
}

#[test]
fn a_dash_pattern_runs_on_through_the_points_of_a_line() {
    // A 30-pixel line, 10 drawn and 5 skipped: two dashes.
    let runs = dash_runs(&[(0.0, 0.0), (30.0, 0.0)], &[10, 5]);
    assert_eq!(
        runs,
        [
            vec![(0.0, 0.0), (10.0, 0.0)],
            vec![(15.0, 0.0), (25.0, 0.0)]
        ]
    );
    // Round a corner: the first dash bends with the line.
    let runs = dash_runs(&[(0.0, 0.0), (6.0, 0.0), (6.0, 10.0)], &[10, 5]);
    assert_eq!(runs[0], [(0.0, 0.0), (6.0, 0.0), (6.0, 4.0)]);
    // Solid, and a pattern of zeros (solid in SVG too), draw the line.
    let line = [(0.0, 0.0), (3.0, 4.0), (9.0, 4.0)];
    assert_eq!(dash_runs(&line, &[]), [line.to_vec()]);
    assert_eq!(dash_runs(&line, &[0, 0]), [line.to_vec()]);
    assert!(dash_runs(&line[..1], &[10, 5]).is_empty());
    // Points that cannot be drawn end nothing: no endless loop, no line.
    assert!(dash_runs(&[(0.0, 0.0), (f64::INFINITY, 0.0)], &[10, 5]).is_empty());
    assert!(dash_runs(&[(0.0, 0.0), (f64::NAN, 1.0)], &[10, 5]).is_empty());
    // Every style's pattern draws something and skips something.
    for index in 0..8 {
        let style = LineStyle::series(index);
        let runs = dash_runs(&[(0.0, 0.0), (200.0, 0.0)], style.dash);
        assert!(runs.len() > 1, "{style:?}");
    }
}

#[test]
fn a_chart_without_data_has_no_values_to_label() {
    let svg = line_chart_svg("nothing", "x", "y", &[]).unwrap();
    assert!(svg.starts_with("<svg"));
    let series = [Series::new("empty", vec![], LineStyle::series(0))];
    let svg = line_chart_svg("empty", "x", "y", &series).unwrap();
    assert!(texts(&svg).iter().any(|t| t.4 == "empty"), "its legend");
}

/// The PNG as drawn (issue 23 looked at `rejections.png`): where the
/// ground truth and a strategy agree, the ground truth shows.
#[cfg(feature = "png")]
#[test]
fn in_the_png_the_ground_truth_covers_a_line_it_coincides_with() {
    use tollgate_sim::chart::svg_to_png;
    let line: Vec<(f64, f64)> = (0..=60).map(|t| (f64::from(t), 50.0)).collect();
    let counter = LineStyle::series(0);
    let count = |series: &[Series], colour: (u8, u8, u8)| {
        let svg = line_chart_svg("coincide", "s", "n", series).unwrap();
        let png = svg_to_png(&svg).unwrap();
        let pixmap = resvg::tiny_skia::Pixmap::decode_png(&png).unwrap();
        pixmap
            .pixels()
            .iter()
            .filter(|p| {
                let c = p.demultiply();
                (c.red(), c.green(), c.blue(), c.alpha()) == (colour.0, colour.1, colour.2, 255)
            })
            .count()
    };
    // The strategy alone, and under the ground truth listed before it.
    let alone = [Series::new("counter", line.clone(), counter)];
    let both = [
        Series::reference("centralized", line.clone()),
        Series::new("counter", line, counter),
    ];
    let orange_alone = count(&alone, counter.color);
    let orange_under = count(&both, counter.color);
    assert!(orange_alone > 500, "{orange_alone}");
    // The legend's sample and the label keep some orange; the line's is
    // covered.
    assert!(
        orange_under * 3 < orange_alone,
        "{orange_under} of {orange_alone} orange pixels still show"
    );
    // And every colour of the simulation's nine lines is in its PNG.
    let (name, outcomes) = all_strategies();
    let rejections = figures(&name, &outcomes).remove(0);
    for s in &rejections.series {
        let n = count(std::slice::from_ref(s), s.style.color);
        assert!(n > 50, "{}: {n} pixels", s.name);
    }
}
