//! How a [`Limit`] travels to the Lua scripts: an algorithm code and a
//! flat list of numbers, and the bounds that keep the scripts exact.
//!
//! Lua 5.1 (what Redis runs) has only doubles, exact for integers up to
//! 2^53. The scripts work in nanoseconds relative to their own `now`
//! (`lua/prelude.lua`), so absolute times never appear, and every span or
//! count a limit keeps must stay below [`MAX_EXACT`] (2^52, which leaves a
//! bit of headroom for sums): about 52 days for a span. [`check_limit`]
//! refuses the others when the config is loaded, with the parameter named.
//! Calendar windows are the exception: their edges travel, and are kept,
//! as whole seconds plus nanoseconds, so a calendar year (366 days and
//! more, with arbitrary nanoseconds under the caller's clock) is exact
//! too (below, and `lua/algorithms/fixed_window.lua`).
//! Floating-point parameters (Guava's smooth limiters) are sent in Rust's
//! shortest round-trip notation, which Lua's `tonumber` reads back to the
//! same double, so the scripts compute the same Guava numbers.
//!
//! The codes and the order of each algorithm's numbers are the contract
//! with `lua/algorithms/*.lua`; each file's header repeats its layout.

use std::fmt::Write as _;

use smallvec::SmallVec;
use tollgate_core::{Align, Limit, Nanos, SmoothKind};

/// The largest span (in nanoseconds) or count a limit may keep in the
/// Redis store: 2^52, about 52 days.
pub const MAX_EXACT: u64 = 1 << 52;

/// Algorithm codes, shared with the Lua files.
pub(crate) mod code {
    pub const TOKEN_BUCKET: u8 = 1;
    pub const GCRA: u8 = 2;
    pub const LEAKY_BUCKET: u8 = 3;
    pub const FIXED_WINDOW: u8 = 4;
    pub const SLIDING_WINDOW: u8 = 5;
    pub const SLIDING_LOG: u8 = 6;
    pub const SMOOTH: u8 = 7;
    pub const BURST_TIERS: u8 = 8;
}

/// A limit as the scripts read it: its code and its numbers. Kept as
/// numbers (no string per parameter on every decision): they are written
/// straight into the command ([`Encoded::write`]).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Encoded {
    pub code: u8,
    pub params: SmallVec<[Param; 8]>,
}

/// One number of a limit's parameters.
#[derive(Copy, Clone, Debug, PartialEq)]
pub(crate) enum Param {
    /// A count or a span in nanoseconds.
    Int(u64),
    /// A signed count (a smooth limiter's times in microseconds).
    Signed(i64),
    /// A double, written in Rust's shortest round-trip notation (`{:?}`,
    /// with an exponent for very large or small values, which Lua's
    /// tonumber reads too), so Lua reads back the identical double.
    Float(f64),
}

impl Param {
    /// The number as the script reads it (`buf` is scratch space).
    pub(crate) fn text<'a>(&self, buf: &'a mut String) -> &'a str {
        buf.clear();
        let _ = match self {
            Param::Int(n) => write!(buf, "{n}"),
            Param::Signed(n) => write!(buf, "{n}"),
            Param::Float(f) => write!(buf, "{f:?}"),
        };
        buf
    }
}

impl Encoded {
    fn new(code: u8) -> Encoded {
        Encoded {
            code,
            params: SmallVec::new(),
        }
    }

    fn int(mut self, n: u64) -> Encoded {
        self.params.push(Param::Int(n));
        self
    }

    fn signed(mut self, n: i64) -> Encoded {
        self.params.push(Param::Signed(n));
        self
    }

    fn nanos(self, n: Nanos) -> Encoded {
        self.int(n.as_u64())
    }

    fn flag(self, b: bool) -> Encoded {
        self.int(u64::from(b))
    }

    fn float(mut self, f: f64) -> Encoded {
        self.params.push(Param::Float(f));
        self
    }

    /// Appends the parameter count and the parameters to `cmd` (`buf` is
    /// scratch space for doubles).
    pub(crate) fn write(&self, cmd: &mut redis::Cmd, buf: &mut String) {
        cmd.arg(self.params.len());
        for p in &self.params {
            match p {
                Param::Int(n) => cmd.arg(*n),
                Param::Signed(n) => cmd.arg(*n),
                Param::Float(_) => cmd.arg(p.text(buf)),
            };
        }
    }
}

