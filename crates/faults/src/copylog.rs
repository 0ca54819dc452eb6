//! The Redis copy log as a test reads it, and the invariants a quiet
//! system must satisfy (docs/redis.md, "The copy log and crash safety";
//! the layout is documented at the top of `crates/redis/lua/copies.lua`).
//!
//! One pool is two hashes read straight from Redis: `<prefix>{c:A}:pool`
//! (`n` the pool's name, `g` the global count, `d:<domain>`,
//! `G:<group>`, `s:<server>:<hold key>` each server's contribution,
//! `x:<server>` tombstones) and `<prefix>{c:A}:xfer` (transfer id →
//! cmsgpack `{domain, copies, expires, base second, groups...}`).
//!
//! The checks are pure functions of what was read and of what the live
//! servers say they hold, so they are tested here on hand-made pools and
//! the chaos suite only has to read Redis and the servers.

use std::collections::BTreeMap;
use std::fmt;

/// A contribution's key: the domain and the groups the copies were
/// reserved in.
pub type HoldKey = (String, Vec<String>);

/// One pool's hash, decoded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pool {
    /// The pool's name (`namespace/resource`), when the hash has one.
    pub name: Option<String>,
    /// `g`: copies held or staged in all (`None`: no such field, which is
    /// how a count of zero is stored).
    pub global: Option<i64>,
    /// `d:<domain>` counts.
    pub domains: BTreeMap<String, i64>,
    /// `G:<group>` counts.
    pub groups: BTreeMap<String, i64>,
    /// `s:<server>:<hold key>`: server → hold key → copies.
    pub contributions: BTreeMap<String, BTreeMap<HoldKey, i64>>,
    /// `x:<server>`: servers whose contributions were released here.
    pub tombstones: Vec<String>,
    /// `m:<server>`: each server's total beside its contributions.
    pub totals: BTreeMap<String, i64>,
    /// `v:<server>`: the version of each server's contributions (the id
    /// of the operation that last changed them).
    pub versions: BTreeMap<String, String>,
    /// Fields this layout does not know.
    pub unknown: Vec<String>,
}

impl Pool {
    /// What `server` contributes, over every hold key.
    pub fn contributed_by(&self, server: &str) -> i64 {
        self.contributions
            .get(server)
            .map_or(0, |c| c.values().sum())
    }
}

/// A staged transfer, from the `:xfer` hash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Staged {
    /// The transfer id.
    pub id: String,
    /// The domain the copies count under.
    pub domain: String,
    /// How many.
    pub copies: i64,
    /// The groups they count in.
    pub groups: Vec<String>,
}

/// A field or value that does not follow the layout.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{key}: {what}")]
pub struct Malformed {
    /// The Redis key.
    pub key: String,
    /// What was wrong.
    pub what: String,
}

