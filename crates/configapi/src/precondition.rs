//! Optimistic concurrency: every read names the revision its target was
//! last changed at (in the body and as the `ETag` `"N"`), and a write may
//! say which revision it was made against (`If-Match: "N"`). The store
//! checks that inside the change's transaction, after the revision bump
//! has serialized writers, so of two writers that read the same revision
//! exactly one wins and the other gets `412 Precondition Failed` with
//! what is there now, instead of silently overwriting it (a lost update).
//!
//! The target of a precondition is what the write's path names at the
//! granularity the API keeps revisions: a namespace (changed by its flags
//! and by any change to its resources), or a resource (its overrides,
//! groups and members are part of it, so a write to an override carries
//! the resource's revision).

use axum::http::{header, HeaderMap};

use crate::error::ApiError;

/// The most entity tags one `If-Match` may list.
const MAX_TAGS: usize = 32;

/// What a write requires of its target.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Precondition {
    /// Nothing: the write applies to whatever is there (and creates).
    #[default]
    None,
    /// `If-Match: "N", ...`: the target exists and was last changed at one
    /// of these revisions. Weak tags (`W/"N"`) are left out: a write's
    /// comparison is strong (RFC 9110 §13.1.1), so they never match, and
    /// a list of weak tags alone is empty here and matches nothing (412).
    Revision(Vec<i64>),
    /// `If-Match: *`: the target exists.
    Exists,
    /// `If-None-Match: *`: the target does not exist (create only).
    Absent,
}

/// The `ETag` of something last changed at `revision`.
pub fn etag(revision: i64) -> String {
    format!("\"{revision}\"")
}

impl Precondition {
    /// The precondition of a request's headers; a malformed one is a 400
    /// naming the header.
    pub fn from_headers(headers: &HeaderMap) -> Result<Precondition, ApiError> {
        let text = |name: &header::HeaderName| -> Result<Option<String>, ApiError> {
            let mut values = headers.get_all(name).iter();
            let Some(first) = values.next() else {
                return Ok(None);
            };
            let mut joined = first
                .to_str()
                .map_err(|_| ApiError::malformed(format!("{name} is not ASCII text")))?
                .to_owned();
            for v in values {
                let v = v
                    .to_str()
                    .map_err(|_| ApiError::malformed(format!("{name} is not ASCII text")))?;
                joined.push(',');
                joined.push_str(v);
            }
            Ok(Some(joined))
        };
        let if_match = text(&header::IF_MATCH)?;
        let if_none_match = text(&header::IF_NONE_MATCH)?;
        match (if_match, if_none_match) {
            (Some(_), Some(_)) => Err(ApiError::malformed(
                "give If-Match or If-None-Match, not both",
            )),
            (None, None) => Ok(Precondition::None),
            (None, Some(v)) if v.trim() == "*" => Ok(Precondition::Absent),
            (None, Some(v)) => Err(ApiError::malformed(tollgate_core::message::bounded(
                format!(
                    "If-None-Match on a write takes only `*` (create, never replace), not {v:?}"
                ),
            ))),
            (Some(v), None) if v.trim() == "*" => Ok(Precondition::Exists),
            (Some(v), None) => {
                let mut revisions = Vec::new();
                let mut tags = 0;
                // RFC 9110 §5.6.1: empty list elements are skipped, and
                // whitespace around elements is allowed.
                for tag in v.split(',').map(str::trim).filter(|t| !t.is_empty()) {
                    tags += 1;
                    if tags > MAX_TAGS {
                        return Err(ApiError::malformed(format!(
                            "If-Match lists more than {MAX_TAGS} entity tags"
                        )));
                    }
                    if let Some(n) = parse_tag(tag)? {
                        revisions.push(n);
                    }
                }
                if tags == 0 {
                    return Err(ApiError::malformed(
                        "If-Match: it lists no entity tag; give the ETag a read answered (\"N\")",
                    ));
                }
                Ok(Precondition::Revision(revisions))
            }
        }
    }

    /// Checks the target `what` (for messages), whose revision is
    /// `current` (`None`: it does not exist; `deleted_at`: the revision
    /// that deleted it, when known).
    pub fn check(
        &self,
        what: &str,
        current: Option<i64>,
        deleted_at: Option<i64>,
    ) -> Result<(), ApiError> {
        let gone = || {
            let when = deleted_at.map_or(String::new(), |r| format!(" (deleted at revision {r})"));
            ApiError::precondition(format!(
                "{what} no longer exists{when}; the change was not made (nothing is re-created \
                 under If-Match)"
            ))
        };
        match (self, current) {
            (Precondition::None, _) => Ok(()),
            (Precondition::Exists, Some(_)) | (Precondition::Absent, None) => Ok(()),
            (Precondition::Exists | Precondition::Revision(_), None) => Err(gone()),
            (Precondition::Absent, Some(now)) => Err(ApiError::precondition(format!(
                "{what} already exists (revision {now}); the change was not made \
                 (If-None-Match: * only creates)"
            ))),
            (Precondition::Revision(tags), Some(now)) if tags.contains(&now) => Ok(()),
            (Precondition::Revision(tags), Some(now)) if tags.is_empty() => {
                Err(ApiError::precondition(format!(
                    "If-Match held only weak entity tags (W/\"N\"), which never match a write \
                     (strong comparison, RFC 9110); {what} is at revision {now}: send \"{now}\" \
                     if that is what you read"
                )))
            }
            (Precondition::Revision(tags), Some(now)) => {
                let sent: Vec<String> = tags.iter().map(|t| t.to_string()).collect();
                Err(ApiError::precondition(format!(
                    "{what} changed since revision {} (it is at revision {now} now); the change \
                     was not made: read it again and make the change on what is there",
                    sent.join(", ")
                )))
            }
        }
    }
}

