//! Guava's `SmoothBursty` and `SmoothWarmingUp` (seed 002's Guava section),
//! ported so that they reproduce Guava's `RateLimiter` numbers exactly.
//!
//! The arithmetic is Guava's own: microseconds in `i64`, permits in `f64`,
//! the same operation order and the same truncating casts, so waits, stored
//! permits and the warm-up trapezoid agree to the microsecond with Guava's
//! test suite. Both limiters make a request *pay for the previous one*: a
//! request is granted (in any size) as soon as the previous request's cost
//! has elapsed, and its own cost delays the next caller.
//!
//! Per-key limiters: every key behaves as its own Guava `RateLimiter`,
//! created when the resource's limits were loaded (`created_at`). A key first
//! seen long after that has, like a long-idle Guava limiter, replenished its
//! stored permits. A key whose stored permits are full again and whose debt
//! is paid is indistinguishable from a fresh one, so a store may drop it.
//!
//! Deliberate differences, each refusing a case where Guava misbehaves:
//! rates must be finite and positive, and a warm-up shorter than one
//! microsecond is refused (Guava truncates it to zero and then stops
//! throttling altogether, google/guava#2730).

use crate::algorithm::{Algorithm, Schedule};
use crate::decision::{Decision, Grant, Hits};
use crate::error::ParamError;
use crate::rate::Rate;
use crate::time::Nanos;

/// Which of Guava's two smooth limiters, with its shape parameters.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum SmoothKind {
    /// `SmoothBursty`: stores up to `max_burst_seconds` of unused permits,
    /// spent at no cost.
    Bursty {
        /// Seconds of permits that idle time can save (Guava: 1.0).
        max_burst_seconds: f64,
    },
    /// `SmoothWarmingUp`: stored permits are *cold* and expensive; the rate
    /// climbs to the stable rate over `warmup`.
    WarmingUp {
        /// Warm-up period in microseconds.
        warmup_micros: i64,
        /// Cold interval over stable interval (Guava: 3.0).
        cold_factor: f64,
    },
}

/// Smooth-limiter parameters, with Guava's derived quantities precomputed.
#[derive(Clone, Debug, PartialEq)]
pub struct Smooth {
    kind: SmoothKind,
    permits_per_second: f64,
    stable_interval_micros: f64,
    max_permits: f64,
    threshold_permits: f64,
    slope: f64,
    created_at_micros: i64,
}

/// Smooth-limiter state, Guava's two mutable fields.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct SmoothState {
    /// Permits saved by idle time.
    pub stored_permits: f64,
    /// When the next request (of any size) will be granted, in microseconds.
    pub next_free_micros: i64,
}

impl Smooth {
    /// Guava's `RateLimiter.create(permitsPerSecond)`, with a configurable
    /// burst (Guava's default is one second).
    pub fn bursty(rate: Rate, max_burst_seconds: f64) -> Result<Smooth, ParamError> {
        if !(max_burst_seconds.is_finite() && max_burst_seconds >= 0.0) {
            return Err(ParamError::Invalid {
                param: "max_burst_seconds",
                reason: format!("must be a finite number of seconds >= 0, got {max_burst_seconds}"),
            });
        }
        let pps = rate.per_second_f64();
        let stable = 1_000_000.0 / pps;
        Ok(Smooth {
            kind: SmoothKind::Bursty { max_burst_seconds },
            permits_per_second: pps,
            stable_interval_micros: stable,
            max_permits: max_burst_seconds * pps,
            threshold_permits: 0.0,
            slope: 0.0,
            created_at_micros: 0,
        })
    }

