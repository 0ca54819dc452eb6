//! Trace lines: recorded traffic for `tollgate replay`.
//!
//! One JSON object per line:
//! `{"time_ms": 1400, "namespace": "default", "resource": "api",
//!   "domain": "acme", "hits": 1, "min_hits": 1, "mode": "try"}`.
//! `time` is accepted for `time_ms` and `user_id` for `domain`, so the
//! thesis' exported `{"user_id", "time"}` traces replay as they are.
//! `namespace` and `resource` may be omitted when the config leaves no
//! choice; `hits` and `min_hits` default to 1; `mode` is `try` or `acquire`.
//! As an extension, `descriptors` (a list of `{key, value}` entries, or a
//! list of such lists) replays envoyproxy/ratelimit traffic.
//! The server's decision log (`tollgate serve --decision-log`) writes this
//! format with two more fields, `surface` and `decision` (what was
//! answered), which a replay ignores: it decides every line afresh.
//!
//! Times are milliseconds, integral or fractional; they are kept to the
//! microsecond.

use serde::Deserialize;
use tollgate_config::model::{EnvoyLimit, EnvoyUnit};
use tollgate_core::{Mode, Nanos};

/// One parsed trace line.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// When, in nanoseconds (microsecond precision).
    pub time: Nanos,
    /// The namespace, if given.
    pub namespace: Option<String>,
    /// The resource, if given.
    pub resource: Option<String>,
    /// The domain (empty for descriptor events).
    pub domain: String,
    /// Hits wanted.
    pub hits: u64,
    /// Fewest useful.
    pub min_hits: u64,
    /// Try or acquire.
    pub mode: Mode,
    /// envoyproxy/ratelimit descriptors, if given.
    pub descriptors: Option<Vec<Vec<(String, String)>>>,
    /// The limit the request brought of its own (`limit`), if any.
    pub limit: Option<EnvoyLimit>,
    /// Per descriptor, the limit it brought of its own (Envoy's
    /// descriptor `limit`); empty when none did.
    pub descriptor_limits: Vec<Option<EnvoyLimit>>,
    /// Per descriptor, hits of its own (Envoy's descriptor-level
    /// `hits_addend`) in place of `hits`; empty when none has.
    pub descriptor_hits: Vec<Option<u64>>,
    /// Per descriptor, whether it gives its hits back (Envoy's
    /// `is_negative_hits` on some descriptors of a request); empty when
    /// none does.
    pub descriptor_refunds: Vec<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    #[serde(alias = "time")]
    time_ms: Option<serde_json::Number>,
    namespace: Option<String>,
    resource: Option<String>,
    #[serde(alias = "user_id")]
    domain: Option<Scalar>,
    hits: Option<u64>,
    min_hits: Option<u64>,
    mode: Option<String>,
    descriptors: Option<Descriptors>,
    limit: Option<RawLimit>,
    descriptor_limits: Option<Vec<Option<RawLimit>>>,
    descriptor_hits: Option<Vec<Option<u64>>>,
    descriptor_refunds: Option<Vec<bool>>,
    // What a decision-log line also records; a replay decides afresh.
    #[allow(dead_code)]
    surface: Option<serde::de::IgnoredAny>,
    #[allow(dead_code)]
    decision: Option<serde::de::IgnoredAny>,
}

/// A limit a request brought (`{"requests_per_unit": 5, "unit": "hour"}`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    requests_per_unit: u64,
    unit: String,
}

impl RawLimit {
    /// As the limiter takes it; `field` names it in the error.
    fn limit(self, field: &str) -> Result<EnvoyLimit, String> {
        let unit = EnvoyUnit::parse(&self.unit).ok_or_else(|| {
            format!(
                "`{field}.unit` {:?} is not a unit (expected second, minute, hour, day, week, month or year)",
                self.unit.chars().take(32).collect::<String>()
            )
        })?;
        Ok(EnvoyLimit {
            requests_per_unit: self.requests_per_unit,
            unit,
        })
    }
}