/// One entity tag: `"N"` is revision N; a weak `W/"..."` is `None`: it
/// never matches a write's strong comparison (RFC 9110 §13.1.1), so the
/// write is refused with 412 as for any tag that does not match.
fn parse_tag(tag: &str) -> Result<Option<i64>, ApiError> {
    let refused = |why: &str| {
        Err(ApiError::malformed(tollgate_core::message::bounded(
            format!(
                "If-Match: {why}; give the ETag a read answered (\"N\", N the revision), not {tag:?}"
            ),
        )))
    };
    let quoted = |t: &str| {
        t.len() >= 2 && t.starts_with('"') && t.ends_with('"') && !t[1..t.len() - 1].contains('"')
    };
    if let Some(weak) = tag.strip_prefix("W/") {
        if !quoted(weak) {
            return refused("an entity tag is quoted");
        }
        return Ok(None);
    }
    let Some(inner) = tag.strip_prefix('"').and_then(|t| t.strip_suffix('"')) else {
        return refused("an entity tag is quoted");
    };
    // Only the digits this API writes: `"007"` or `"+7"` is not the tag
    // `"7"` (entity tags compare as strings, RFC 9110 §8.8.3.2), so it is
    // refused rather than read as the number it spells.
    let canonical = !inner.is_empty()
        && inner.bytes().all(|b| b.is_ascii_digit())
        && (inner == "0" || !inner.starts_with('0'));
    match inner.parse::<i64>() {
        Ok(n) if n >= 0 && canonical => Ok(Some(n)),
        _ => refused("this API's entity tags are revisions, in digits without leading zeros"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(k.clone(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn headers_parse_into_preconditions() {
        let p = |pairs: &[(header::HeaderName, &str)]| Precondition::from_headers(&headers(pairs));
        assert_eq!(p(&[]).unwrap(), Precondition::None);
        assert_eq!(
            p(&[(header::IF_MATCH, "\"12\"")]).unwrap(),
            Precondition::Revision(vec![12])
        );
        assert_eq!(
            p(&[
                (header::IF_MATCH, "\"1\", \"2\""),
                (header::IF_MATCH, "\"3\"")
            ])
            .unwrap(),
            Precondition::Revision(vec![1, 2, 3])
        );
        assert_eq!(p(&[(header::IF_MATCH, "*")]).unwrap(), Precondition::Exists);
        assert_eq!(
            p(&[(header::IF_NONE_MATCH, "*")]).unwrap(),
            Precondition::Absent
        );
        // Review: empty elements are skipped and whitespace allowed
        // (RFC 9110 §5.6.1); a weak tag is no match, not an error.
        assert_eq!(
            p(&[(header::IF_MATCH, " , \"4\" ,, W/\"5\" ,")]).unwrap(),
            Precondition::Revision(vec![4])
        );
        assert_eq!(
            p(&[(header::IF_MATCH, "W/\"12\"")]).unwrap(),
            Precondition::Revision(vec![])
        );
        let e = Precondition::Revision(vec![])
            .check("shop/api", Some(12), None)
            .unwrap_err();
        assert_eq!(e.status.as_u16(), 412);
        assert!(e.message.contains("weak"), "{}", e.message);
        // Second review of issue 22: "007" matched revision 7.
        for bad in [
            "12", "W/12", "\"x\"", "\"-1\"", " , ", "\"007\"", "\"+7\"", "\"-0\"", "\"00\"",
            "\" 7\"", "\"\"",
        ] {
            let e = p(&[(header::IF_MATCH, bad)]).unwrap_err();
            assert_eq!(e.reason, "malformed_request", "{bad}");
            assert!(e.message.starts_with("If-Match: "), "{}", e.message);
        }
        assert_eq!(
            p(&[(header::IF_MATCH, "\"0\", \"70\"")]).unwrap(),
            Precondition::Revision(vec![0, 70])
        );
        let many = vec!["\"1\""; 40].join(",");
        assert!(p(&[(header::IF_MATCH, &many)]).is_err());
        assert!(p(&[(header::IF_NONE_MATCH, "\"1\"")]).is_err());
        assert!(p(&[(header::IF_MATCH, "*"), (header::IF_NONE_MATCH, "*")]).is_err());
    }

    #[test]
    fn checks_say_what_changed_or_vanished() {
        let at = |r| Precondition::Revision(vec![r]);
        assert!(at(5).check("shop/api", Some(5), None).is_ok());
        let e = at(5).check("shop/api", Some(7), None).unwrap_err();
        assert_eq!((e.status.as_u16(), e.reason), (412, "precondition_failed"));
        assert!(e.message.contains("revision 7"), "{}", e.message);
        let e = at(5).check("shop/api", None, Some(9)).unwrap_err();
        assert!(
            e.message
                .contains("no longer exists (deleted at revision 9)"),
            "{}",
            e.message
        );
        assert!(Precondition::Exists.check("x", None, None).is_err());
        assert!(Precondition::Absent.check("x", Some(1), None).is_err());
        assert!(Precondition::Absent.check("x", None, None).is_ok());
        assert!(Precondition::None.check("x", None, None).is_ok());
    }
}