/// Decodes a pool hash's fields (as `HGETALL` answers them).
pub fn parse_pool(key: &str, fields: &[(Vec<u8>, Vec<u8>)]) -> Result<Pool, Malformed> {
    let bad = |what: String| Malformed {
        key: key.to_owned(),
        what,
    };
    let mut p = Pool::default();
    for (f, v) in fields {
        let text = |v: &[u8]| String::from_utf8_lossy(v).into_owned();
        let number = |field: &str| -> Result<i64, Malformed> {
            let t = text(v);
            t.parse::<i64>()
                .map_err(|_| bad(format!("{field} = {t:?} is not a whole number")))
        };
        if f == b"n" {
            p.name = Some(text(v));
        } else if f == b"g" {
            p.global = Some(number("g")?);
        } else if let Some(d) = f.strip_prefix(b"d:") {
            p.domains
                .insert(text(d), number(&format!("d:{}", text(d)))?);
        } else if let Some(g) = f.strip_prefix(b"G:") {
            p.groups.insert(text(g), number(&format!("G:{}", text(g)))?);
        } else if let Some(server) = f.strip_prefix(b"v:") {
            p.versions.insert(text(server), text(v));
        } else if let Some(m) = f.strip_prefix(b"m:") {
            p.totals.insert(text(m), number(&format!("m:{}", text(m)))?);
        } else if let Some(x) = f.strip_prefix(b"x:") {
            p.tombstones.push(text(x));
        } else if let Some(rest) = f.strip_prefix(b"s:") {
            let colon = rest.iter().position(|&b| b == b':').ok_or_else(|| {
                bad(format!(
                    "contribution field without a hold key: {}",
                    text(f)
                ))
            })?;
            let server = text(&rest[..colon]);
            let values = msgpack::decode(&rest[colon + 1..])
                .map_err(|e| bad(format!("{server}'s hold key: {e}")))?;
            let mut names = values.into_iter().map(|v| match v {
                msgpack::Value::Str(s) => Ok(s),
                other => Err(bad(format!("{server}'s hold key holds {other:?}"))),
            });
            let domain = names
                .next()
                .ok_or_else(|| bad(format!("{server}'s hold key is empty")))??;
            let groups = names.collect::<Result<Vec<_>, _>>()?;
            let n = number(&format!("s:{server}:{domain}"))?;
            *p.contributions
                .entry(server)
                .or_default()
                .entry((domain, groups))
                .or_default() += n;
        } else {
            p.unknown.push(text(f));
        }
    }
    Ok(p)
}