/// A string or a number (thesis traces carry numeric user ids).
#[derive(Deserialize)]
#[serde(untagged)]
enum Scalar {
    Text(String),
    Number(serde_json::Number),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Descriptors {
    One(Vec<Entry>),
    Many(Vec<Vec<Entry>>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    key: String,
    #[serde(default)]
    value: String,
}

/// Parses one trace line; the error says what is wrong.
pub fn parse(line: &str) -> Result<Event, String> {
    let raw: Raw = serde_json::from_str(line).map_err(|e| e.to_string())?;
    let time = match raw.time_ms {
        None => return Err("missing field `time_ms` (or `time`)".into()),
        Some(n) => millis_to_nanos(&n)?,
    };
    let descriptors = raw.descriptors.map(|d| {
        let lists = match d {
            Descriptors::One(entries) => vec![entries],
            Descriptors::Many(lists) => lists,
        };
        lists
            .into_iter()
            .map(|l| l.into_iter().map(|e| (e.key, e.value)).collect())
            .collect::<Vec<Vec<(String, String)>>>()
    });
    if let Some(d) = &descriptors {
        if d.is_empty() || d.iter().any(Vec::is_empty) {
            return Err(
                "`descriptors` must hold at least one descriptor of at least one entry".into(),
            );
        }
    }
    let domain = match raw.domain {
        Some(Scalar::Text(s)) => s,
        Some(Scalar::Number(n)) => n.to_string(),
        None if descriptors.is_some() => String::new(),
        None => return Err("missing field `domain` (or `user_id`)".into()),
    };
    let hits = raw.hits.unwrap_or(1);
    let min_hits = raw.min_hits.unwrap_or(hits.min(1));
    if min_hits > hits {
        return Err(format!(
            "`min_hits` ({min_hits}) is greater than `hits` ({hits})"
        ));
    }
    let mode = match raw.mode.as_deref() {
        None | Some("try") => Mode::Try,
        Some("acquire") => Mode::Acquire,
        Some("report") => Mode::Report,
        Some("refund") => Mode::Refund,
        Some(other) => {
            return Err(format!(
                "unknown mode `{other}` (expected `try`, `acquire`, `report` or `refund`)"
            ))
        }
    };
    let limit = match raw.limit {
        None => None,
        Some(_) if descriptors.is_some() => {
            return Err(
                "`limit` is a resource request's; a descriptor event cannot bring one".into(),
            )
        }
        Some(l) => Some(l.limit("limit")?),
    };
    let descriptor_limits = match (raw.descriptor_limits, &descriptors) {
        (None, _) => Vec::new(),
        (Some(_), None) => {
            return Err("`descriptor_limits` needs `descriptors`".into());
        }
        (Some(limits), Some(d)) if limits.len() != d.len() => {
            return Err(format!(
                "`descriptor_limits` has {} entries for {} descriptors",
                limits.len(),
                d.len()
            ));
        }
        (Some(limits), Some(_)) => limits
            .into_iter()
            .map(|l| l.map(|l| l.limit("descriptor_limits")).transpose())
            .collect::<Result<_, _>>()?,
    };
    let descriptor_hits = per_descriptor("descriptor_hits", raw.descriptor_hits, &descriptors)?;
    let descriptor_refunds =
        per_descriptor("descriptor_refunds", raw.descriptor_refunds, &descriptors)?;
    if !descriptor_refunds.is_empty() && mode != Mode::Try {
        return Err(format!(
            "`descriptor_refunds` marks refunds among the checks of a `try` event, not a `{}` one",
            mode.as_str()
        ));
    }
    Ok(Event {
        time,
        namespace: raw.namespace,
        resource: raw.resource,
        domain,
        hits,
        min_hits,
        mode,
        descriptors,
        limit,
        descriptor_limits,
        descriptor_hits,
        descriptor_refunds,
    })
}

/// A per-descriptor list `field` of an event: one entry per descriptor,
/// only with `descriptors`; empty when absent.
fn per_descriptor<T>(
    field: &str,
    list: Option<Vec<T>>,
    descriptors: &Option<Vec<Vec<(String, String)>>>,
) -> Result<Vec<T>, String> {
    match (list, descriptors) {
        (None, _) => Ok(Vec::new()),
        (Some(_), None) => Err(format!("`{field}` needs `descriptors`")),
        (Some(list), Some(d)) if list.len() != d.len() => Err(format!(
            "`{field}` has {} entries for {} descriptors",
            list.len(),
            d.len()
        )),
        (Some(list), Some(_)) => Ok(list),
    }
}

fn millis_to_nanos(n: &serde_json::Number) -> Result<Nanos, String> {
    if let Some(ms) = n.as_u64() {
        return ms
            .checked_mul(1_000_000)
            .map(Nanos::new)
            .ok_or_else(|| format!("`time_ms` {ms} is too large"));
    }
    match n.as_f64() {
        Some(ms) if ms.is_finite() && ms >= 0.0 => {
            let micros = (ms * 1000.0).round();
            if micros >= (u64::MAX / 1000) as f64 {
                return Err(format!("`time_ms` {ms} is too large"));
            }
            Ok(Nanos::from_micros(micros as u64))
        }
        _ => Err(format!(
            "`time_ms` must be a number of milliseconds >= 0, found {n}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_line() {
        let e = parse(r#"{"time_ms": 1400, "namespace": "default", "resource": "api", "domain": "acme", "hits": 3, "min_hits": 2, "mode": "acquire"}"#).unwrap();
        assert_eq!(e.time, Nanos::from_millis(1400));
        assert_eq!((e.hits, e.min_hits, e.mode), (3, 2, Mode::Acquire));
        assert_eq!(e.domain, "acme");
    }

    /// Issue 18 item 3: a decision log's report and refund lines replay.
    #[test]
    fn report_and_refund_lines() {
        for (name, mode) in [("report", Mode::Report), ("refund", Mode::Refund)] {
            let line = format!(r#"{{"time_ms": 1, "domain": "a", "hits": 9, "mode": "{name}"}}"#);
            assert_eq!(parse(&line).unwrap().mode, mode);
        }
        let err = parse(r#"{"time_ms": 1, "domain": "a", "mode": "later"}"#).unwrap_err();
        assert!(err.contains("`report` or `refund`"), "{err}");
    }

    #[test]
    fn thesis_export_format() {
        let e = parse(r#"{"user_id": 42, "time": 12.345}"#).unwrap();
        assert_eq!(e.domain, "42");
        assert_eq!(e.time, Nanos::from_micros(12_345));
        assert_eq!((e.hits, e.min_hits, e.mode), (1, 1, Mode::Try));
    }

    #[test]
    fn descriptors_one_or_many() {
        let e = parse(r#"{"time_ms": 0, "descriptors": [{"key": "a", "value": "1"}]}"#).unwrap();
        assert_eq!(e.descriptors, Some(vec![vec![("a".into(), "1".into())]]));
        let e = parse(
            r#"{"time_ms": 0, "descriptors": [[{"key": "a"}], [{"key": "b", "value": "2"}]]}"#,
        )
        .unwrap();
        assert_eq!(e.descriptors.unwrap().len(), 2);
    }

    #[test]
    fn errors_say_what_is_wrong() {
        assert!(parse("{").unwrap_err().contains("EOF"));
        assert!(parse(r#"{"domain": "a"}"#).unwrap_err().contains("time_ms"));
        assert!(parse(r#"{"time_ms": 1}"#).unwrap_err().contains("domain"));
        assert!(parse(r#"{"time_ms": -1, "domain": "a"}"#)
            .unwrap_err()
            .contains(">= 0"));
        assert!(parse(r#"{"time_ms": 1, "domain": "a", "hit": 2}"#)
            .unwrap_err()
            .contains("unknown field `hit`"));
        assert!(
            parse(r#"{"time_ms": 1, "domain": "a", "hits": 1, "min_hits": 2}"#)
                .unwrap_err()
                .contains("greater")
        );
        assert!(parse(r#"{"time_ms": 1, "domain": "a", "mode": "wait"}"#)
            .unwrap_err()
            .contains("unknown mode"));
        assert!(parse(r#"{"time_ms": 1e300, "domain": "a"}"#)
            .unwrap_err()
            .contains("too large"));
        assert!(parse(r#"{"time_ms": 1, "descriptors": []}"#)
            .unwrap_err()
            .contains("at least one"));
        assert!(parse(r#"{"time_ms": 1, "descriptors": [[]]}"#)
            .unwrap_err()
            .contains("at least one"));
    }
}
