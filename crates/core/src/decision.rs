//! What an algorithm answers: a [`Decision`].
//!
//! Being limited is data, not an error (governor's habit): a rejection
//! carries when to retry. The fields follow Charon §3.1 (hits granted, the
//! limit, what remains) and the IETF/redis-cell vocabulary (`reset_after`,
//! `retry_after`).

use crate::time::Nanos;

/// How many hits (or copies) a caller asks for, as a range: the largest
/// `n` in `[min_hits, hits]` that the limits allow is granted, or nothing
/// (Charon §3.1). Not a whole request (which also names a limit and a
/// key): only its hits.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Hits {
    /// The most hits (or copies) wanted.
    pub hits: u64,
    /// The fewest hits that are still useful; fewer means rejection.
    pub min_hits: u64,
}

impl Hits {
    /// Asks for exactly `hits`, all or nothing.
    #[inline]
    pub const fn exactly(hits: u64) -> Hits {
        Hits {
            hits,
            min_hits: hits,
        }
    }

    /// Asks for up to `hits`, accepting as few as `min_hits`.
    #[inline]
    pub const fn between(min_hits: u64, hits: u64) -> Hits {
        Hits { hits, min_hits }
    }

    /// Whether the request can be answered at all: `min_hits <= hits`.
    #[inline]
    pub const fn is_well_formed(&self) -> bool {
        self.min_hits <= self.hits
    }
}

/// Whether the caller wants an immediate answer, is willing to wait, or
/// tells of usage after the fact.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// Grant now or reject (the default).
    #[default]
    Try,
    /// Always grant, and tell the caller how long to sleep first. Only
    /// algorithms that can schedule (see [`crate::Schedule`]) accept it.
    Acquire,
    /// The hits were already used (LLM tokens counted once the answer is
    /// out, Limitador's `Report`): charge them even past the limit, into a
    /// debt bounded by the limit's `max_debt`, and never reject. The debt is
    /// paid before anything is granted again. Only algorithms with a sound
    /// debt (see [`crate::Usage`]) accept it; `granted` says how many hits
    /// were charged (fewer when the bound clamped the report).
    Report,
    /// Give back hits that were taken and not used, never past a fresh
    /// state. Nothing records who took what, so a refund is not checked
    /// against the caller's own charge (as upstream limiters do); `granted`
    /// says how many hits were given back.
    Refund,
}

impl Mode {
    /// The mode's name on the wire and in errors: `try`, `acquire`,
    /// `report`, `refund`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Try => "try",
            Mode::Acquire => "acquire",
            Mode::Report => "report",
            Mode::Refund => "refund",
        }
    }

    /// Whether the mode tells of usage rather than asking for it
    /// ([`Mode::Report`], [`Mode::Refund`]).
    pub fn is_usage(self) -> bool {
        matches!(self, Mode::Report | Mode::Refund)
    }
}

/// The burst-tier context of a decision (Charon §2.1, §3.1).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct TierInfo {
    /// Index of the domain's current tier after the decision; 0 is the fake
    /// tier that is current when no configured tier is active.
    pub index: u32,
    /// The current tier's limit (0 for the fake tier).
    pub limit: u64,
    /// Hits inside the current tier's window.
    pub hits: u64,
    /// Whether this request entered at least one new tier.
    pub burst: bool,
}

/// One algorithm's answer to one request.
///
/// Every duration is relative to the `now` the decision was made at, and
/// describes the state *after* the decision was applied.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Decision {
    /// Hits granted: the largest `n` in `[min_hits, hits]` allowed, else 0.
    pub granted: u64,
    /// Whether the request succeeded. Differs from `granted > 0` only for a
    /// request with `min_hits == 0`, which succeeds with whatever is left.
    pub allowed: bool,
    /// The algorithm's headline limit (capacity, burst, window limit, ...).
    pub limit: u64,
    /// Hits a request could still be granted right now.
    pub remaining: u64,
    /// Time until the state is back to fresh (everything refilled/expired).
    pub reset_after: Nanos,
    /// Time until a request for `min_hits` would be granted, assuming no
    /// other traffic; zero if it would be granted now; `None` if it never can
    /// (it asks for more than the limit).
    pub retry_after: Option<Nanos>,
    /// How long the caller must wait before using what it was granted
    /// (leaky bucket queueing, or any algorithm in [`Mode::Acquire`]).
    pub wait: Nanos,
    /// Burst-tier context, for `burst_tiers` only.
    pub tier: Option<TierInfo>,
}

impl Decision {
    /// A decision that grants `granted` with no limit in sight; used for
    /// unlimited resources and degenerate requests.
    #[inline]
    pub const fn unlimited(granted: u64) -> Decision {
        Decision {
            granted,
            allowed: true,
            limit: u64::MAX,
            remaining: u64::MAX,
            reset_after: Nanos::ZERO,
            retry_after: Some(Nanos::ZERO),
            wait: Nanos::ZERO,
            tier: None,
        }
    }
}

/// What the grant step decided, handed to an algorithm's commit.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// Hits to record as granted (0 on rejection).
    pub granted: u64,
    /// Whether the request as a whole succeeded.
    pub allowed: bool,
}

impl Grant {
    /// The grant rule of Charon §3.1: `n` if `n >= min_hits`, else nothing.
    #[inline]
    pub fn from_room(request: Hits, room: u64) -> Grant {
        if !request.is_well_formed() {
            return Grant {
                granted: 0,
                allowed: false,
            };
        }
        let n = room.min(request.hits);
        if n >= request.min_hits {
            Grant {
                granted: n,
                allowed: true,
            }
        } else {
            Grant {
                granted: 0,
                allowed: false,
            }
        }
    }
}
