//! Durations (`300ms`, `1s`, `5m`, `1h`, `1d`, `1.5s`, `1h30m`) and rates
//! (`10/s`, `100/min`, `5000/300s`, `1/250ms`).

use tollgate_core::{Nanos, Rate};

const UNITS: [(&str, u64); 11] = [
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("sec", 1_000_000_000),
    ("m", 60_000_000_000),
    ("min", 60_000_000_000),
    ("h", 3_600_000_000_000),
    ("d", 86_400_000_000_000),
    ("w", 604_800_000_000_000),
];

/// Named periods accepted after the `/` of a rate.
const PERIODS: [(&str, u64); 9] = [
    ("s", 1_000_000_000),
    ("sec", 1_000_000_000),
    ("second", 1_000_000_000),
    ("m", 60_000_000_000),
    ("min", 60_000_000_000),
    ("minute", 60_000_000_000),
    ("h", 3_600_000_000_000),
    ("hour", 3_600_000_000_000),
    ("day", 86_400_000_000_000),
];

/// Parses a duration: one or more `<number><unit>` parts, the number may
/// have a fraction as long as the total is whole nanoseconds.
pub fn parse_duration(text: &str) -> Result<Nanos, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("empty duration".into());
    }
    if t.contains(char::is_whitespace) {
        // Else `1h 30m` is reported as an unknown unit `h `.
        let joined: String = t.split_whitespace().collect();
        return Err(format!(
            "`{t}` has a space in it: write a duration without spaces, e.g. `{joined}`"
        ));
    }
    let mut total: u128 = 0;
    let mut rest = t;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("`{t}` has no unit (write e.g. `{rest}s` or `{rest}ms`)"))?;
        if num_len == 0 {
            return Err(format!(
                "`{t}` is not a duration (expected e.g. 300ms, 1s, 5m, 1h, 1d)"
            ));
        }
        let (num, after) = rest.split_at(num_len);
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let scale = UNITS
            .iter()
            .find(|(u, _)| *u == unit)
            .map(|(_, s)| *s)
            .ok_or_else(|| {
                format!(
                    "unknown unit `{unit}` in `{t}` (use ns, us/µs, ms, s/sec, m/min, h, d or w)"
                )
            })?;
        total += scaled(num, scale).ok_or_else(|| {
            format!("`{t}` is not a whole number of nanoseconds or has a malformed number")
        })?;
        rest = next;
    }
    u64::try_from(total)
        .map(Nanos::new)
        .map_err(|_| format!("`{t}` is too long"))
}

/// `num × scale` exactly, for a decimal `num`; `None` if malformed or not
/// whole.
fn scaled(num: &str, scale: u64) -> Option<u128> {
    let (int, frac) = match num.split_once('.') {
        Some((i, f)) => (i, f),
        None => (num, ""),
    };
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    let int: u128 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let mut value = int.checked_mul(scale as u128)?;
    if !frac.is_empty() {
        if frac.len() > 18 || !frac.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let digits: u128 = frac.parse().ok()?;
        let denom = 10u128.pow(frac.len() as u32);
        let part = digits.checked_mul(scale as u128)?;
        if part % denom != 0 {
            return None;
        }
        value = value.checked_add(part / denom)?;
    }
    Some(value)
}

/// Parses a rate `N/period`, where the period is a unit name (`s`, `min`,
/// `hour`, `day`, ...) or a duration (`300s`, `250ms`).
pub fn parse_rate(text: &str) -> Result<Rate, String> {
    let t = text.trim();
    let (count, period) = t
        .split_once('/')
        .ok_or_else(|| format!("`{t}` is not a rate (expected e.g. 10/s, 100/min, 5000/300s)"))?;
    let count: u64 = count
        .trim()
        .parse()
        .map_err(|_| format!("`{t}`: the count before `/` must be a whole number"))?;
    if count == 0 {
        return Err(format!(
            "`{t}` admits nothing; the count must be at least 1"
        ));
    }
    let period = period.trim();
    let nanos = match PERIODS.iter().find(|(name, _)| *name == period) {
        Some((_, n)) => Nanos::new(*n),
        // A bare duration unit is one of it: `10/ms`, `10/d`, `10/w`.
        None if !period.is_empty()
            && !period.starts_with(|c: char| c.is_ascii_digit() || c == '.') =>
        {
            parse_duration(&format!("1{period}")).map_err(|e| format!("`{t}`: {e}"))?
        }
        None => parse_duration(period).map_err(|e| format!("`{t}`: {e}"))?,
    };
    Rate::new(count, nanos).map_err(|e| format!("`{t}`: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("300ms").unwrap(), Nanos::from_millis(300));
        assert_eq!(parse_duration("1s").unwrap(), Nanos::SECOND);
        assert_eq!(parse_duration("5m").unwrap(), Nanos::from_secs(300));
        assert_eq!(parse_duration("1h").unwrap(), Nanos::from_secs(3600));
        assert_eq!(parse_duration("1d").unwrap(), Nanos::from_secs(86_400));
        assert_eq!(parse_duration("1.5s").unwrap(), Nanos::from_millis(1500));
        assert_eq!(parse_duration("1h30m").unwrap(), Nanos::from_secs(5400));
        assert_eq!(parse_duration("0s").unwrap(), Nanos::ZERO);
        assert!(parse_duration("10").unwrap_err().contains("no unit"));
        assert!(parse_duration("3fortnights")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(parse_duration("0.5ns").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("99999999999d")
            .unwrap_err()
            .contains("too long"));
    }

    #[test]
    fn rates() {
        let r = parse_rate("10/s").unwrap();
        assert_eq!((r.count(), r.period()), (10, Nanos::SECOND));
        assert_eq!(
            parse_rate("100/min").unwrap().period(),
            Nanos::from_secs(60)
        );
        assert_eq!(
            parse_rate("5000/300s").unwrap().period(),
            Nanos::from_secs(300)
        );
        assert_eq!(
            parse_rate("1/250ms").unwrap().interval(),
            Nanos::from_millis(250)
        );
        assert_eq!(
            parse_rate("10/d").unwrap().period(),
            Nanos::from_secs(86_400)
        );
        assert_eq!(
            parse_rate("10/w").unwrap().period(),
            Nanos::from_secs(604_800)
        );
        assert_eq!(parse_rate("10/ms").unwrap().period(), Nanos::from_millis(1));
        assert!(parse_rate("10/fortnight")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(parse_rate("0/s").unwrap_err().contains("at least 1"));
        assert!(parse_rate("ten/s").is_err());
        assert!(parse_rate("10").is_err());
        assert!(parse_rate("5000000000/s")
            .unwrap_err()
            .contains("nanosecond"));
    }
}
