//! The cluster simulation's charts (the thesis's Figures 5.5–5.12): the
//! rejections so far, the memory per node and the gossip sent, each
//! strategy over time, and in the first the centralized limiter's
//! rejections, the ground truth, drawn on top of the others.
//!
//! A strategy wears the same line in every chart of every run (its place
//! in [`SimStrategy::ALL`] picks it), so `counter` on B-extreme looks like
//! `counter` on B-barely; all of them and the ground truth differ from
//! each other in colour and in dash.

use std::path::{Path, PathBuf};

use crate::chart::{self, ChartError, LineStyle, Series};
use crate::run::{Outcome, Sample, SimStrategy};

/// One chart of a simulation: the file it goes to and what it shows.
#[derive(Clone, Debug, PartialEq)]
pub struct Figure {
    /// The SVG's file name (the PNG, if any, is named alike).
    pub file: &'static str,
    /// The chart's title.
    pub title: String,
    /// The y axis' text (the x axis is seconds).
    pub y_label: &'static str,
    /// The lines, in legend order.
    pub series: Vec<Series>,
}

impl Figure {
    /// The x axis' text.
    pub const X_LABEL: &'static str = "seconds";

    /// The chart as SVG.
    pub fn svg(&self) -> Result<String, ChartError> {
        chart::line_chart_svg(&self.title, Self::X_LABEL, self.y_label, &self.series)
    }

    /// Writes the chart into `dir` as SVG (and PNG, with the `png`
    /// feature); returns the paths written.
    pub fn write(&self, dir: &Path) -> Result<Vec<PathBuf>, ChartError> {
        chart::line_chart_files(
            &dir.join(self.file),
            &self.title,
            Self::X_LABEL,
            self.y_label,
            &self.series,
        )
    }
}

/// The line of strategy `name` (one of [`SimStrategy::ALL`]), or `None` for
/// a name the simulator does not know.
pub fn strategy_style(name: &str) -> Option<LineStyle> {
    SimStrategy::ALL
        .iter()
        .position(|&s| s == name)
        .map(LineStyle::series)
}

/// A line for each of `names`, all different: a strategy's own
/// ([`strategy_style`]), and for a name given twice or not a strategy,
/// the next style no strategy wears.
pub fn styles(names: &[&str]) -> Vec<LineStyle> {
    let mut used = Vec::new();
    let mut spare = SimStrategy::ALL.len();
    names
        .iter()
        .map(|name| {
            let style = match strategy_style(name) {
                Some(style) if !used.contains(&style) => style,
                _ => {
                    spare += 1;
                    LineStyle::series(spare - 1)
                }
            };
            used.push(style);
            style
        })
        .collect()
}

/// `rejections.svg`, `memory.svg` and `bandwidth.svg` of `outcomes` on
/// the data set `set_name`.
pub fn figures(set_name: &str, outcomes: &[Outcome]) -> Vec<Figure> {
    let names: Vec<&str> = outcomes.iter().map(|o| o.strategy.as_str()).collect();
    let styles = styles(&names);
    let per = |f: &dyn Fn(&Sample) -> f64| -> Vec<Series> {
        outcomes
            .iter()
            .zip(&styles)
            .map(|(o, style)| {
                Series::new(
                    o.strategy.clone(),
                    o.series.iter().map(|s| (s.t, f(s))).collect(),
                    *style,
                )
            })
            .collect()
    };
    let mut rejections = Vec::new();
    // Every run sees the same centralized limiter; the series that ends
    // last (the slowest strategy to converge) carries its count to the
    // end. By time, not by samples: two runs with as many samples can end
    // up to a sample interval apart.
    let end = |o: &&Outcome| o.series.last().map_or(f64::NEG_INFINITY, |s| s.t);
    if let Some(longest) = outcomes.iter().max_by(|a, b| end(a).total_cmp(&end(b))) {
        rejections.push(Series::reference(
            "centralized",
            longest
                .series
                .iter()
                .map(|s| (s.t, s.central_rejections as f64))
                .collect(),
        ));
    }
    rejections.extend(per(&|s| s.rejections as f64));
    vec![
        Figure {
            file: "rejections.svg",
            title: format!("{set_name}: rejections so far"),
            y_label: "rejections",
            series: rejections,
        },
        Figure {
            file: "memory.svg",
            title: format!("{set_name}: memory per node (states and deltas)"),
            y_label: "KiB per node",
            series: per(&|s| s.memory / 1024.0),
        },
        Figure {
            file: "bandwidth.svg",
            title: format!("{set_name}: gossip sent so far, all nodes"),
            y_label: "KiB",
            series: per(&|s| s.gossip_bytes as f64 / 1024.0),
        },
    ]
}
