//! A small deterministic generator: splitmix64 (Steele, Lea and Flood,
//! "Fast splittable pseudorandom number generators", 2014).
//!
//! Written out here instead of taken from `rand` so that a schedule drawn
//! from a seed is the same schedule forever: a failing seed kept as a
//! regression test must replay the same steps after any dependency
//! upgrade. Statistical quality is irrelevant here; stability is not.

/// A splitmix64 generator.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator started from `seed` (any value, 0 included).
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`0` when `n` is 0). The modulo bias is
    /// negligible for the small `n` schedules use.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        self.next_u64() % n
    }

    /// A number in `lo..=hi` (`lo` when `hi < lo`).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `per_mille` / 1000.
    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }

    /// An index into a slice of `len` elements (`0` when empty).
    pub fn index(&mut self, len: usize) -> usize {
        // usize -> u64 -> usize round trips on every supported target.
        self.below(len as u64) as usize
    }

    /// An index drawn with the given weights (the last one when every
    /// weight is 0).
    pub fn weighted(&mut self, weights: &[u64]) -> usize {
        let total: u64 = weights.iter().sum();
        let mut x = self.below(total);
        for (i, w) in weights.iter().enumerate() {
            if x < *w {
                return i;
            }
            x -= w;
        }
        weights.len().saturating_sub(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The published splitmix64 outputs for seed 0 pin the generator: if
    /// this fails, every kept regression seed replays a different
    /// schedule.
    #[test]
    fn splitmix64_gives_the_reference_sequence() {
        let mut r = Rng::new(0);
        assert_eq!(r.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(r.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(r.next_u64(), 0x06c4_5d18_8009_454f);
    }

    #[test]
    fn bounded_draws_stay_in_bounds() {
        let mut r = Rng::new(7);
        for _ in 0..1000 {
            assert!(r.below(5) < 5);
            let x = r.range(3, 6);
            assert!((3..=6).contains(&x));
            assert!(r.weighted(&[0, 3, 0, 1]) % 2 == 1);
        }
        assert_eq!(r.below(0), 0);
        assert_eq!(r.range(4, 2), 4);
    }
}
