//! When a grant counts as near its limit (`tollgate_near_limit_total`,
//! `serve --near-limit-ratio`).
//!
//! envoyproxy/ratelimit's `NEAR_LIMIT_RATIO` (0.8 by default) is the same
//! rule, with exact arithmetic: the threshold is `floor(limit × ratio)`
//! hits used, and a decision is near the limit when the hits used after
//! it are *more* than the threshold (its `limitAfterIncrease >
//! nearLimitThreshold`). With a limit of 100 and 0.8, the 81st hit is the
//! first near the limit; with 5, the 5th. Upstream multiplies in 32-bit
//! floats, so some ratios put its threshold one hit low on some limits
//! (0.13 of 900 is `116.99999…` in `float32`, floored to 116; 0.21 of
//! 300 gives 62); here the ratio is kept as an exact decimal (millionths)
//! and the product is an integer one, so `floor(limit × ratio)` is what
//! it says (117 and 63).
//!
//! One difference is kept on purpose: upstream counts the *hits* past the
//! threshold (a stat per descriptor); tollgate counts *grants*, one per
//! decision, as `tollgate_decisions_total` does, so the two series divide
//! into "share of grants near the limit". A decision that granted nothing
//! (a probe of 0 hits) is not counted: upstream adds 0 for it too.

use std::str::FromStr;

/// Millionths in one.
const ONE: u32 = 1_000_000;

/// The share of a limit that a grant may leave used before it counts as
/// near the limit: a decimal in `[0, 1]` with at most 6 decimal places.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct NearLimitRatio {
    /// The ratio in millionths (0 to 1,000,000).
    millionths: u32,
}

impl Default for NearLimitRatio {
    /// 0.8, envoyproxy/ratelimit's default.
    fn default() -> NearLimitRatio {
        NearLimitRatio::DEFAULT
    }
}

/// Why a `--near-limit-ratio` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NearLimitRatioError {
    /// Not a decimal number such as `0.8`.
    #[error("near-limit ratio `{0}` is not a decimal number such as 0.8")]
    NotANumber(String),
    /// More than 1.
    #[error("near-limit ratio `{0}` is more than 1: it is the share of the limit used")]
    TooLarge(String),
    /// More than six decimal places.
    #[error("near-limit ratio `{0}` has more than 6 decimal places")]
    TooPrecise(String),
}

impl NearLimitRatio {
    /// 0.8.
    pub const DEFAULT: NearLimitRatio = NearLimitRatio {
        millionths: 800_000,
    };

    /// The ratio `millionths / 1,000,000`; `None` past 1.
    pub const fn from_millionths(millionths: u32) -> Option<NearLimitRatio> {
        if millionths > ONE {
            None
        } else {
            Some(NearLimitRatio { millionths })
        }
    }

    /// The ratio in millionths.
    pub const fn millionths(self) -> u32 {
        self.millionths
    }

    /// `floor(limit × ratio)`: the hits that may be used before a grant
    /// counts as near the limit.
    #[inline]
    pub fn threshold(self, limit: u64) -> u64 {
        let t = u128::from(limit) * u128::from(self.millionths) / u128::from(ONE);
        // At most `limit`, since the ratio is at most 1.
        u64::try_from(t).unwrap_or(limit)
    }

    /// Whether a decision that leaves `remaining` of `limit` is near the
    /// limit: more than [`NearLimitRatio::threshold`] hits used. A limit
    /// of 0 (`deny`) is never near: it is simply shut.
    #[inline]
    pub fn is_near(self, limit: u64, remaining: u64) -> bool {
        // `used > floor(limit × ratio)` is `used > limit × ratio` for a
        // whole `used`: compared by two widening multiplications, with no
        // division on the decision path.
        let used = limit.saturating_sub(remaining);
        limit > 0
            && u128::from(used) * u128::from(ONE) > u128::from(limit) * u128::from(self.millionths)
    }
}

impl FromStr for NearLimitRatio {
    type Err = NearLimitRatioError;

    fn from_str(s: &str) -> Result<NearLimitRatio, NearLimitRatioError> {
        // Quoted in errors: keep a long value's quote short.
        let quoted = || s.chars().take(32).collect::<String>();
        let (whole, fraction) = s.split_once('.').unwrap_or((s, ""));
        let digits = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
        if (whole.is_empty() && fraction.is_empty()) || !digits(whole) || !digits(fraction) {
            return Err(NearLimitRatioError::NotANumber(quoted()));
        }
        // Zeros past the sixth place change nothing (`0.8000000` is 0.8).
        let fraction = fraction.trim_end_matches('0');
        if fraction.len() > 6 {
            return Err(NearLimitRatioError::TooPrecise(quoted()));
        }
        let whole = whole.trim_start_matches('0');
        let units: u32 = match whole {
            "" => 0,
            "1" => 1,
            _ => return Err(NearLimitRatioError::TooLarge(quoted())),
        };
        let mut part: u32 = 0;
        for (i, b) in fraction.bytes().enumerate() {
            part += u32::from(b - b'0') * 10u32.pow(5 - i as u32);
        }
        NearLimitRatio::from_millionths(units * ONE + part)
            .ok_or_else(|| NearLimitRatioError::TooLarge(quoted()))
    }
}

