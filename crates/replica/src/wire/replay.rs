//! The per-sender anti-replay window ([`ReplayGuard`]).
//!
//! Apart from the codec because it is the one part of the wire that keeps
//! state across datagrams: [`super::decode`] is a pure function of the
//! bytes, and the node passes each authentic header to the guard.

use std::collections::HashMap;

use tollgate_core::replicated::NodeId;

use super::header::Header;
#[cfg(doc)]
use super::Body;
use super::WireError;

/// Per-sender anti-replay, as IPsec does it (RFC 4303 §3.4.3): for each
/// sender, its latest incarnation and a window of the last 64 sequence
/// numbers, so each datagram is accepted once, and late ones within the
/// window still are.
///
/// It never goes back to an older incarnation of a sender, whatever
/// membership says: a datagram recorded from an earlier life stays refused
/// for as long as the guard remembers the sender. A sender that restarts
/// with an incarnation no larger than its last one is not let in by
/// forgetting it (a replayed datagram of the old life would then shut the
/// new one out again); it is told so ([`Admission::Outdated`], answered
/// with [`Body::Outdated`]) and comes back with a larger incarnation.
///
/// Bounded: it remembers at most `max_senders` senders and forgets the one
/// heard from least recently to make room. A forgotten sender's next
/// datagram is accepted as if it were the first, so `max_senders` should
/// exceed the cluster's size by a margin. Only authenticated datagrams
/// should reach it, so strangers cannot churn it.
#[derive(Clone, Debug)]
pub struct ReplayGuard {
    max_senders: usize,
    senders: HashMap<NodeId, Window>,
    /// Counts calls, to tell which sender was heard from least recently.
    tick: u64,
}

/// What [`ReplayGuard::admit`] makes of a datagram.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Not seen before: accepted, and recorded.
    Fresh,
    /// Already accepted once (a duplicate within the window).
    Duplicate,
    /// From before what the guard knows of the sender: an older
    /// incarnation than its latest, or the latest one more than
    /// [`ReplayGuard::WINDOW`] below its highest sequence number. Either
    /// a replay, or the sender restarted without a larger incarnation.
    Outdated {
        /// The sender's latest incarnation seen.
        incarnation: u64,
        /// The highest sequence number accepted in it.
        top: u64,
    },
}

/// One sender's replay state.
#[derive(Copy, Clone, Debug)]
struct Window {
    incarnation: u64,
    /// The highest sequence number accepted.
    top: u64,
    /// Bit `i` set: `top − i` was accepted.
    seen: u64,
    /// The tick of the last accepted datagram.
    last_heard: u64,
}

impl Window {
    fn admit(&mut self, incarnation: u64, seq: u64) -> Admission {
        let outdated = Admission::Outdated {
            incarnation: self.incarnation,
            top: self.top,
        };
        if incarnation < self.incarnation {
            return outdated;
        }
        if incarnation > self.incarnation {
            // A new life of the sender: its sequence numbers start over.
            self.incarnation = incarnation;
            self.top = seq;
            self.seen = 1;
            return Admission::Fresh;
        }
        if seq > self.top {
            let shift = seq - self.top;
            self.seen = if shift >= ReplayGuard::WINDOW {
                0
            } else {
                self.seen << shift
            };
            self.seen |= 1;
            self.top = seq;
            return Admission::Fresh;
        }
        let age = self.top - seq;
        if age >= ReplayGuard::WINDOW {
            return outdated;
        }
        let bit = 1u64 << age;
        if self.seen & bit != 0 {
            return Admission::Duplicate;
        }
        self.seen |= bit;
        Admission::Fresh
    }
}

impl ReplayGuard {
    /// How many sequence numbers below the highest one seen are still
    /// accepted (once each).
    pub const WINDOW: u64 = 64;

    /// The default bound on senders remembered.
    pub const DEFAULT_MAX_SENDERS: usize = 1024;

    /// A guard remembering at most `max_senders` senders (at least one).
    pub fn new(max_senders: usize) -> ReplayGuard {
        ReplayGuard {
            max_senders: max_senders.max(1),
            senders: HashMap::new(),
            tick: 0,
        }
    }

    /// Whether to accept datagram `seq` of `from`'s `incarnation`, and
    /// records it if so. Refused: an older incarnation than the latest
    /// seen, a sequence number already accepted, or one more than
    /// [`ReplayGuard::WINDOW`] below the highest accepted. A newer
    /// incarnation starts a fresh window.
    pub fn accept(&mut self, from: NodeId, incarnation: u64, seq: u64) -> bool {
        self.admit(from, incarnation, seq) == Admission::Fresh
    }

    /// [`ReplayGuard::accept`], telling a duplicate from a datagram of an
    /// earlier life of the sender (see [`Admission`]).
    pub fn admit(&mut self, from: NodeId, incarnation: u64, seq: u64) -> Admission {
        self.tick += 1;
        let tick = self.tick;
        if let Some(w) = self.senders.get_mut(&from) {
            let admission = w.admit(incarnation, seq);
            if admission == Admission::Fresh {
                w.last_heard = tick;
            }
            return admission;
        }
        if self.senders.len() >= self.max_senders {
            // A linear scan: it runs only when a sender not seen before
            // arrives while the table is full, which a cluster smaller than
            // the bound never causes.
            if let Some(oldest) = self
                .senders
                .iter()
                .min_by_key(|(_, w)| w.last_heard)
                .map(|(node, _)| *node)
            {
                self.senders.remove(&oldest);
            }
        }
        self.senders.insert(
            from,
            Window {
                incarnation,
                top: seq,
                seen: 1,
                last_heard: tick,
            },
        );
        Admission::Fresh
    }

    /// [`ReplayGuard::accept`] for a decoded header, as an error to count
    /// ([`WireError::Replayed`]).
    pub fn check(&mut self, header: &Header) -> Result<(), WireError> {
        if self.accept(header.from, header.incarnation, header.seq) {
            Ok(())
        } else {
            Err(WireError::Replayed)
        }
    }

    /// Forgets `from`: its next datagram, of any incarnation, is accepted
    /// as if it were the first. The node does not call it when membership
    /// declares a member down: a replay of the member's old datagrams
    /// would then be accepted, and lock its next life out (see the type's
    /// docs).
    pub fn forget(&mut self, from: NodeId) {
        self.senders.remove(&from);
    }

    /// How many senders it remembers.
    pub fn len(&self) -> usize {
        self.senders.len()
    }

    /// Whether it remembers no sender.
    pub fn is_empty(&self) -> bool {
        self.senders.is_empty()
    }
}

impl Default for ReplayGuard {
    fn default() -> ReplayGuard {
        ReplayGuard::new(ReplayGuard::DEFAULT_MAX_SENDERS)
    }
}
