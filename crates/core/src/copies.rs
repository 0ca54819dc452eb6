//! Copy-limited resources: Charon's counting semaphores (Charon §2.2, §3.1).
//!
//! A copy-limited resource is *held*, not hit: `reserve` takes copies,
//! `release` gives them back. A domain may hold at most its domain limit
//! (with per-domain overrides); all domains together at most the global
//! limit; and every domain group the domain belongs to has its own pool, so a
//! domain in two groups takes one copy from each (Charon §2.2). A release
//! must name the groups the domain belonged to when it reserved — membership
//! may have changed since — so the right pools are refilled (Charon §3.1).
//!
//! `transfer` moves held copies to a staging area under a transfer id; they
//! stay counted until another client `seize`s them or their TTL ends, when
//! they are released implicitly.
//!
//! [`CopyPool`] is the pure arithmetic for one resource. It does not know
//! sessions: the service keeps each session's hold set and releases it when
//! the session ends (Charon §4.3.1); the pool only guarantees that no count
//! ever goes negative and that nobody releases what is not held.

use std::collections::{HashMap, HashSet};
use std::fmt;

use thiserror::Error;

use crate::decision::{Grant, Hits};
use crate::error::ParamError;
use crate::time::Nanos;

/// The sorted, deduplicated names of the groups a hold was counted in.
pub type Groups = Vec<String>;

/// One domain group of a resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupLimit {
    /// The group's name, used in releases.
    pub name: String,
    /// Copies all members together may hold.
    pub limit: u64,
    /// The member domains.
    pub members: HashSet<String>,
}

/// The effective limits of one copy-limited resource.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CopyLimits {
    domain_limit: u64,
    global_limit: Option<u64>,
    groups: Vec<GroupLimit>,
    overrides: HashMap<String, u64>,
}

/// Identifies a set of staged copies (Charon §3.1 `transfer_id`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TransferId(pub u128);

impl fmt::Display for TransferId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl std::str::FromStr for TransferId {
    type Err = CopyError;
    fn from_str(s: &str) -> Result<TransferId, CopyError> {
        // `from_str_radix` also accepts a leading `+`: check the digits.
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(CopyError::UnknownTransfer);
        }
        u128::from_str_radix(s, 16)
            .map(TransferId)
            .map_err(|_| CopyError::UnknownTransfer)
    }
}

/// Why a copy operation was refused. Each is a client error (Charon §3.1).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum CopyError {
    /// Releasing or transferring more than is held.
    #[error("domain `{domain}` holds {} {}, cannot release {requested}", Copies(*.held), InGroups(.groups))]
    NotHeld {
        /// The domain.
        domain: String,
        /// The groups named.
        groups: Groups,
        /// Copies held under that domain and those groups.
        held: u64,
        /// Copies asked for.
        requested: u64,
    },
    /// Releasing or transferring zero copies.
    #[error("copies must be at least 1")]
    ZeroCopies,
    /// No such transfer, or its TTL ended (Charon: indistinguishable).
    #[error("no such transfer, or it expired")]
    UnknownTransfer,
    /// The transfer id is already in use.
    #[error("transfer id {0} is already staged")]
    DuplicateTransfer(TransferId),
}

/// A count of copies as a message says it: `no copies`, `1 copy`,
/// `3 copies`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Copies(pub u64);

impl fmt::Display for Copies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            0 => f.write_str("no copies"),
            1 => f.write_str("1 copy"),
            n => write!(f, "{n} copies"),
        }
    }
}

/// The groups copies are counted in, as a message says it: `in no group`,
/// ``in group `big` ``, ``in groups `a`, `b` ``. (A list printed as
/// `groups []` read as if the domain were in no group at all.)
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct InGroups<'a>(pub &'a [String]);

impl fmt::Display for InGroups<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            [] => f.write_str("in no group"),
            [one] => write!(f, "in group `{one}`"),
            many => {
                f.write_str("in groups ")?;
                for (i, g) in many.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "`{g}`")?;
                }
                Ok(())
            }
        }
    }
}

/// One group's figures in a response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupContext {
    /// The group's name.
    pub name: String,
    /// Its limit.
    pub limit: u64,
    /// Copies held by all its members.
    pub holds: u64,
}

