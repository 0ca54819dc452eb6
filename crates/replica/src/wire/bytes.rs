//! The integers of the format and the checked reader every decoder uses:
//! LEB128 varints (minimal, so an overlong encoding is refused), zig-zag
//! differences modulo 2⁶⁴, and [`Reader`], a cursor whose every read is
//! bounds-checked.
//!
//! Apart because every other part builds on them, and their exactness
//! (every `u64` round-trips, no input overflows or panics) is what the
//! decoder's "never panics" rests on.

use super::{WireError, TRUNCATED};

pub(super) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(super) fn varint_len(v: u64) -> usize {
    let bits = 64 - (v | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// `value − base` modulo 2⁶⁴ as a zig-zag number: small for nearby times
/// on either side, and exact for any two `u64`s.
pub(super) fn zigzag_delta(value: u64, base: u64) -> u64 {
    let d = value.wrapping_sub(base) as i64;
    ((d << 1) ^ (d >> 63)) as u64
}

/// The inverse of [`zigzag_delta`]: total, so no input overflows.
pub(super) fn apply_delta(base: u64, z: u64) -> u64 {
    let d = ((z >> 1) as i64) ^ -((z & 1) as i64);
    base.wrapping_add(d as u64)
}

/// A cursor over a datagram's bytes; every read is checked.
pub(super) struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader of `bytes`, from their start.
    pub(super) fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes }
    }

    pub(super) fn u8(&mut self) -> Result<u8, WireError> {
        let (&b, rest) = self.bytes.split_first().ok_or(TRUNCATED)?;
        self.bytes = rest;
        Ok(b)
    }

    /// A fixed-width little-endian `u64` (digest hashes, pull masks).
    pub(super) fn u64le(&mut self) -> Result<u64, WireError> {
        let bytes: [u8; 8] = self.take(8)?.try_into().map_err(|_| TRUNCATED)?;
        Ok(u64::from_le_bytes(bytes))
    }

    pub(super) fn varint(&mut self) -> Result<u64, WireError> {
        let mut v = 0u64;
        for i in 0..10 {
            let b = self.u8()?;
            if i == 9 && b > 1 {
                return Err(WireError::Malformed("varint overflows 64 bits"));
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                if b == 0 && i > 0 {
                    return Err(WireError::Malformed("overlong varint"));
                }
                return Ok(v);
            }
        }
        Err(WireError::Malformed("varint overflows 64 bits"))
    }

    pub(super) fn take(&mut self, len: u64) -> Result<&'a [u8], WireError> {
        let len = usize::try_from(len).map_err(|_| TRUNCATED)?;
        if len > self.bytes.len() {
            return Err(TRUNCATED);
        }
        let (taken, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Ok(taken)
    }

    pub(super) fn remaining(&self) -> usize {
        self.bytes.len()
    }

    /// A count of things at least `min_size` bytes each, refused when the
    /// rest of the datagram could not hold them.
    pub(super) fn count(
        &mut self,
        min_size: usize,
        what: &'static str,
    ) -> Result<usize, WireError> {
        let n = self.varint()?;
        bounded_count(n, self.remaining(), min_size).ok_or(WireError::Malformed(what))
    }

    pub(super) fn finish(self) -> Result<(), WireError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(WireError::Malformed("trailing bytes"))
        }
    }
}

pub(super) fn bounded_count(n: u64, remaining: usize, min_size: usize) -> Option<usize> {
    usize::try_from(n)
        .ok()
        .filter(|&n| n <= remaining / min_size)
}
