//! The algorithms the study compares ([`Contender`]): how each is built
//! from the study's parameters, named, drawn and costed.
//!
//! Apart so that adding a contender touches one enum and its methods; the
//! measurements and outputs iterate over [`Contender::ALL`].

use tollgate_core::{Align, FixedWindow, Limit, SlidingLog, SlidingWindow};

use super::output::secs;
#[cfg(doc)]
use super::Cost;
use super::{WindowParams, WindowsError};
use crate::chart::LineStyle;

/// One algorithm of the study.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Contender {
    /// [`FixedWindow`], epoch-aligned.
    FixedWindow,
    /// [`SlidingWindow`] with 2 buckets: the weighted previous window.
    TwoWindows,
    /// [`SlidingWindow`] with [`WindowParams::sub_window_buckets`] buckets.
    SubWindows,
    /// [`SlidingLog`], exact.
    SlidingLog,
}

impl Contender {
    /// Every contender, cheapest first.
    pub const ALL: [Contender; 4] = [
        Contender::FixedWindow,
        Contender::TwoWindows,
        Contender::SubWindows,
        Contender::SlidingLog,
    ];

    /// A short identifier, for CSV columns and file names.
    pub fn key(self) -> &'static str {
        match self {
            Contender::FixedWindow => "fixed_window",
            Contender::TwoWindows => "two_windows",
            Contender::SubWindows => "sub_windows",
            Contender::SlidingLog => "sliding_log",
        }
    }

    /// A human name, for tables and legends.
    pub fn label(self, params: &WindowParams) -> String {
        match self {
            Contender::FixedWindow => format!("fixed window ({})", secs(params.window)),
            Contender::TwoWindows => "2-window approximation".to_string(),
            Contender::SubWindows => {
                let n = params.sub_window_buckets.max(2);
                let sub = params.window.div_floor(u64::from(n - 1));
                format!("{n} × {} sub-windows", secs(sub))
            }
            Contender::SlidingLog => "sliding log (exact)".to_string(),
        }
    }

    /// The core algorithm, at `limit` hits per window.
    pub fn limit(self, params: &WindowParams, limit: u64) -> Result<Limit, WindowsError> {
        Ok(match self {
            Contender::FixedWindow => {
                Limit::FixedWindow(FixedWindow::new(limit, params.window, Align::Epoch)?)
            }
            Contender::TwoWindows => {
                Limit::SlidingWindow(SlidingWindow::new(limit, params.window, 2)?)
            }
            Contender::SubWindows => Limit::SlidingWindow(SlidingWindow::new(
                limit,
                params.window,
                params.sub_window_buckets,
            )?),
            Contender::SlidingLog => Limit::SlidingLog(SlidingLog::new(limit, params.window)?),
        })
    }

    /// Counters read per decision, when fixed (the sliding log's varies:
    /// see [`Cost::counters`]).
    pub fn counters(self, params: &WindowParams) -> Option<u64> {
        match self {
            Contender::FixedWindow => Some(1),
            Contender::TwoWindows => Some(2),
            Contender::SubWindows => Some(u64::from(params.sub_window_buckets)),
            Contender::SlidingLog => None,
        }
    }

    /// Its line in the charts: the first is orange and dashed, as the
    /// post's fixed-window figure; each differs from the others, and from
    /// the perfect window's, in colour and dash.
    pub fn style(self) -> LineStyle {
        LineStyle::series(match self {
            Contender::FixedWindow => 0,
            Contender::TwoWindows => 1,
            Contender::SubWindows => 2,
            Contender::SlidingLog => 3,
        })
    }
}