/// The context of a reserve (Charon §3.1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyContext {
    /// The domain's limit.
    pub domain_limit: u64,
    /// The global limit, if any.
    pub global_limit: Option<u64>,
    /// Copies held by this domain.
    pub domain_holds: u64,
    /// Copies held by all domains.
    pub global_holds: u64,
    /// The domain's groups.
    pub groups: Vec<GroupContext>,
}

impl CopyContext {
    /// The same holds against `limits` (for `domain`): what an ignored
    /// limit would have said.
    pub fn against(mut self, limits: &CopyLimits, domain: &str) -> CopyContext {
        self.domain_limit = limits.domain_limit_for(domain);
        self.global_limit = limits.global_limit;
        for g in &mut self.groups {
            g.limit = limits.group_limit(&g.name).unwrap_or(u64::MAX);
        }
        self
    }

    /// Whether some hold count is above its limit.
    pub fn over_limit(&self) -> bool {
        self.domain_holds > self.domain_limit
            || self.global_limit.is_some_and(|g| self.global_holds > g)
            || self.groups.iter().any(|g| g.holds > g.limit)
    }
}

/// The answer to a reserve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    /// Copies now held (0 on rejection).
    pub granted: u64,
    /// Whether the reserve succeeded.
    pub allowed: bool,
    /// The groups the copies were counted in; needed to release them.
    pub groups: Groups,
    /// Limits and holds after the reserve.
    pub context: CopyContext,
}

/// Copies staged for transfer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Staged {
    /// The domain that holds them.
    pub domain: String,
    /// The groups they are counted in.
    pub groups: Groups,
    /// How many.
    pub copies: u64,
    /// When they are released if nobody seizes them.
    pub expires_at: Nanos,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct HoldKey {
    domain: String,
    groups: Groups,
}

/// The counts of one copy-limited resource (Charon §4.2's copy log).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CopyPool {
    global: u64,
    domains: HashMap<String, u64>,
    groups: HashMap<String, u64>,
    holds: HashMap<HoldKey, u64>,
    staged: HashMap<TransferId, Staged>,
}

impl CopyLimits {
    /// A domain limit and an optional global limit.
    pub fn new(domain_limit: u64, global_limit: Option<u64>) -> CopyLimits {
        CopyLimits {
            domain_limit,
            global_limit,
            groups: Vec::new(),
            overrides: HashMap::new(),
        }
    }

    /// Adds a domain group; names must be unique.
    pub fn with_group(
        mut self,
        name: impl Into<String>,
        limit: u64,
        members: impl IntoIterator<Item = impl Into<String>>,
    ) -> Result<CopyLimits, ParamError> {
        let name = name.into();
        if self.groups.iter().any(|g| g.name == name) {
            return Err(ParamError::Invalid {
                param: "groups",
                reason: format!("group `{name}` is defined twice"),
            });
        }
        self.groups.push(GroupLimit {
            name,
            limit,
            members: members.into_iter().map(Into::into).collect(),
        });
        Ok(self)
    }

    /// Overrides the domain limit for one domain.
    #[must_use]
    pub fn with_override(mut self, domain: impl Into<String>, domain_limit: u64) -> CopyLimits {
        self.overrides.insert(domain.into(), domain_limit);
        self
    }

    /// The domain limit that applies to `domain`.
    pub fn domain_limit_for(&self, domain: &str) -> u64 {
        self.overrides
            .get(domain)
            .copied()
            .unwrap_or(self.domain_limit)
    }

    /// The default domain limit.
    pub fn domain_limit(&self) -> u64 {
        self.domain_limit
    }

    /// The global limit.
    pub fn global_limit(&self) -> Option<u64> {
        self.global_limit
    }

    /// The groups.
    pub fn groups(&self) -> &[GroupLimit] {
        &self.groups
    }

    /// The per-domain overrides.
    pub fn overrides(&self) -> &HashMap<String, u64> {
        &self.overrides
    }

    /// The groups `domain` belongs to now, sorted.
    pub fn groups_of(&self, domain: &str) -> Groups {
        let mut g: Groups = self
            .groups
            .iter()
            .filter(|g| g.members.contains(domain))
            .map(|g| g.name.clone())
            .collect();
        g.sort();
        g
    }