/// Decodes a `:xfer` hash's fields.
pub fn parse_transfers(key: &str, fields: &[(Vec<u8>, Vec<u8>)]) -> Result<Vec<Staged>, Malformed> {
    let bad = |what: String| Malformed {
        key: key.to_owned(),
        what,
    };
    let mut out = Vec::new();
    for (id, v) in fields {
        let id = String::from_utf8_lossy(id).into_owned();
        let values = msgpack::decode(v).map_err(|e| bad(format!("transfer {id}: {e}")))?;
        let mut it = values.into_iter();
        let (Some(msgpack::Value::Str(domain)), Some(copies)) = (it.next(), it.next()) else {
            return Err(bad(format!("transfer {id}: no domain and copies")));
        };
        let copies = copies
            .as_i64()
            .ok_or_else(|| bad(format!("transfer {id}: copies is not a number")))?;
        // Expiry and base second, then the groups.
        let groups = it
            .skip(2)
            .map(|v| match v {
                msgpack::Value::Str(s) => Ok(s),
                other => Err(bad(format!("transfer {id}: group {other:?}"))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        out.push(Staged {
            id,
            domain,
            copies,
            groups,
        });
    }
    Ok(out)
}

/// One broken invariant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// A stable name for the kind, for summaries (`count_not_positive`,
    /// `count_mismatch`, `holds_mismatch`, `dead_server_contribution`,
    /// `left_over`, `malformed`).
    pub kind: &'static str,
    /// What exactly, with the numbers.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.detail)
    }
}

fn violation(kind: &'static str, detail: String) -> Violation {
    Violation { kind, detail }
}

/// Checks one pool while holds may still exist. `live` maps every live
/// server's copy-log id to the copies its sessions hold in this pool (as
/// the server reports them).
///
/// - no count is zero or negative (a count at zero is deleted);
/// - every count (`g`, `d:`, `G:`) equals the contributions plus the
///   staged transfers under it: copies are owned by a hold or a transfer,
///   or not counted at all;
/// - every live server's contributions equal what its sessions hold;
/// - no server that is not live contributes anything (its holds were
///   released when it died).
pub fn check_pool(
    key: &str,
    pool: &Pool,
    staged: &[Staged],
    live: &BTreeMap<String, u64>,
) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut positive = |field: String, n: i64| {
        if n <= 0 {
            out.push(violation(
                "count_not_positive",
                format!("{key} {field} = {n}"),
            ));
        }
    };
    if let Some(g) = pool.global {
        positive("g".to_owned(), g);
    }
    pool.domains
        .iter()
        .for_each(|(d, n)| positive(format!("d:{d}"), *n));
    pool.groups
        .iter()
        .for_each(|(g, n)| positive(format!("G:{g}"), *n));
    for (server, c) in &pool.contributions {
        for ((d, _), n) in c {
            positive(format!("s:{server}:{d}"), *n);
        }
    }
    for s in staged {
        positive(format!("transfer {} copies", s.id), s.copies);
    }
    for f in &pool.unknown {
        out.push(violation(
            "malformed",
            format!("{key}: unknown field {f:?}"),
        ));
    }
    // Each server's total is the sum of its contributions (the copy log
    // tells a pool that lost or went back on them by it).
    let servers: std::collections::BTreeSet<&String> = pool
        .contributions
        .keys()
        .chain(pool.totals.keys())
        .chain(pool.versions.keys())
        .collect();
    for server in servers {
        // A version exactly while the server holds anything here.
        if pool.versions.contains_key(server) != pool.contributions.contains_key(server) {
            out.push(violation(
                "count_mismatch",
                format!("{key} v:{server} is there exactly when the server holds nothing"),
            ));
        }
        let total = pool.totals.get(server).copied().unwrap_or(0);
        let summed = pool.contributed_by(server);
        if total != summed {
            out.push(violation(
                "count_mismatch",
                format!("{key} m:{server} = {total} but its contributions are {summed}"),
            ));
        }
    }
    // What the counts must be.
    let mut global = 0i64;
    let mut domains: BTreeMap<String, i64> = BTreeMap::new();
    let mut groups: BTreeMap<String, i64> = BTreeMap::new();
    let mut add = |d: &str, gs: &[String], n: i64| {
        global += n;
        *domains.entry(d.to_owned()).or_default() += n;
        for g in gs {
            *groups.entry(g.clone()).or_default() += n;
        }
    };
    for c in pool.contributions.values() {
        for ((d, gs), n) in c {
            add(d, gs, *n);
        }
    }
    for s in staged {
        add(&s.domain, &s.groups, s.copies);
    }
    let owners = "the copies held by servers' sessions plus the staged transfers";
    let g = pool.global.unwrap_or(0);
    if g != global {
        out.push(violation(
            "count_mismatch",
            format!("{key} g = {g} but {owners} are {global}"),
        ));
    }
    for d in domains.keys().chain(pool.domains.keys()) {
        let (got, want) = (
            pool.domains.get(d).copied().unwrap_or(0),
            domains.get(d).copied().unwrap_or(0),
        );
        if got != want {
            out.push(violation(
                "count_mismatch",
                format!("{key} d:{d} = {got} but {owners} are {want}"),
            ));
        }
    }
    for g in groups.keys().chain(pool.groups.keys()) {
        let (got, want) = (
            pool.groups.get(g).copied().unwrap_or(0),
            groups.get(g).copied().unwrap_or(0),
        );
        if got != want {
            out.push(violation(
                "count_mismatch",
                format!("{key} G:{g} = {got} but {owners} are {want}"),
            ));
        }
    }
    // Each contribution belongs to a live server whose sessions hold it.
    for server in pool.contributions.keys() {
        if !live.contains_key(server) {
            out.push(violation(
                "dead_server_contribution",
                format!(
                    "{key}: server {server}, which is not running, still contributes {} copies",
                    pool.contributed_by(server)
                ),
            ));
        }
    }
    for (server, held) in live {
        let redis = pool.contributed_by(server);
        if i64::try_from(*held).unwrap_or(i64::MAX) != redis {
            out.push(violation(
                "holds_mismatch",
                format!(
                    "{key}: server {server}'s sessions hold {held} copies, the copy log counts \
                     {redis} for it"
                ),
            ));
        }
    }
    out.dedup();
    out
}

