//! Compares what a command printed with what the page shows.
//!
//! Exact, except where a run cannot repeat itself: a line `...` stands for
//! any number of lines; JSON is compared as JSON, and a field whose value is
//! a time or a duration (`*_ns`, `*_ms`, `*_at`, `durationUntilReset`, ...)
//! only needs the same type; timestamps in text match any timestamp; and an
//! id (32 hex digits, as the server issues them) shown on the page is bound
//! to the id the run printed in its place, so a later command that uses the
//! page's id is given the real one.

use std::collections::HashMap;

use serde_json::Value;

/// Ids the page shows, bound to the ids the run printed.
#[derive(Debug, Clone, Default)]
pub struct Ids {
    map: HashMap<String, String>,
}

impl Ids {
    /// `text` with every bound page id replaced by the run's id.
    pub fn apply(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for (page, real) in &self.map {
            out = out.replace(page.as_str(), real);
        }
        out
    }

    /// Binds `page` to `real`, or checks the binding made earlier.
    fn bind(&mut self, page: &str, real: &str) -> bool {
        if !is_id(real) {
            return false;
        }
        match self.map.get(page) {
            Some(bound) => bound == real,
            None => {
                self.map.insert(page.to_owned(), real.to_owned());
                true
            }
        }
    }
}

/// Whether `s` looks like an id the server issues: 32 lowercase hex digits.
fn is_id(s: &str) -> bool {
    s.len() == 32
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Whether a JSON field's value changes from run to run.
fn volatile(key: &str) -> bool {
    key.ends_with("_ns")
        || key.ends_with("_ms")
        || key.ends_with("_at")
        || matches!(
            key,
            "durationUntilReset" | "uptime" | "elapsed" | "commit" | "server_id" | "pid"
        )
}

/// Matches `actual` against the page's `expected` lines. On success `ids`
/// holds the bindings made; on failure the error says where it went wrong.
pub fn output(expected: &[String], actual: &str, ids: &mut Ids) -> Result<(), String> {
    let actual: Vec<&str> = actual.lines().map(str::trim_end).collect();
    let mut actual = &actual[..];
    while actual.last().is_some_and(|l| l.is_empty()) {
        actual = &actual[..actual.len() - 1];
    }
    let expected: Vec<&str> = expected.iter().map(|l| l.trim_end()).collect();
    // A pretty-printed JSON document is compared whole.
    if !expected.iter().any(|l| l.trim() == "...") {
        if let (Ok(e), Ok(a)) = (
            serde_json::from_str::<Value>(&expected.join("\n")),
            serde_json::from_str::<Value>(&actual.join("\n")),
        ) {
            if e.is_object() || e.is_array() {
                let mut trial = ids.clone();
                return json(&e, &a, None, &mut trial).map(|()| *ids = trial);
            }
        }
    }
    let mut trial = ids.clone();
    if lines(&expected, actual, &mut trial) {
        *ids = trial;
        Ok(())
    } else {
        Err(first_difference(&expected, actual, ids))
    }
}

/// Line-by-line match with `...` as a wildcard, backtracking over where
/// each wildcard ends.
fn lines(expected: &[&str], actual: &[&str], ids: &mut Ids) -> bool {
    match expected.split_first() {
        None => actual.is_empty(),
        Some((e, rest)) if e.trim() == "..." => {
            for skip in 0..=actual.len() {
                let mut trial = ids.clone();
                if lines(rest, &actual[skip..], &mut trial) {
                    *ids = trial;
                    return true;
                }
            }
            false
        }
        Some((e, rest)) => {
            let Some((a, actual_rest)) = actual.split_first() else {
                return false;
            };
            let mut trial = ids.clone();
            if line(e, a, &mut trial) && lines(rest, actual_rest, &mut trial) {
                *ids = trial;
                true
            } else {
                false
            }
        }
    }
}

/// The first line that differs, for the failure message.
fn first_difference(expected: &[&str], actual: &[&str], ids: &Ids) -> String {
    let mut ids = ids.clone();
    for (n, e) in expected.iter().enumerate() {
        if e.trim() == "..." {
            break;
        }
        match actual.get(n) {
            None => return format!("output ends before the page's line {}: {e}", n + 1),
            Some(a) => {
                let mut why = String::new();
                if !line_why(e, a, &mut ids, &mut why) {
                    return format!("line {} differs{why}\n  page: {e}\n  run:  {a}", n + 1);
                }
            }
        }
    }
    format!(
        "the output does not match\n--- page ---\n{}\n--- run ---\n{}",
        expected.join("\n"),
        actual.join("\n")
    )
}

fn line(expected: &str, actual: &str, ids: &mut Ids) -> bool {
    line_why(expected, actual, ids, &mut String::new())
}

fn line_why(expected: &str, actual: &str, ids: &mut Ids, why: &mut String) -> bool {
    let e = expected.trim_start();
    if e.starts_with('{') || e.starts_with('[') {
        if let (Ok(ev), Ok(av)) = (
            serde_json::from_str::<Value>(e),
            serde_json::from_str::<Value>(actual.trim_start()),
        ) {
            return match json(&ev, &av, None, ids) {
                Ok(()) => true,
                Err(e) => {
                    *why = format!(" ({e})");
                    false
                }
            };
        }
    }
    text(expected, actual, ids)
}

/// Text equality after masking timestamps and binding ids; a `…` in the
/// page's line stands for any text.
fn text(expected: &str, actual: &str, ids: &mut Ids) -> bool {
    let (e, e_ids) = mask(expected);
    let (a, a_ids) = mask(actual);
    elided(&e, &a)
        && e_ids.len() == a_ids.len()
        && e_ids.iter().zip(&a_ids).all(|(p, r)| ids.bind(p, r))
}

/// Whether `actual` reads as `expected` with each `…` of it standing for
/// any text (none: plain equality).
fn elided(expected: &str, actual: &str) -> bool {
    let mut pieces = expected.split('…');
    let first = pieces.next().unwrap_or("");
    let Some(mut rest) = actual.strip_prefix(first) else {
        return false;
    };
    let pieces: Vec<&str> = pieces.collect();
    let Some((last, middle)) = pieces.split_last() else {
        return rest.is_empty();
    };
    for piece in middle {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// `s` with timestamps replaced by `<time>`, measured durations by
/// `<duration>`, short commit hashes after `commit ` by `<commit>`, and
/// ids by `<id>`; the ids, in order.
fn mask(s: &str) -> (String, Vec<String>) {
    let mut out = String::new();
    let mut ids = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if let Some(n) = timestamp(&b[i..]) {
            out.push_str("<time>");
            i += n;
            continue;
        }
        let boundary = i == 0 || !b[i - 1].is_ascii_alphanumeric();
        if boundary
            && b.len() - i >= 32
            // Hex digits are ASCII, so the slice below is on char boundaries.
            && b[i..i + 32].iter().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
            && b.get(i + 32).is_none_or(|c| !c.is_ascii_alphanumeric())
        {
            ids.push(s[i..i + 32].to_owned());
            out.push_str("<id>");
            i += 32;
            continue;
        }
        if boundary {
            if let Some(n) = measured(&b[i..]) {
                out.push_str("<duration>");
                i += n;
                continue;
            }
        }
        if s[i..].starts_with("commit ") {
            let hex = s[i + 7..].bytes().take_while(u8::is_ascii_hexdigit).count();
            if hex >= 7 {
                out.push_str("commit <commit>");
                i += 7 + hex;
                continue;
            }
        }
        let c = s[i..].chars().next().unwrap_or(' ');
        out.push(c);
        i += c.len_utf8();
    }
    (out, ids)
}

/// The length of a measured duration at the start of `b`: a number with
/// a fraction and a unit (`5.572s`, `38.1ms`), as uptimes and latencies
/// are printed. Durations of a config are whole (`10s`, `1m30s`) and are
/// compared as written.
fn measured(b: &[u8]) -> Option<usize> {
    let whole = b.iter().take_while(|c| c.is_ascii_digit()).count();
    if whole == 0 || b.get(whole) != Some(&b'.') {
        return None;
    }
    let frac = b[whole + 1..]
        .iter()
        .take_while(|c| c.is_ascii_digit())
        .count();
    if frac == 0 {
        return None;
    }
    let n = whole + 1 + frac;
    let unit = ["ns", "µs", "us", "ms", "s"]
        .iter()
        .find(|u| b[n..].starts_with(u.as_bytes()))?;
    let end = n + unit.len();
    b.get(end)
        .is_none_or(|c| !c.is_ascii_alphanumeric())
        .then_some(end)
}

/// The length of an RFC 3339 UTC timestamp at the start of `b`
/// (`2026-11-26T18:39:14.123456Z`).
fn timestamp(b: &[u8]) -> Option<usize> {
    let digits =
        |r: std::ops::Range<usize>| r.clone().all(|k| b.get(k).is_some_and(u8::is_ascii_digit));
    let at = |k: usize, c: u8| b.get(k) == Some(&c);
    if !(digits(0..4)
        && at(4, b'-')
        && digits(5..7)
        && at(7, b'-')
        && digits(8..10)
        && at(10, b'T'))
    {
        return None;
    }
    if !(digits(11..13) && at(13, b':') && digits(14..16) && at(16, b':') && digits(17..19)) {
        return None;
    }
    let mut n = 19;
    if at(n, b'.') {
        n += 1;
        while b.get(n).is_some_and(u8::is_ascii_digit) {
            n += 1;
        }
    }
    at(n, b'Z').then_some(n + 1)
}

/// Structural JSON match (see the module doc).
fn json(expected: &Value, actual: &Value, key: Option<&str>, ids: &mut Ids) -> Result<(), String> {
    let here = || key.map_or_else(String::new, |k| format!("`{k}`: "));
    if key.is_some_and(volatile) {
        let same = std::mem::discriminant(expected) == std::mem::discriminant(actual);
        return if same {
            Ok(())
        } else {
            Err(format!(
                "{}expected a value like {expected}, got {actual}",
                here()
            ))
        };
    }
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => {
            let ek: Vec<_> = e.keys().collect();
            let ak: Vec<_> = a.keys().collect();
            if ek != ak {
                return Err(format!(
                    "{}fields {ek:?} on the page, {ak:?} in the run",
                    here()
                ));
            }
            for (k, ev) in e {
                json(ev, &a[k.as_str()], Some(k), ids)?;
            }
            Ok(())
        }
        (Value::Array(e), Value::Array(a)) => {
            if e.len() != a.len() {
                return Err(format!(
                    "{}{} items on the page, {} in the run",
                    here(),
                    e.len(),
                    a.len()
                ));
            }
            for (ev, av) in e.iter().zip(a) {
                json(ev, av, key, ids)?;
            }
            Ok(())
        }
        (Value::String(e), Value::String(a)) if is_id(e) => {
            if ids.bind(e, a) {
                Ok(())
            } else {
                Err(format!("{}id {e} on the page, {a} in the run", here()))
            }
        }
        (Value::String(e), Value::String(a)) => {
            if text(e, a, ids) {
                Ok(())
            } else {
                Err(format!("{}{e:?} on the page, {a:?} in the run", here()))
            }
        }
        (Value::Number(e), Value::Number(a)) if e.as_f64() == a.as_f64() => Ok(()),
        (e, a) if e == a => Ok(()),
        (e, a) => Err(format!("{}{e} on the page, {a} in the run", here())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(lines: &str) -> Vec<String> {
        lines.lines().map(str::to_owned).collect()
    }

    #[test]
    fn wildcards_ids_and_volatile_fields() {
        let mut ids = Ids::default();
        let expected = page(
            "head\n...\n{\"hold_id\":\"89f1ec3122be400d9597b81eaacc7a5b\",\"expires_at_ms\":1,\"n\":2}\ntail",
        );
        let actual = "head\nx\ny\n{\"hold_id\":\"0123456789abcdef0123456789abcdef\",\"expires_at_ms\":99,\"n\":2}\ntail\n\n";
        output(&expected, actual, &mut ids).unwrap();
        assert_eq!(
            ids.apply("DELETE /v1/holds/89f1ec3122be400d9597b81eaacc7a5b"),
            "DELETE /v1/holds/0123456789abcdef0123456789abcdef"
        );
        // The same page id later must be the same run id.
        let again = page("released 89f1ec3122be400d9597b81eaacc7a5b");
        assert!(output(
            &again,
            "released ffffffffffffffffffffffffffffffff",
            &mut ids
        )
        .is_err());
        output(
            &again,
            "released 0123456789abcdef0123456789abcdef",
            &mut ids,
        )
        .unwrap();
    }

    #[test]
    fn differences_are_found() {
        let mut ids = Ids::default();
        let e = page("{\"allowed\":true,\"remaining\":99}");
        let err = output(&e, "{\"allowed\":true,\"remaining\":98}", &mut ids).unwrap_err();
        assert!(err.contains("remaining"), "{err}");
        assert!(output(&e, "{\"allowed\":true}", &mut ids).is_err());
        assert!(output(&page("a\nb"), "a\nb\nc", &mut ids).is_err());
        assert!(output(&page("a\n...\nc"), "a\nb", &mut ids).is_err());
        assert!(output(&page("ok"), "ok", &mut ids).is_ok());
    }

    #[test]
    fn timestamps_and_pretty_json() {
        let mut ids = Ids::default();
        let e = page("2026-11-20T10:00:00.000001Z  INFO tollgate listening grpc=127.0.0.1:8081");
        output(
            &e,
            "2026-11-26T18:39:14.123456Z  INFO tollgate listening grpc=127.0.0.1:8081",
            &mut ids,
        )
        .unwrap();
        let e = page("{\n  \"status\": \"SERVING\"\n}");
        output(&e, "{\"status\":\"SERVING\"}", &mut ids).unwrap();
        output(&page("uptime     5.572s"), "uptime     38.1ms", &mut ids).unwrap();
        assert!(output(&page("window 10s"), "window 20s", &mut ids).is_err());
        output(&page("uptime     …"), "uptime     60ms", &mut ids).unwrap();
        output(&page("a … c … e"), "a b c d e", &mut ids).unwrap();
        assert!(output(&page("a … c"), "a b d", &mut ids).is_err());
        assert!(output(&page("a…"), "b", &mut ids).is_err());
        // Text that is not ASCII next to where an id could start.
        assert!(output(&page("é0123456789abcdef0123456789abcdeé"), "x", &mut ids).is_err());
        assert!(output(&e, "{\"status\":\"NOT_SERVING\"}", &mut ids).is_err());
    }
}