    /// The same groups and members with every limit lifted: what a
    /// namespace that ignores its limits reserves against, so that holds are
    /// still counted in the groups a later, enforcing config will release
    /// them from.
    pub fn lifted(&self) -> CopyLimits {
        CopyLimits {
            domain_limit: u64::MAX,
            global_limit: None,
            groups: self
                .groups
                .iter()
                .map(|g| GroupLimit {
                    limit: u64::MAX,
                    ..g.clone()
                })
                .collect(),
            overrides: HashMap::new(),
        }
    }

    fn group_limit(&self, name: &str) -> Option<u64> {
        self.groups.iter().find(|g| g.name == name).map(|g| g.limit)
    }
}

/// Sorts and deduplicates group names as a release may list them.
pub fn normalize_groups<S: AsRef<str>>(groups: &[S]) -> Groups {
    let mut g: Groups = groups.iter().map(|s| s.as_ref().to_owned()).collect();
    g.sort();
    g.dedup();
    g
}

impl CopyPool {
    /// Copies held (or staged) by all domains.
    pub fn global_holds(&self) -> u64 {
        self.global
    }

    /// Copies held (or staged) by `domain`.
    pub fn domain_holds(&self, domain: &str) -> u64 {
        self.domains.get(domain).copied().unwrap_or(0)
    }

    /// Copies held (or staged) in group `name`.
    pub fn group_holds(&self, name: &str) -> u64 {
        self.groups.get(name).copied().unwrap_or(0)
    }

    /// Copies `domain` holds under `groups`, not counting staged ones.
    pub fn held(&self, domain: &str, groups: &[String]) -> u64 {
        let key = HoldKey {
            domain: domain.to_owned(),
            groups: normalize_groups(groups),
        };
        self.holds.get(&key).copied().unwrap_or(0)
    }

    /// Whether nothing is held or staged, so the pool can be dropped.
    pub fn is_empty(&self) -> bool {
        self.global == 0 && self.staged.is_empty()
    }

    /// The staged transfers, for inspection.
    pub fn staged(&self) -> impl Iterator<Item = (&TransferId, &Staged)> {
        self.staged.iter()
    }

    /// The figures a response reports for `domain`.
    pub fn context(&self, limits: &CopyLimits, domain: &str) -> CopyContext {
        CopyContext {
            domain_limit: limits.domain_limit_for(domain),
            global_limit: limits.global_limit,
            domain_holds: self.domain_holds(domain),
            global_holds: self.global,
            groups: limits
                .groups_of(domain)
                .into_iter()
                .map(|name| GroupContext {
                    limit: limits.group_limit(&name).unwrap_or(u64::MAX),
                    holds: self.group_holds(&name),
                    name,
                })
                .collect(),
        }
    }

    /// How many copies `domain` could take now.
    pub fn room(&self, limits: &CopyLimits, domain: &str) -> u64 {
        let mut room = limits
            .domain_limit_for(domain)
            .saturating_sub(self.domain_holds(domain));
        if let Some(g) = limits.global_limit {
            room = room.min(g.saturating_sub(self.global));
        }
        for group in limits.groups.iter().filter(|g| g.members.contains(domain)) {
            room = room.min(group.limit.saturating_sub(self.group_holds(&group.name)));
        }
        room
    }

    /// Reserves the largest `n` in `[min_copies, copies]` every limit
    /// allows, or nothing.
    pub fn reserve(&mut self, limits: &CopyLimits, domain: &str, request: Hits) -> Reservation {
        let grant = Grant::from_room(request, self.room(limits, domain));
        let groups = limits.groups_of(domain);
        if grant.granted > 0 {
            self.add(domain, &groups, grant.granted);
            *self
                .holds
                .entry(HoldKey {
                    domain: domain.to_owned(),
                    groups: groups.clone(),
                })
                .or_insert(0) += grant.granted;
        }
        Reservation {
            granted: grant.granted,
            allowed: grant.allowed,
            groups,
            context: self.context(limits, domain),
        }
    }