/// Checks that a pool holds nothing once every hold was dropped and every
/// transfer expired: no count, no contribution, nothing staged (the name
/// and tombstones may stay).
pub fn check_empty(key: &str, pool: &Pool, staged: &[Staged]) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut left = Vec::new();
    if let Some(g) = pool.global {
        left.push(format!("g = {g}"));
    }
    left.extend(pool.domains.iter().map(|(d, n)| format!("d:{d} = {n}")));
    left.extend(pool.groups.iter().map(|(g, n)| format!("G:{g} = {n}")));
    for (server, c) in &pool.contributions {
        for ((d, gs), n) in c {
            left.push(format!("s:{server}:{d}{gs:?} = {n}"));
        }
    }
    left.extend(
        staged
            .iter()
            .map(|s| format!("transfer {} of {} copies", s.id, s.copies)),
    );
    if !left.is_empty() {
        out.push(violation(
            "left_over",
            format!(
                "{key} ({}) still counts after every hold was dropped and every transfer \
                 expired: {}",
                pool.name.as_deref().unwrap_or("no name"),
                left.join(", ")
            ),
        ));
    }
    out
}

/// Just enough MessagePack to read what Redis's `cmsgpack.pack` writes
/// for the copy log: one array of strings and numbers.
pub mod msgpack {
    /// A decoded element.
    #[derive(Clone, Debug, PartialEq)]
    pub enum Value {
        /// A string.
        Str(String),
        /// An integer.
        Int(i64),
        /// A double (cmsgpack writes non-integral numbers so).
        Float(f64),
    }

    impl Value {
        /// The value as a whole number, if it is one.
        pub fn as_i64(&self) -> Option<i64> {
            match self {
                Value::Int(n) => Some(*n),
                // Only integral doubles: truncation cannot happen.
                #[allow(clippy::cast_possible_truncation)]
                Value::Float(f) if f.fract() == 0.0 => Some(*f as i64),
                _ => None,
            }
        }
    }

