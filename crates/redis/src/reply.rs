//! Reading the scripts' replies back into the core's types.

use smallvec::SmallVec;
use tollgate_core::{Decision, Mode, Nanos, PlanDecision, PlanError, TierInfo};
use tollgate_store::{Plan, StoreError};

/// The numbers of a `decide` reply, which the script packs with
/// `cmsgpack.pack` into one MessagePack array of integers (and of
/// {seconds, nanoseconds} pairs for times a double cannot hold, read as
/// one number of nanoseconds): one bulk string
/// to read rather than hundreds of RESP integers (parsing those cost the
/// server more than the rest of a decision; `docs/benchmarks.md`). Written
/// into `out`, which is cleared first and reused across calls.
pub(crate) fn msgpack_ints(bytes: &[u8], out: &mut Vec<i64>) -> Result<(), StoreError> {
    out.clear();
    let mut r = Reader { bytes, at: 0 };
    let n = match r.byte()? {
        b @ 0x90..=0x9f => usize::from(b & 0x0f),
        0xdc => usize::from(u16::from_be_bytes(r.array()?)),
        0xdd => u32::from_be_bytes(r.array()?) as usize,
        // An empty Lua table may be packed as an empty map.
        0x80 => 0,
        b => return Err(bad(&format!("a reply that is no array (0x{b:02x})"))),
    };
    // Each number takes at least a byte: a count past the bytes left is
    // malformed, and must not size an allocation.
    if n > bytes.len() {
        return Err(bad("an array longer than the reply"));
    }
    out.reserve(n);
    for _ in 0..n {
        let v = match r.byte()? {
            // A time of 2^53 ns or more (a calendar year's reset), which a
            // double cannot hold to the nanosecond: {seconds, nanoseconds}
            // (`lua/algorithms/fixed_window.lua`).
            0x92 => {
                let b = r.byte()?;
                let s = r.int(b)?;
                let b = r.byte()?;
                let ns = r.int(b)?;
                seconds_and_nanos(s, ns)?
            }
            b => r.int(b)?,
        };
        out.push(v);
    }
    if r.at != bytes.len() {
        return Err(bad("bytes after the reply's array"));
    }
    Ok(())
}

/// A time the script sent as whole seconds and nanoseconds, in
/// nanoseconds (saturated, as `whole` saturates; no decision's time comes
/// near 292 years).
fn seconds_and_nanos(s: i64, ns: i64) -> Result<i64, StoreError> {
    if s < 0 || !(0..1_000_000_000).contains(&ns) {
        return Err(bad(&format!("a time of {s} s and {ns} ns")));
    }
    Ok(s.saturating_mul(1_000_000_000).saturating_add(ns))
}

/// A double of the reply as an integer, saturated (`as` does that); NaN
/// is no number at all, and would otherwise read as 0.
fn whole(f: f64) -> Result<i64, StoreError> {
    if f.is_nan() {
        return Err(bad("a reply number that is NaN"));
    }
    Ok(f as i64)
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    /// The integer whose first byte is `b`.
    fn int(&mut self, b: u8) -> Result<i64, StoreError> {
        Ok(match b {
            0x00..=0x7f => i64::from(b),
            0xe0..=0xff => i64::from(b as i8),
            0xcc => i64::from(self.byte()?),
            0xcd => i64::from(u16::from_be_bytes(self.array()?)),
            0xce => i64::from(u32::from_be_bytes(self.array()?)),
            0xcf => i64::try_from(u64::from_be_bytes(self.array()?)).unwrap_or(i64::MAX),
            0xd0 => i64::from(self.byte()? as i8),
            0xd1 => i64::from(i16::from_be_bytes(self.array()?)),
            0xd2 => i64::from(i32::from_be_bytes(self.array()?)),
            0xd3 => i64::from_be_bytes(self.array()?),
            // cmsgpack packs a number that is not an exact 64-bit integer
            // as a double; the script's are whole, so this is only ever a
            // saturated debt near ±2^63 (see token_bucket.lua).
            0xcb => whole(f64::from_be_bytes(self.array()?))?,
            0xca => whole(f64::from(f32::from_be_bytes(self.array()?)))?,
            b => return Err(bad(&format!("a reply number of type 0x{b:02x}"))),
        })
    }

    fn byte(&mut self) -> Result<u8, StoreError> {
        let b = *self
            .bytes
            .get(self.at)
            .ok_or_else(|| bad("a reply cut short"))?;
        self.at += 1;
        Ok(b)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], StoreError> {
        let end = self.at + N;
        let s = self
            .bytes
            .get(self.at..end)
            .ok_or_else(|| bad("a reply cut short"))?;
        self.at = end;
        let mut a = [0; N];
        a.copy_from_slice(s);
        Ok(a)
    }
}