    /// Guava's `RateLimiter.create(permitsPerSecond, warmupPeriod, unit)`
    /// with its cold factor exposed (Guava's default is 3.0).
    pub fn warming_up(rate: Rate, warmup: Nanos, cold_factor: f64) -> Result<Smooth, ParamError> {
        let warmup_micros = warmup.as_micros();
        if warmup_micros == 0 {
            return Err(ParamError::Invalid {
                param: "warmup",
                reason: "must be at least 1us (Guava truncates shorter warm-ups to zero and \
                         stops throttling); use smooth_bursty for no warm-up"
                    .into(),
            });
        }
        let warmup_micros = i64::try_from(warmup_micros).map_err(|_| ParamError::TooLarge {
            param: "warmup",
            reason: "longer than 292,000 years".into(),
        })?;
        if !(cold_factor.is_finite() && cold_factor >= 1.0) {
            return Err(ParamError::Invalid {
                param: "cold_factor",
                reason: format!("must be a finite number >= 1, got {cold_factor}"),
            });
        }
        let pps = rate.per_second_f64();
        let stable = 1_000_000.0 / pps;
        // Guava's SmoothWarmingUp.doSetRate, operation for operation.
        let cold_interval = stable * cold_factor;
        let threshold = 0.5 * warmup_micros as f64 / stable;
        let max_permits = threshold + 2.0 * warmup_micros as f64 / (stable + cold_interval);
        let slope = (cold_interval - stable) / (max_permits - threshold);
        Ok(Smooth {
            kind: SmoothKind::WarmingUp {
                warmup_micros,
                cold_factor,
            },
            permits_per_second: pps,
            stable_interval_micros: stable,
            max_permits,
            threshold_permits: threshold,
            slope,
            created_at_micros: 0,
        })
    }

    /// Sets when every key's limiter is considered created (when the limits
    /// were loaded); before this, the limiter admits nothing.
    #[must_use]
    pub fn created_at(mut self, at: Nanos) -> Smooth {
        self.created_at_micros = micros(at);
        self
    }

    /// The shape of the limiter.
    pub fn kind(&self) -> SmoothKind {
        self.kind
    }

    /// The stable rate.
    pub fn permits_per_second(&self) -> f64 {
        self.permits_per_second
    }

    /// Guava's `stableIntervalMicros`.
    pub fn stable_interval_micros(&self) -> f64 {
        self.stable_interval_micros
    }

    /// Guava's `thresholdPermits` (warming up only; 0 when bursty).
    pub fn threshold_permits(&self) -> f64 {
        self.threshold_permits
    }

    /// Guava's `slope` (warming up only; 0 when bursty).
    pub fn slope(&self) -> f64 {
        self.slope
    }

    /// When a fresh state's first permit is free, in microseconds since
    /// the Unix epoch (see [`Smooth::created_at`]).
    pub fn created_at_micros(&self) -> i64 {
        self.created_at_micros
    }

    /// The most permits idle time can store.
    pub fn max_permits(&self) -> f64 {
        self.max_permits
    }

    fn cool_down_interval_micros(&self) -> f64 {
        match self.kind {
            SmoothKind::Bursty { .. } => self.stable_interval_micros,
            SmoothKind::WarmingUp { warmup_micros, .. } => warmup_micros as f64 / self.max_permits,
        }
    }

    fn permits_to_time(&self, permits: f64) -> f64 {
        self.stable_interval_micros + permits * self.slope
    }

    fn stored_permits_to_wait_time(&self, stored_permits: f64, permits_to_take: f64) -> i64 {
        match self.kind {
            SmoothKind::Bursty { .. } => 0,
            SmoothKind::WarmingUp { .. } => {
                let mut permits_to_take = permits_to_take;
                let above = stored_permits - self.threshold_permits;
                let mut micros: i64 = 0;
                if above > 0.0 {
                    let above_to_take = above.min(permits_to_take);
                    let length =
                        self.permits_to_time(above) + self.permits_to_time(above - above_to_take);
                    micros = (above_to_take * length / 2.0) as i64;
                    permits_to_take -= above_to_take;
                }
                micros.saturating_add((self.stable_interval_micros * permits_to_take) as i64)
            }
        }
    }

    fn resync(&self, state: &mut SmoothState, now_micros: i64) {
        if now_micros > state.next_free_micros {
            let new_permits =
                (now_micros - state.next_free_micros) as f64 / self.cool_down_interval_micros();
            state.stored_permits = self.max_permits.min(state.stored_permits + new_permits);
            state.next_free_micros = now_micros;
        }
    }

    /// Guava's `reserveEarliestAvailable`: returns when this request may
    /// proceed, and charges its cost to the next one.
    fn reserve_earliest_available(
        &self,
        state: &mut SmoothState,
        permits: u64,
        now_micros: i64,
    ) -> i64 {
        self.resync(state, now_micros);
        let moment = state.next_free_micros;
        let required = permits as f64;
        let from_storage = required.min(state.stored_permits);
        let fresh = required - from_storage;
        let wait = self
            .stored_permits_to_wait_time(state.stored_permits, from_storage)
            .saturating_add((fresh * self.stable_interval_micros) as i64);
        state.next_free_micros = state.next_free_micros.saturating_add(wait);
        state.stored_permits -= from_storage;
        moment
    }