    /// Decodes one array of strings and numbers.
    pub fn decode(mut b: &[u8]) -> Result<Vec<Value>, String> {
        let take = |n: usize, b: &mut &[u8]| -> Result<Vec<u8>, String> {
            if b.len() < n {
                return Err("truncated".to_owned());
            }
            let (head, rest) = b.split_at(n);
            *b = rest;
            Ok(head.to_vec())
        };
        let be = |bytes: Vec<u8>| bytes.iter().fold(0u64, |acc, x| (acc << 8) | u64::from(*x));
        let tag = take(1, &mut b)?[0];
        let len = match tag {
            t if t & 0xf0 == 0x90 => usize::from(t & 0x0f),
            0xdc => usize::try_from(be(take(2, &mut b)?)).map_err(|e| e.to_string())?,
            t => return Err(format!("not an array (type {t:#x})")),
        };
        let mut out = Vec::with_capacity(len);
        for _ in 0..len {
            let t = take(1, &mut b)?[0];
            let v = match t {
                0x00..=0x7f => Value::Int(i64::from(t)),
                0xe0..=0xff => Value::Int(i64::from(t as i8)),
                0xa0..=0xbf | 0xd9 | 0xda | 0xdb => {
                    let n = match t {
                        0xd9 => be(take(1, &mut b)?),
                        0xda => be(take(2, &mut b)?),
                        0xdb => be(take(4, &mut b)?),
                        _ => u64::from(t & 0x1f),
                    };
                    let n = usize::try_from(n).map_err(|e| e.to_string())?;
                    let s = take(n, &mut b)?;
                    Value::Str(String::from_utf8(s).map_err(|e| e.to_string())?)
                }
                0xcc => Value::Int(i64::try_from(be(take(1, &mut b)?)).map_err(|e| e.to_string())?),
                0xcd => Value::Int(i64::try_from(be(take(2, &mut b)?)).map_err(|e| e.to_string())?),
                0xce => Value::Int(i64::try_from(be(take(4, &mut b)?)).map_err(|e| e.to_string())?),
                0xcf => Value::Int(i64::try_from(be(take(8, &mut b)?)).map_err(|e| e.to_string())?),
                // Two's complement reinterpretations of the big-endian bits.
                #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
                0xd0 => Value::Int(i64::from(be(take(1, &mut b)?) as u8 as i8)),
                #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
                0xd1 => Value::Int(i64::from(be(take(2, &mut b)?) as u16 as i16)),
                #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
                0xd2 => Value::Int(i64::from(be(take(4, &mut b)?) as u32 as i32)),
                #[allow(clippy::cast_possible_wrap)]
                0xd3 => Value::Int(be(take(8, &mut b)?) as i64),
                #[allow(clippy::cast_possible_truncation)]
                0xca => Value::Float(f64::from(f32::from_bits(be(take(4, &mut b)?) as u32))),
                0xcb => Value::Float(f64::from_bits(be(take(8, &mut b)?))),
                t => return Err(format!("unexpected element type {t:#x}")),
            };
            out.push(v);
        }
        if !b.is_empty() {
            return Err("trailing bytes".to_owned());
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// cmsgpack of `["acme", "east"]`.
    fn hold_key(domain: &str, groups: &[&str]) -> Vec<u8> {
        let mut v = vec![0x90 | (1 + groups.len() as u8)];
        for s in std::iter::once(&domain).chain(groups) {
            v.push(0xa0 | s.len() as u8);
            v.extend_from_slice(s.as_bytes());
        }
        v
    }

    fn field(name: &[u8], value: &str) -> (Vec<u8>, Vec<u8>) {
        (name.to_vec(), value.as_bytes().to_vec())
    }

    fn contribution(server: &str, domain: &str, groups: &[&str], n: &str) -> (Vec<u8>, Vec<u8>) {
        let mut f = format!("s:{server}:").into_bytes();
        f.extend(hold_key(domain, groups));
        field(&f, n)
    }

    type Fields = Vec<(Vec<u8>, Vec<u8>)>;

    /// acme holds 2 in east through server a, globex 1 through b, and 1
    /// copy of acme's is staged.
    fn healthy() -> (Fields, Vec<Staged>) {
        let fields = vec![
            field(b"n", "shop/db"),
            field(b"g", "4"),
            field(b"d:acme", "3"),
            field(b"d:globex", "1"),
            field(b"G:east", "3"),
            contribution("a", "acme", &["east"], "2"),
            contribution("b", "globex", &[], "1"),
            field(b"m:a", "2"),
            field(b"m:b", "1"),
            field(b"v:a", "0123"),
            field(b"v:b", "4567"),
            field(b"x:old", "1700000000"),
        ];
        let staged = vec![Staged {
            id: "t1".into(),
            domain: "acme".into(),
            copies: 1,
            groups: vec!["east".into()],
        }];
        (fields, staged)
    }

    fn live(a: u64, b: u64) -> BTreeMap<String, u64> {
        [("a".to_owned(), a), ("b".to_owned(), b)].into()
    }

    #[test]
    fn a_server_total_that_is_not_the_sum_of_its_contributions_is_caught() {
        let (mut fields, staged) = healthy();
        fields.retain(|(f, _)| f != b"m:b");
        fields.push(field(b"m:a", "3"));
        let p = parse_pool("k", &fields).unwrap();
        let v = check_pool("k", &p, &staged, &live(2, 1));
        assert_eq!(
            v.iter().map(|v| v.kind).collect::<Vec<_>>(),
            ["count_mismatch", "count_mismatch"]
        );
    }

    #[test]
    fn a_consistent_pool_passes() {
        let (fields, staged) = healthy();
        let p = parse_pool("k", &fields).unwrap();
        assert_eq!(p.name.as_deref(), Some("shop/db"));
        assert_eq!(p.tombstones, ["old"]);
        assert_eq!(check_pool("k", &p, &staged, &live(2, 1)), []);
    }

    #[test]
    fn a_leaked_count_a_lost_hold_and_a_dead_server_are_each_caught() {
        let (mut fields, staged) = healthy();
        // A release that Redis applied after the server gave the copies
        // back to nobody: the server holds 0 where the log says 2.
        let p = parse_pool("k", &fields).unwrap();
        let v = check_pool("k", &p, &staged, &live(0, 1));
        assert_eq!(
            v.iter().map(|v| v.kind).collect::<Vec<_>>(),
            ["holds_mismatch"]
        );
        // A count one higher than its owners.
        fields[1] = field(b"g", "5");
        let p = parse_pool("k", &fields).unwrap();
        let v = check_pool("k", &p, &staged, &live(2, 1));
        assert_eq!(
            v.iter().map(|v| v.kind).collect::<Vec<_>>(),
            ["count_mismatch"]
        );
        // b is gone but still contributes.
        let (fields, staged) = healthy();
        let p = parse_pool("k", &fields).unwrap();
        let only_a: BTreeMap<String, u64> = [("a".to_owned(), 2)].into();
        let v = check_pool("k", &p, &staged, &only_a);
        assert_eq!(
            v.iter().map(|v| v.kind).collect::<Vec<_>>(),
            ["dead_server_contribution"]
        );
    }

    #[test]
    fn a_negative_count_is_caught() {
        let fields = vec![
            field(b"n", "shop/db"),
            field(b"g", "-1"),
            field(b"d:acme", "-1"),
        ];
        let p = parse_pool("k", &fields).unwrap();
        let v = check_pool("k", &p, &[], &BTreeMap::new());
        assert!(v.iter().any(|v| v.kind == "count_not_positive"), "{v:?}");
        // Absent is zero, and fine; present and zero is not.
        let p = parse_pool("k", &[field(b"n", "shop/db")]).unwrap();
        assert_eq!(check_pool("k", &p, &[], &BTreeMap::new()), []);
        let p = parse_pool("k", &[field(b"n", "shop/db"), field(b"g", "0")]).unwrap();
        let v = check_pool("k", &p, &[], &BTreeMap::new());
        assert_eq!(
            v.iter().map(|v| v.kind).collect::<Vec<_>>(),
            ["count_not_positive"]
        );
    }

    #[test]
    fn an_empty_pool_may_keep_its_name_and_tombstones_only() {
        let p = parse_pool("k", &[field(b"n", "shop/db"), field(b"x:a", "1")]).unwrap();
        assert_eq!(check_empty("k", &p, &[]), []);
        let (fields, staged) = healthy();
        let p = parse_pool("k", &fields).unwrap();
        let v = check_empty("k", &p, &staged);
        assert_eq!(v.len(), 1);
        assert!(v[0].detail.contains("transfer t1"), "{}", v[0]);
    }

    #[test]
    fn transfers_decode_from_cmsgpack() {
        // {"acme", 2, 1500000000 (uint32), 1700000000 (uint32), "east"}
        let mut v = vec![0x95, 0xa4];
        v.extend_from_slice(b"acme");
        v.push(0x02);
        v.push(0xce);
        v.extend_from_slice(&1_500_000_000u32.to_be_bytes());
        v.push(0xce);
        v.extend_from_slice(&1_700_000_000u32.to_be_bytes());
        v.push(0xa4);
        v.extend_from_slice(b"east");
        let staged = parse_transfers("x", &[(b"t9".to_vec(), v)]).unwrap();
        assert_eq!(
            staged,
            [Staged {
                id: "t9".into(),
                domain: "acme".into(),
                copies: 2,
                groups: vec!["east".into()],
            }]
        );
        assert!(parse_transfers("x", &[(b"t".to_vec(), vec![0x91, 0xc1])]).is_err());
    }
}