/// Encodes `limit` for the scripts; a calendar window carries the edges
/// of the windows around `now` (this server's time).
pub(crate) fn encode(limit: &Limit, now: Nanos) -> Encoded {
    match limit {
        // capacity, initial, interval, full time, initial time, debt time
        Limit::TokenBucket(a) => Encoded::new(code::TOKEN_BUCKET)
            .int(a.capacity())
            .int(a.initial_tokens())
            .nanos(a.interval())
            .nanos(a.full_time())
            .nanos(a.initial_time())
            .nanos(a.debt_time()),
        // interval, burst, tolerance, debt time
        Limit::Gcra(a) => Encoded::new(code::GCRA)
            .nanos(a.interval())
            .int(a.burst())
            .nanos(a.tolerance())
            .nanos(a.debt_time()),
        // interval, queue size, tolerance, debt time
        Limit::LeakyBucket(a) => Encoded::new(code::LEAKY_BUCKET)
            .nanos(a.meter().interval())
            .int(a.queue_size())
            .nanos(a.meter().tolerance())
            .nanos(a.meter().debt_time()),
        // limit, window, align (0 epoch, 1 first hit, 2 calendar); a
        // calendar's four edges around `now` (three windows: the one
        // before this server's, its own, the one after), each as seconds
        // and nanoseconds since the epoch, which the script keeps as
        // seconds and nanoseconds relative to its now, never as one count
        // of nanoseconds: a year's three windows span three years, past
        // what a double holds to the nanosecond (2^53 ns, 104 days), and
        // its reset_after leaves the script as {seconds, nanoseconds}
        // when it is 2^53 ns or more (`reply::msgpack_ints` reassembles
        // it). Redis's clock picks among the three windows. Then max debt
        // (last, so that parameters an alignment adds go before it)
        Limit::FixedWindow(a) => {
            let e = Encoded::new(code::FIXED_WINDOW)
                .int(a.limit())
                .nanos(a.window());
            let e = match a.align() {
                Align::Epoch => e.int(0),
                Align::FirstHit => e.int(1),
                Align::Calendar(c) => {
                    let mut e = e.int(2);
                    for edge in c.windows_around(now) {
                        let n = edge.as_u64();
                        e = e.int(n / 1_000_000_000).int(n % 1_000_000_000);
                    }
                    e
                }
            };
            e.int(a.max_debt())
        }
        // limit, buckets, sub-window, max debt
        Limit::SlidingWindow(a) => Encoded::new(code::SLIDING_WINDOW)
            .int(a.limit())
            .int(u64::from(a.buckets()))
            .nanos(a.sub_window())
            .int(a.max_debt()),
        // limit, window, min gap, count rejected, max debt
        Limit::SlidingLog(a) => Encoded::new(code::SLIDING_LOG)
            .int(a.limit())
            .nanos(a.window())
            .nanos(a.min_gap())
            .flag(a.counts_rejected())
            .int(a.max_debt()),
        // kind (0 bursty, 1 warming up), permits per second, stable
        // interval (µs), max permits, threshold permits, slope, created at
        // (µs since the epoch), warm-up (µs; 0 when bursty)
        Limit::Smooth(a) => {
            let (kind, warmup) = match a.kind() {
                SmoothKind::Bursty { .. } => (0, 0),
                SmoothKind::WarmingUp { warmup_micros, .. } => (1, warmup_micros),
            };
            Encoded::new(code::SMOOTH)
                .int(kind)
                .float(a.permits_per_second())
                .float(a.stable_interval_micros())
                .float(a.max_permits())
                .float(a.threshold_permits())
                .float(a.slope())
                .signed(a.created_at_micros())
                .signed(warmup)
        }
        // tier count, then per tier: limit, window, active, cooldown,
        // skippable
        // Refused by `check_limit` before any plan holds one; should one
        // arrive anyway, a fixed window of nothing rejects (fail closed)
        // rather than deciding it as something it is not.
        Limit::Replicated(_) => Encoded::new(code::FIXED_WINDOW)
            .int(0)
            .nanos(Nanos::SECOND)
            .flag(false)
            .int(0),
        Limit::BurstTiers(a) => {
            let mut e = Encoded::new(code::BURST_TIERS).int(a.tiers().len() as u64);
            for t in a.tiers() {
                e = e
                    .int(t.limit)
                    .nanos(t.window)
                    .nanos(t.active)
                    .nanos(t.cooldown)
                    .flag(t.skippable);
            }
            e
        }
    }
}

