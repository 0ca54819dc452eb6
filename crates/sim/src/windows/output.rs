//! The study's outputs: the aligned text table, the statistics and time
//! series as CSV, and the charts (SVG with a PNG beside each).
//!
//! Apart because it only formats what the study measured: a new output,
//! or a change to one, never touches the measurements.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use tollgate_core::Nanos;

#[cfg(doc)]
use super::WindowParams;
use super::{Contender, DecisionStats, EstimateStats, StudyResult, WindowsError};
use crate::chart::{self, LineStyle, Series};

impl StudyResult {
    /// The per-algorithm statistics as an aligned text table.
    pub fn table(&self) -> String {
        let p = &self.params;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "window study: seed {}, limit {} per {}, {} of traffic, {} arrivals; \
             perfect window allowed {}, worst {} span {}",
            p.seed,
            p.limit,
            secs(p.window),
            minutes(p.duration),
            self.arrivals,
            self.perfect.allowed,
            secs(p.window),
            self.perfect.worst_window,
        );
        let _ = writeln!(
            out,
            "estimate error: count of arrivals in the window vs truth, at each arrival; \
             decisions: at the limit, vs the perfect window (own state; shadow = on the perfect \
             window's history)"
        );
        let header = [
            "algorithm",
            "counters",
            "state B",
            "MAE",
            "RMSE",
            "bias",
            "max over",
            "max under",
            "allowed",
            "wrongly allowed",
            "wrongly blocked",
            "shadow allowed",
            "shadow blocked",
            "worst window",
        ];
        let mut rows: Vec<Vec<String>> = vec![header.iter().map(|s| s.to_string()).collect()];
        rows.push(vec![
            "perfect sliding window".into(),
            "-".into(),
            "-".into(),
            "0".into(),
            "0".into(),
            "0".into(),
            "0".into(),
            "0".into(),
            self.perfect.allowed.to_string(),
            "0".into(),
            "0".into(),
            "0".into(),
            "0".into(),
            self.perfect.worst_window.to_string(),
        ]);
        for a in &self.algorithms {
            let e = &a.at_arrivals;
            let counters = match a.contender {
                Contender::SlidingLog => format!("<={}", a.cost.counters),
                _ => a.cost.counters.to_string(),
            };
            rows.push(vec![
                a.name.clone(),
                counters,
                a.cost.state_bytes_peak.to_string(),
                format!("{:.2}", e.mae),
                format!("{:.2}", e.rmse),
                format!("{:+.2}", e.bias),
                e.max_over.to_string(),
                e.max_under.to_string(),
                a.decisions.allowed.to_string(),
                a.decisions.wrongly_allowed.to_string(),
                a.decisions.wrongly_blocked.to_string(),
                a.decisions.shadow_wrongly_allowed.to_string(),
                a.decisions.shadow_wrongly_blocked.to_string(),
                a.decisions.worst_window.to_string(),
            ]);
        }
        let widths: Vec<usize> = (0..header.len())
            .map(|c| {
                rows.iter()
                    .map(|r| r.get(c).map_or(0, |s| s.chars().count()))
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for row in &rows {
            let mut line = String::new();
            for (c, (cell, w)) in row.iter().zip(&widths).enumerate() {
                let pad = w.saturating_sub(cell.chars().count());
                if c == 0 {
                    line.push_str(cell);
                    line.push_str(&" ".repeat(pad));
                } else {
                    line.push_str("  ");
                    line.push_str(&" ".repeat(pad));
                    line.push_str(cell);
                }
            }
            let _ = writeln!(out, "{}", line.trim_end());
        }
        out
    }

    /// The per-algorithm statistics as CSV, one row per algorithm and the
    /// perfect window first (its cost cells empty).
    pub fn stats_csv(&self) -> String {
        let mut out = String::from(
            "key,algorithm,counters,state_bytes_peak,state_bytes_mean,\
             arrival_samples,arrival_mae,arrival_rmse,arrival_bias,arrival_max_over,arrival_max_under,\
             grid_samples,grid_mae,grid_rmse,grid_bias,grid_max_over,grid_max_under,\
             allowed,blocked,wrongly_allowed,wrongly_blocked,shadow_wrongly_allowed,\
             shadow_wrongly_blocked,worst_window,worst_window_end_s\n",
        );
        let zero = EstimateStats::default();
        let est = |e: &EstimateStats| {
            format!(
                "{},{:.6},{:.6},{:.6},{},{}",
                e.samples, e.mae, e.rmse, e.bias, e.max_over, e.max_under
            )
        };
        let dec = |d: &DecisionStats| {
            format!(
                "{},{},{},{},{},{},{},{:.9}",
                d.allowed,
                d.blocked,
                d.wrongly_allowed,
                d.wrongly_blocked,
                d.shadow_wrongly_allowed,
                d.shadow_wrongly_blocked,
                d.worst_window,
                d.worst_window_end.as_secs_f64()
            )
        };
        let _ = writeln!(
            out,
            "perfect,perfect sliding window,,,,{},{},{}",
            est(&zero),
            est(&zero),
            dec(&self.perfect)
        );
        for a in &self.algorithms {
            let _ = writeln!(
                out,
                "{},{},{},{},{:.3},{},{},{}",
                a.contender.key(),
                a.name,
                a.cost.counters,
                a.cost.state_bytes_peak,
                a.cost.state_bytes_mean,
                est(&a.at_arrivals),
                est(&a.on_grid),
                dec(&a.decisions)
            );
        }
        out
    }

    /// The time series as CSV: seconds, then the count of arrivals in the
    /// window (perfect, then each contender's estimate), then the hits
    /// granted in the window at the limit (perfect, then each contender).
    pub fn series_csv(&self) -> String {
        let s = &self.series;
        let mut out = String::from("t_s,perfect_count");
        for c in Contender::ALL {
            let _ = write!(out, ",{}_count", c.key());
        }
        out.push_str(",perfect_granted");
        for c in Contender::ALL {
            let _ = write!(out, ",{}_granted", c.key());
        }
        out.push('\n');
        for (i, at) in s.at.iter().enumerate() {
            let _ = write!(out, "{}", at.as_secs_f64());
            let cell = |v: Option<&u64>| v.map_or(String::new(), u64::to_string);
            let _ = write!(out, ",{}", cell(s.perfect.get(i)));
            for e in &s.estimates {
                let _ = write!(out, ",{}", cell(e.get(i)));
            }
            let _ = write!(out, ",{}", cell(s.perfect_granted.get(i)));
            for g in &s.granted {
                let _ = write!(out, ",{}", cell(g.get(i)));
            }
            out.push('\n');
        }
        out
    }

    /// The charts' series over [`WindowParams::chart_span`]: the perfect
    /// count (the reference, drawn on top) and `which` contenders' estimates.
    pub fn estimate_series(&self, which: &[Contender]) -> Vec<Series> {
        let s = &self.series;
        let mut out = vec![Series::reference(
            "perfect sliding window",
            self.points(&s.perfect),
        )];
        for (i, c) in Contender::ALL.iter().enumerate() {
            if which.contains(c) {
                let values = s.estimates.get(i).map_or(&[][..], Vec::as_slice);
                out.push(Series::new(
                    c.label(&self.params),
                    self.points(values),
                    c.style(),
                ));
            }
        }
        out
    }

    /// The hits granted in the last window over [`WindowParams::chart_span`]
    /// at the limit: the perfect window (the reference, drawn on top), every
    /// contender, and the
    /// limit itself.
    pub fn granted_series(&self) -> Vec<Series> {
        let s = &self.series;
        let mut out = vec![Series::reference(
            "perfect sliding window",
            self.points(&s.perfect_granted),
        )];
        for (i, c) in Contender::ALL.iter().enumerate() {
            let values = s.granted.get(i).map_or(&[][..], Vec::as_slice);
            out.push(Series::new(
                c.label(&self.params),
                self.points(values),
                c.style(),
            ));
        }
        let span = self.chart_end().as_secs_f64();
        let limit = self.params.limit as f64;
        out.push(Series::new(
            format!("limit ({})", self.params.limit),
            vec![(0.0, limit), (span, limit)],
            LineStyle::GUIDE,
        ));
        out
    }

    fn chart_end(&self) -> Nanos {
        let last = self.series.at.last().copied().unwrap_or(Nanos::ZERO);
        last.min(self.params.chart_span)
    }

    fn points(&self, values: &[u64]) -> Vec<(f64, f64)> {
        let end = self.chart_end();
        self.series
            .at
            .iter()
            .zip(values)
            .take_while(|(t, _)| **t <= end)
            .map(|(t, v)| (t.as_secs_f64(), *v as f64))
            .collect()
    }

    /// Writes `windows-stats.csv`, `windows-series.csv`, `windows-table.txt`
    /// and the charts (SVG, and PNG beside each) into `dir` (created if
    /// missing): one chart per
    /// contender against the perfect window (`windows-<key>.svg`, as the
    /// post's figures), all of them together (`windows-all.svg`) and the
    /// hits granted in the window at the limit (`windows-granted.svg`).
    /// Returns the paths written.
    pub fn write_outputs(&self, dir: &Path) -> Result<Vec<PathBuf>, WindowsError> {
        std::fs::create_dir_all(dir)?;
        let mut written = Vec::new();
        for (name, text) in [
            ("windows-stats.csv", self.stats_csv()),
            ("windows-series.csv", self.series_csv()),
            ("windows-table.txt", self.table()),
        ] {
            let path = dir.join(name);
            std::fs::write(&path, text)?;
            written.push(path);
        }
        let w = secs(self.params.window);
        let y = format!("hits in the last {w}");
        for c in Contender::ALL {
            let path = dir.join(format!("windows-{}.svg", c.key()));
            let title = format!("{} vs perfect sliding window", c.label(&self.params));
            let paths = chart::line_chart_files(
                &path,
                &title,
                "time (s)",
                &y,
                &self.estimate_series(&[c]),
            )?;
            written.extend(paths);
        }
        let path = dir.join("windows-all.svg");
        let paths = chart::line_chart_files(
            &path,
            "window algorithms vs perfect sliding window (all arrivals counted)",
            "time (s)",
            &y,
            &self.estimate_series(&Contender::ALL),
        )?;
        written.extend(paths);
        let path = dir.join("windows-granted.svg");
        let paths = chart::line_chart_files(
            &path,
            &format!("hits granted in the last {w} at the limit"),
            "time (s)",
            &format!("granted in the last {w}"),
            &self.granted_series(),
        )?;
        written.extend(paths);
        Ok(written)
    }
}

pub(super) fn secs(n: Nanos) -> String {
    let s = n.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0} s")
    } else {
        format!("{s} s")
    }
}

pub(super) fn minutes(n: Nanos) -> String {
    let m = n.as_secs_f64() / 60.0;
    if m.fract() == 0.0 {
        format!("{m:.0} min")
    } else {
        format!("{m:.2} min")
    }
}