impl std::fmt::Display for NearLimitRatio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let units = self.millionths / ONE;
        let part = self.millionths % ONE;
        if part == 0 {
            return write!(f, "{units}");
        }
        let fraction = format!("{part:06}");
        write!(f, "{units}.{}", fraction.trim_end_matches('0'))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn ratio(s: &str) -> NearLimitRatio {
        s.parse().unwrap()
    }

    #[test]
    fn the_default_is_upstreams_point_eight_exclusive() {
        let r = NearLimitRatio::default();
        assert_eq!(r.to_string(), "0.8");
        // Limit 100: threshold 80; the 81st hit used is the first near it.
        assert_eq!(r.threshold(100), 80);
        assert!(!r.is_near(100, 20), "80 used: at the threshold, not past");
        assert!(r.is_near(100, 19), "81 used");
        assert!(r.is_near(100, 0));
        // Limit 5: floor(4.0) = 4; only the last hit is near.
        assert!(!r.is_near(5, 1));
        assert!(r.is_near(5, 0));
        // Limit 1: floor(0.8) = 0; any use is near.
        assert!(r.is_near(1, 0));
        assert!(!r.is_near(1, 1));
        // Nothing used is never near; a deny (limit 0) never is.
        assert!(!r.is_near(100, 100));
        assert!(!r.is_near(0, 0));
        // Remaining past the limit (a probe of an odd state) is 0 used.
        assert!(!r.is_near(10, 11));
    }

    #[test]
    fn the_threshold_is_an_exact_decimal_floor() {
        // 0.13 × 900 is 116.99999… in 32-bit floats (upstream's
        // arithmetic): floored, 116. Exact: 117. Likewise 0.21 × 300.
        assert_eq!(ratio("0.13").threshold(900), 117);
        assert!(!ratio("0.13").is_near(900, 783));
        assert!(ratio("0.13").is_near(900, 782));
        assert_eq!(ratio("0.21").threshold(300), 63);
        assert_eq!(ratio("0.29").threshold(100), 29);
        assert!(!ratio("0.29").is_near(100, 71));
        assert!(ratio("0.29").is_near(100, 70));
        assert_eq!(ratio("0.5").threshold(7), 3);
        assert_eq!(ratio("1").threshold(u64::MAX), u64::MAX);
        assert_eq!(
            ratio("0.999999").threshold(u64::MAX),
            18_446_725_626_965_477_905
        );
        // 1: a grant can never use more than the limit.
        assert!(!ratio("1").is_near(10, 0));
        // 0: any hit used is near.
        assert!(ratio("0").is_near(10, 9));
        assert!(!ratio("0").is_near(10, 10));
    }

    #[test]
    fn near_is_past_the_threshold_for_every_small_limit_and_ratio() {
        for m in (0..=ONE)
            .step_by(12_500)
            .chain([1, 290_000, 333_333, 999_999])
        {
            let r = NearLimitRatio::from_millionths(m).unwrap();
            for limit in 0..=200u64 {
                for remaining in 0..=limit + 1 {
                    let used = limit.saturating_sub(remaining);
                    assert_eq!(
                        r.is_near(limit, remaining),
                        limit > 0 && used > r.threshold(limit),
                        "ratio {r}, limit {limit}, remaining {remaining}"
                    );
                }
            }
        }
    }

    #[test]
    fn ratios_parse_as_decimals_in_zero_to_one() {
        for (s, m) in [
            ("0.8", 800_000),
            (".8", 800_000),
            ("0.80", 800_000),
            ("1", ONE),
            ("1.0", ONE),
            ("01.000000", ONE),
            ("0", 0),
            ("0.000001", 1),
            ("0.123456", 123_456),
            ("0.8000000", 800_000),
            ("0.1234560000", 123_456),
        ] {
            assert_eq!(ratio(s).millionths(), m, "{s}");
        }
        assert_eq!(ratio("0.123450").to_string(), "0.12345");
        assert_eq!(ratio("1.0").to_string(), "1");
        let err = |s: &str| s.parse::<NearLimitRatio>().unwrap_err();
        assert_eq!(err("1.5"), NearLimitRatioError::TooLarge("1.5".to_owned()),);
        assert_eq!(err("2"), NearLimitRatioError::TooLarge("2".to_owned()));
        assert_eq!(
            err("1.000001"),
            NearLimitRatioError::TooLarge("1.000001".to_owned())
        );
        assert_eq!(
            err("0.1234567"),
            NearLimitRatioError::TooPrecise("0.1234567".to_owned())
        );
        for bad in [
            "", ".", "-0.5", "0,8", "80%", "1e-1", " 0.8", "NaN", "0.8.1",
        ] {
            assert!(
                matches!(err(bad), NearLimitRatioError::NotANumber(_)),
                "{bad:?}"
            );
        }
        assert!(err(&"9".repeat(10_000)).to_string().len() < 120);
    }
}