    /// The state with time advanced to `now`, for reporting.
    fn at(&self, state: &SmoothState, now_micros: i64) -> SmoothState {
        let mut s = *state;
        self.resync(&mut s, now_micros);
        s
    }

    fn describe(
        &self,
        state: &SmoothState,
        now: Nanos,
        grant: Grant,
        wait_micros: i64,
        min_hits: u64,
    ) -> Decision {
        let now_micros = micros(now);
        let s = self.at(state, now_micros);
        let debt = (s.next_free_micros - now_micros).max(0);
        let free_now = debt == 0;
        let remaining = match (free_now, self.kind) {
            (false, _) => 0,
            (true, SmoothKind::Bursty { .. }) => {
                (s.stored_permits.max(0.0) as u64).saturating_add(1)
            }
            (true, SmoothKind::WarmingUp { .. }) => 1,
        };
        let refill = ((self.max_permits - s.stored_permits).max(0.0)
            * self.cool_down_interval_micros()) as i64;
        Decision {
            granted: grant.granted,
            allowed: grant.allowed,
            limit: (self.max_permits as u64).max(1),
            remaining,
            reset_after: micros_to_nanos(debt.saturating_add(refill)),
            // A request is granted from the first nanosecond of the
            // microsecond its debt is paid (`now` need not be a whole
            // microsecond); one for no hits at once.
            retry_after: Some(if debt == 0 || min_hits == 0 {
                Nanos::ZERO
            } else {
                micros_to_nanos(s.next_free_micros).saturating_sub(now)
            }),
            wait: micros_to_nanos(wait_micros),
            tier: None,
        }
    }
}

fn micros(t: Nanos) -> i64 {
    // u64 nanoseconds / 1000 always fits in i64.
    (t.as_u64() / 1_000) as i64
}

fn micros_to_nanos(us: i64) -> Nanos {
    Nanos::from_micros(us.max(0) as u64)
}

impl Algorithm for Smooth {
    type State = SmoothState;

    /// Guava's state right after `setRate` at creation: its first `resync`
    /// runs while `maxPermits` is still 0, then the bursty limiter starts
    /// empty and the warming-up one full (cold).
    fn fresh(&self) -> SmoothState {
        let stored_permits = match self.kind {
            SmoothKind::Bursty { .. } => 0.0,
            SmoothKind::WarmingUp { .. } => self.max_permits,
        };
        SmoothState {
            stored_permits,
            next_free_micros: self.created_at_micros,
        }
    }

    /// Guava's `canAcquire` with no timeout: all or nothing, whatever the size.
    fn room(&self, state: &SmoothState, now: Nanos, hits: u64) -> u64 {
        if state.next_free_micros <= micros(now) {
            hits
        } else {
            0
        }
    }

    fn commit(&self, state: &mut SmoothState, now: Nanos, request: Hits, grant: Grant) -> Decision {
        let mut wait = 0;
        if grant.granted > 0 {
            let now_micros = micros(now);
            let moment = self.reserve_earliest_available(state, grant.granted, now_micros);
            wait = (moment - now_micros).max(0);
        }
        self.describe(state, now, grant, wait, request.min_hits)
    }

    fn is_idle(&self, state: &SmoothState, now: Nanos) -> bool {
        let now_micros = micros(now);
        let full = |s: SmoothState| {
            s.next_free_micros <= now_micros && s.stored_permits >= self.max_permits
        };
        full(self.at(state, now_micros)) && full(self.at(&self.fresh(), now_micros))
    }
}

impl Schedule for Smooth {
    /// Guava's `acquire(permits)`: returns the wait in `wait`.
    fn acquire(&self, state: &mut SmoothState, now: Nanos, hits: u64) -> Decision {
        let now_micros = micros(now);
        let moment = self.reserve_earliest_available(state, hits, now_micros);
        let grant = Grant {
            granted: hits,
            allowed: true,
        };
        self.describe(state, now, grant, (moment - now_micros).max(0), 1)
    }
}