/// Why a limit cannot run in the Redis store: the parameter and the bound
/// ([`check_limit`]).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Inexact {
    /// A count the scripts would not keep exactly.
    #[error("{parameter} {value} is too large for the Redis store (at most {})", MAX_EXACT - 1)]
    TooLarge {
        /// Which parameter, as the config names it.
        parameter: &'static str,
        /// Its value.
        value: u64,
    },
    /// A span the scripts would not keep exactly.
    #[error(
        "{parameter} {value} is too long for the Redis store (at most {}, about 52 days)",
        Nanos::new(MAX_EXACT - 1)
    )]
    TooLong {
        /// Which span, as the config names it (or how it is computed).
        parameter: &'static str,
        /// Its length.
        value: Nanos,
    },
    /// A smooth limiter stores more permits than the scripts keep exactly.
    #[error("max permits {0} are too many for the Redis store (at most {max})", max = MAX_EXACT - 1)]
    TooManyPermits(f64),
    /// Refilling a smooth limiter's permits takes longer than the scripts
    /// keep exactly.
    #[error(
        "refilling {0} permits takes too long for the Redis store (at most {max}, about 52 days)",
        max = Nanos::new(MAX_EXACT - 1)
    )]
    RefillTooLong(f64),
    /// A replicated limit (a gossip cluster's CRDT) is no limit for Redis.
    #[error("a replicated limit belongs to a gossip cluster, not to Redis")]
    Replicated,
}