/// Numbers per item in a `decide` reply (see `lua/decide.lua`).
pub(crate) const PER_ITEM: usize = 12;
/// Numbers before the items.
pub(crate) const HEADER: usize = 5;

fn nonneg(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn bad(what: &str) -> StoreError {
    StoreError::Unavailable(format!("the Redis script answered malformed data: {what}"))
}

/// A `decide` reply for a plan of `items` items.
pub(crate) fn plan_decision(reply: &[i64], items: usize) -> Result<PlanDecision, StoreError> {
    if reply.len() != HEADER + items * PER_ITEM {
        return Err(bad(&format!("{} numbers for {items} items", reply.len())));
    }
    let mut decisions = SmallVec::with_capacity(items);
    let mut rooms = SmallVec::with_capacity(items);
    for d in reply[HEADER..].chunks_exact(PER_ITEM) {
        let tier = (d[7] >= 0).then(|| TierInfo {
            index: u32::try_from(d[7]).unwrap_or(u32::MAX),
            limit: nonneg(d[8]),
            hits: nonneg(d[9]),
            burst: d[10] != 0,
        });
        decisions.push(Decision {
            granted: nonneg(d[0]),
            allowed: d[1] != 0,
            limit: nonneg(d[2]),
            remaining: nonneg(d[3]),
            reset_after: Nanos::new(nonneg(d[4])),
            retry_after: (d[5] >= 0).then(|| Nanos::new(nonneg(d[5]))),
            wait: Nanos::new(nonneg(d[6])),
            tier,
        });
        rooms.push(nonneg(d[11]));
    }
    Ok(PlanDecision {
        granted: nonneg(reply[0]),
        allowed: reply[1] != 0,
        wait: Nanos::new(nonneg(reply[2])),
        limited_by: usize::try_from(reply[3]).ok(),
        shadow_limited: reply[4] != 0,
        decisions,
        rooms,
    })
}

/// One plan's part of a `decide` reply (status first): its decision, or
/// the error the script found before changing anything.
pub(crate) fn plan_outcome(
    part: &[i64],
    plan: &Plan,
    hits: u64,
    mode: Mode,
) -> Result<PlanDecision, StoreError> {
    let items = plan.len();
    match part {
        [0, rest @ ..] => plan_decision(rest, items),
        [status, index] => {
            let index = usize::try_from(*index).map_err(|_| bad("a negative item index"))?;
            let item = plan
                .items()
                .get(index)
                .ok_or_else(|| bad(&format!("item {index} of {items}")))?;
            // The hits the item was asked: its own, or the request's.
            let asked = item.hits.unwrap_or(hits);
            Err(match status {
                1 => StoreError::Plan(PlanError::CannotSchedule {
                    index,
                    algorithm: item.limit.algorithm_name(),
                }),
                2 => StoreError::Plan(PlanError::NeverAdmits {
                    index,
                    hits: asked,
                }),
                3 => StoreError::Unsupported(format!(
                    "acquiring {asked} hits would wait 52 days or more, which the Redis store cannot count exactly"
                )),
                4 => StoreError::Plan(PlanError::NoUsage {
                    index,
                    algorithm: item.limit.algorithm_name(),
                    mode,
                }),
                other => return Err(bad(&format!("status {other}"))),
            })
        }
        _ => Err(bad(&format!("{} numbers for {items} items", part.len()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_of_the_wrong_length_is_an_error_not_a_panic() {
        assert!(plan_decision(&[1, 1, 0, -1, 0], 1).is_err());
        assert!(plan_decision(&[], 0).is_err());
    }

    #[test]
    fn msgpack_integers_of_every_width_decode() {
        // [1, -1, 200, -100, 40000, -40000, 2^32, -2^40, 2^53, 3.0]
        let mut bytes = vec![0x9a, 0x01, 0xff, 0xcc, 200, 0xd0, 0x9c, 0xcd, 0x9c, 0x40];
        bytes.extend([0xd2, 0xff, 0xff, 0x63, 0xc0]);
        bytes.extend([0xcf, 0, 0, 0, 1, 0, 0, 0, 0]);
        bytes.extend([0xd3, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0]);
        bytes.extend([0xcf, 0, 0x20, 0, 0, 0, 0, 0, 0]);
        bytes.push(0xcb);
        bytes.extend(3.0f64.to_be_bytes());
        let mut out = Vec::new();
        msgpack_ints(&bytes, &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            out,
            [
                1,
                -1,
                200,
                -100,
                40000,
                -40000,
                1 << 32,
                -(1 << 40),
                1 << 53,
                3
            ]
        );
        // Cut short, trailing bytes, a string, or a count past the end:
        // errors, never a panic or a huge allocation.
        for bad in [
            &bytes[..bytes.len() - 1],
            &[0x91, 0x01, 0x02][..],
            &[0x91, 0xa1, b'x'][..],
            &[0x91, 0xcb, 0x7f, 0xf8, 0, 0, 0, 0, 0, 0][..],
            &[0xdd, 0xff, 0xff, 0xff, 0xff][..],
            &[][..],
        ] {
            assert!(msgpack_ints(bad, &mut out).is_err(), "{bad:?}");
        }
    }

    /// A calendar year's reset past 2^53 ns comes as {seconds,
    /// nanoseconds} and reads as the exact nanoseconds; anything else in
    /// an array is malformed.
    #[test]
    fn seconds_and_nanoseconds_pairs_read_as_one_exact_number() {
        // [7, [31622399, 876543211], -1]: 366 days less a second, and
        // 876543211 ns (3.2e16, past 2^53, odd).
        let mut bytes = vec![0x93, 0x07, 0x92, 0xce];
        bytes.extend(31_622_399u32.to_be_bytes());
        bytes.push(0xce);
        bytes.extend(876_543_211u32.to_be_bytes());
        bytes.push(0xff);
        let mut out = Vec::new();
        msgpack_ints(&bytes, &mut out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out, [7, 31_622_399_876_543_211, -1]);
        for bad in [
            // Cut short inside the pair.
            &[0x91, 0x92, 0x01][..],
            // Negative seconds, nanoseconds of a second or more.
            &[0x91, 0x92, 0xff, 0x00][..],
            &[0x91, 0x92, 0x01, 0xce, 0x3b, 0x9a, 0xca, 0x00][..],
            // Arrays of other lengths, and nested pairs.
            &[0x91, 0x93, 0x01, 0x02, 0x03][..],
            &[0x91, 0x91, 0x01][..],
            &[0x91, 0x92, 0x92, 0x01, 0x02, 0x03][..],
        ] {
            assert!(msgpack_ints(bad, &mut out).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn decodes_never_and_tiers() {
        let reply = [2, 1, 0, -1, 0, 2, 1, 10, 8, 5, -1, 0, 3, 10, 4, 1, 7];
        let pd = plan_decision(&reply, 1).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(pd.granted, 2);
        assert_eq!(pd.limited_by, None);
        let d = pd.decisions[0];
        assert_eq!(d.retry_after, None);
        assert_eq!(
            d.tier.map(|t| (t.index, t.limit, t.hits, t.burst)),
            Some((3, 10, 4, true))
        );
        assert_eq!(pd.rooms[0], 7);
    }
}