    /// Releases `copies` that `domain` reserved while in `groups`.
    pub fn release(
        &mut self,
        domain: &str,
        groups: &[String],
        copies: u64,
    ) -> Result<(), CopyError> {
        let groups = self.take_held(domain, groups, copies)?;
        self.subtract(domain, &groups, copies);
        Ok(())
    }

    /// Counts again `copies` that `domain` holds under `groups`, whatever
    /// the limits say: the inverse of [`CopyPool::release`], for a release
    /// whose caller was told it failed (its holder still holds them).
    pub fn restore(&mut self, domain: &str, groups: &[String], copies: u64) {
        let groups = normalize_groups(groups);
        self.add(domain, &groups, copies);
        let held = self
            .holds
            .entry(HoldKey {
                domain: domain.to_owned(),
                groups,
            })
            .or_insert(0);
        *held = held.saturating_add(copies);
    }

    /// Moves `copies` to the staging area under `id` until `expires_at`.
    pub fn transfer(
        &mut self,
        domain: &str,
        groups: &[String],
        copies: u64,
        id: TransferId,
        expires_at: Nanos,
    ) -> Result<(), CopyError> {
        if self.staged.contains_key(&id) {
            return Err(CopyError::DuplicateTransfer(id));
        }
        let groups = self.take_held(domain, groups, copies)?;
        self.staged.insert(
            id,
            Staged {
                domain: domain.to_owned(),
                groups,
                copies,
                expires_at,
            },
        );
        Ok(())
    }

    /// Claims staged copies; they become held again, by the caller. The
    /// groups returned are those the copies are counted in — which is what a
    /// later release must name, even if membership changed since.
    pub fn seize(&mut self, id: TransferId, now: Nanos) -> Result<Staged, CopyError> {
        self.expire(now);
        let staged = self.staged.remove(&id).ok_or(CopyError::UnknownTransfer)?;
        *self
            .holds
            .entry(HoldKey {
                domain: staged.domain.clone(),
                groups: staged.groups.clone(),
            })
            .or_insert(0) += staged.copies;
        Ok(staged)
    }

    /// Releases every staged transfer whose TTL ended by `now`.
    pub fn expire(&mut self, now: Nanos) -> Vec<(TransferId, Staged)> {
        let expired: Vec<TransferId> = self
            .staged
            .iter()
            .filter(|(_, s)| s.expires_at <= now)
            .map(|(id, _)| *id)
            .collect();
        let mut out = Vec::with_capacity(expired.len());
        for id in expired {
            if let Some(s) = self.staged.remove(&id) {
                self.subtract(&s.domain, &s.groups, s.copies);
                out.push((id, s));
            }
        }
        out
    }

    fn take_held(
        &mut self,
        domain: &str,
        groups: &[String],
        copies: u64,
    ) -> Result<Groups, CopyError> {
        if copies == 0 {
            return Err(CopyError::ZeroCopies);
        }
        let key = HoldKey {
            domain: domain.to_owned(),
            groups: normalize_groups(groups),
        };
        let held = self.holds.get(&key).copied().unwrap_or(0);
        if held < copies {
            return Err(CopyError::NotHeld {
                domain: key.domain,
                groups: key.groups,
                held,
                requested: copies,
            });
        }
        if held == copies {
            self.holds.remove(&key);
        } else {
            self.holds.insert(key.clone(), held - copies);
        }
        Ok(key.groups)
    }

    fn add(&mut self, domain: &str, groups: &[String], n: u64) {
        self.global = self.global.saturating_add(n);
        *self.domains.entry(domain.to_owned()).or_insert(0) += n;
        for g in groups {
            *self.groups.entry(g.clone()).or_insert(0) += n;
        }
    }

    fn subtract(&mut self, domain: &str, groups: &[String], n: u64) {
        self.global = self.global.saturating_sub(n);
        decrement(&mut self.domains, domain, n);
        for g in groups {
            decrement(&mut self.groups, g, n);
        }
    }
}

/// Decrements a count, pruning it at zero (Charon §4.3.2).
fn decrement(map: &mut HashMap<String, u64>, key: &str, n: u64) {
    if let Some(v) = map.get_mut(key) {
        *v = v.saturating_sub(n);
        if *v == 0 {
            map.remove(key);
        }
    }
}