/// Why a limit cannot run in the Redis store: the parameter and the bound.
pub fn check_limit(limit: &Limit) -> Result<(), Inexact> {
    let count = |parameter: &'static str, value: u64| {
        if value >= MAX_EXACT {
            Err(Inexact::TooLarge { parameter, value })
        } else {
            Ok(())
        }
    };
    let span = |parameter: &'static str, value: Nanos| {
        if value.as_u64() >= MAX_EXACT {
            Err(Inexact::TooLong { parameter, value })
        } else {
            Ok(())
        }
    };
    match limit {
        Limit::TokenBucket(a) => {
            count("capacity", a.capacity())?;
            count("initial_tokens", a.initial_tokens())?;
            span("the time to refill the bucket", a.full_time())?;
            span("the time to refill the initial tokens", a.initial_time())?;
            span("the time to repay max_debt", a.debt_time())
        }
        Limit::Gcra(a) => {
            count("burst", a.burst())?;
            span("burst × interval", a.tolerance())?;
            span("the time to repay max_debt", a.debt_time())
        }
        Limit::LeakyBucket(a) => {
            count("queue_size", a.queue_size())?;
            span("queue_size × interval", a.meter().tolerance())?;
            span("the time to repay max_debt", a.meter().debt_time())
        }
        Limit::FixedWindow(a) => {
            // The limit alone first: a config that sets no `max_debt` is
            // told of its limit, not of a sum it never wrote.
            count("limit", a.limit())?;
            count("limit + max_debt", a.limit().saturating_add(a.max_debt()))?;
            // A calendar window of any unit, a year included, is kept as
            // seconds and nanoseconds (see `encode`): no span bound.
            if let Align::Calendar(_) = a.align() {
                return Ok(());
            }
            span("window", a.longest_window())
        }
        Limit::SlidingWindow(a) => {
            // The limit alone first: a config that sets no `max_debt` is
            // told of its limit, not of a sum it never wrote.
            count("limit", a.limit())?;
            count("limit + max_debt", a.limit().saturating_add(a.max_debt()))?;
            span(
                "window",
                a.sub_window()
                    .saturating_mul(u64::from(a.buckets()).saturating_sub(1)),
            )
        }
        Limit::SlidingLog(a) => {
            // The limit alone first: a config that sets no `max_debt` is
            // told of its limit, not of a sum it never wrote.
            count("limit", a.limit())?;
            count("limit + max_debt", a.limit().saturating_add(a.max_debt()))?;
            span("window", a.window())?;
            span("min_gap", a.min_gap())
        }
        Limit::Replicated(_) => Err(Inexact::Replicated),
        Limit::Smooth(a) => {
            if let SmoothKind::WarmingUp { warmup_micros, .. } = a.kind() {
                span(
                    "warmup",
                    Nanos::from_micros(u64::try_from(warmup_micros).unwrap_or(u64::MAX)),
                )?;
            }
            // The stored permits and the time to refill them (at the
            // cool-down interval) must stay exact too.
            let max_permits = a.max_permits();
            if max_permits.is_nan() || max_permits >= MAX_EXACT as f64 {
                return Err(Inexact::TooManyPermits(max_permits));
            }
            let cool_down_micros = match a.kind() {
                SmoothKind::Bursty { .. } => a.stable_interval_micros(),
                SmoothKind::WarmingUp { warmup_micros, .. } => warmup_micros as f64 / max_permits,
            };
            let refill_ns = max_permits * cool_down_micros * 1000.0;
            if refill_ns.is_nan() || refill_ns >= MAX_EXACT as f64 {
                return Err(Inexact::RefillTooLong(max_permits));
            }
            Ok(())
        }
        Limit::BurstTiers(a) => {
            for t in a.tiers() {
                count("a tier's limit", t.limit)?;
                span("a tier's window", t.window)?;
                span(
                    "a tier's active + cooldown",
                    t.active.saturating_add(t.cooldown),
                )?;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::{Gcra, Rate, SlidingLog};

    #[test]
    fn gcra_encodes_interval_burst_tolerance() {
        let rate = Rate::per_second(10).unwrap_or_else(|e| panic!("{e}"));
        let g = Gcra::new(rate, 5).unwrap_or_else(|e| panic!("{e}"));
        let e = encode(&Limit::Gcra(g), Nanos::ZERO);
        assert_eq!(e.code, code::GCRA);
        let mut buf = String::new();
        let texts: Vec<String> = e
            .params
            .iter()
            .map(|p| p.text(&mut buf).to_owned())
            .collect();
        assert_eq!(texts, ["100000000", "5", "500000000", "500000000"]);
    }

    #[test]
    fn spans_past_two_to_the_52_are_refused_with_the_parameter_named() {
        let fine = SlidingLog::new(10, Nanos::from_secs(86_400)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(check_limit(&Limit::SlidingLog(fine)), Ok(()));
        let long =
            SlidingLog::new(10, Nanos::from_secs(60 * 86_400)).unwrap_or_else(|e| panic!("{e}"));
        let err = check_limit(&Limit::SlidingLog(long)).expect_err("60 days is too long");
        assert!(
            matches!(
                err,
                Inexact::TooLong {
                    parameter: "window",
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("window"), "{err}");
        let big = SlidingLog::new(MAX_EXACT, Nanos::SECOND).unwrap_or_else(|e| panic!("{e}"));
        let err = check_limit(&Limit::SlidingLog(big)).expect_err("limit too large");
        assert_eq!(
            err,
            Inexact::TooLarge {
                parameter: "limit",
                value: MAX_EXACT
            }
        );
        // A limit that fits, with a debt (by default one limit) that does not.
        let near = SlidingLog::new(MAX_EXACT - 1, Nanos::SECOND).unwrap_or_else(|e| panic!("{e}"));
        let err = check_limit(&Limit::SlidingLog(near)).expect_err("limit + debt too large");
        assert_eq!(
            err,
            Inexact::TooLarge {
                parameter: "limit + max_debt",
                value: 2 * (MAX_EXACT - 1)
            }
        );
        assert!(err.to_string().contains("limit"), "{err}");
    }

    /// Calendar windows of every unit run, a year included (once refused
    /// as `CalendarTooLong`: past the 2^52 ns bound), and the limit is
    /// still bounded; a year's edges travel as whole seconds and
    /// nanoseconds, the seconds of each a Paris midnight.
    #[test]
    fn calendar_windows_of_every_unit_run_a_year_included() {
        use tollgate_core::{Calendar, CalendarUnit, FixedWindow};
        let year = |limit| {
            let c =
                Calendar::new(CalendarUnit::Year, "Europe/Paris").unwrap_or_else(|e| panic!("{e}"));
            FixedWindow::calendar(limit, c).unwrap_or_else(|e| panic!("{e}"))
        };
        for unit in CalendarUnit::ALL {
            let c = Calendar::new(unit, "Europe/Paris").unwrap_or_else(|e| panic!("{e}"));
            let fw = FixedWindow::calendar(1, c).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(check_limit(&Limit::FixedWindow(fw)), Ok(()), "{unit}");
        }
        let err = check_limit(&Limit::FixedWindow(year(MAX_EXACT)))
            .expect_err("a limit of 2^52 is too large");
        assert!(
            matches!(
                err,
                Inexact::TooLarge {
                    parameter: "limit",
                    ..
                }
            ),
            "{err}"
        );
        // 2026-07-01T12:00:00.123456789Z: the edges are the Paris new
        // years 2025 to 2028 (23:00 UTC the day before): the windows of
        // 2025, 2026 and 2027.
        let now = Nanos::new(1_782_907_200_123_456_789);
        let e = encode(&Limit::FixedWindow(year(5)), now);
        assert_eq!(e.code, code::FIXED_WINDOW);
        let edges: Vec<Param> = [1_735_686_000, 1_767_222_000, 1_798_758_000, 1_830_294_000]
            .into_iter()
            .flat_map(|s| [Param::Int(s), Param::Int(0)])
            .collect();
        assert_eq!(e.params[3..11], edges[..]);
        assert_eq!(e.params.len(), 12);
    }
}
