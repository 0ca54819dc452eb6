//! JSON forms of the proto enums: names (`"acquire"`, `"hard"`) rather
//! than numbers, for the HTTP API.

use std::borrow::Cow;

use serde::{Deserialize, Deserializer, Serializer};

use crate::v1::{LimitedBy, Mode};
use crate::RateRequestView;

/// A `RateRequest` JSON body read without copying its strings, for the
/// HTTP API's decision path (three `String`s a request otherwise): the
/// same fields, defaults and refusals as [`crate::v1::RateRequest`]'s
/// serde form, which a proptest holds it to. A string with escapes is
/// unescaped into an owned one, as it must be.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RateRequestJson<'a> {
    /// `namespace`.
    #[serde(borrow)]
    pub namespace: Cow<'a, str>,
    /// `resource`.
    #[serde(borrow)]
    pub resource: Cow<'a, str>,
    /// `domain`.
    #[serde(borrow)]
    pub domain: Cow<'a, str>,
    /// `hits`.
    pub hits: Option<u64>,
    /// `min_hits`.
    pub min_hits: Option<u64>,
    /// `mode`, by name.
    #[serde(deserialize_with = "mode::deserialize")]
    pub mode: i32,
    /// `limit`: a limit of the request's own.
    pub limit: Option<crate::v1::LimitOverride>,
}

impl RateRequestJson<'_> {
    /// Its fields, borrowed.
    pub fn view(&self) -> RateRequestView<'_> {
        RateRequestView {
            namespace: &self.namespace,
            resource: &self.resource,
            domain: &self.domain,
            hits: self.hits,
            min_hits: self.min_hits,
            mode: self.mode,
            limit: self
                .limit
                .as_ref()
                .map(|l| (l.requests_per_unit, l.unit.as_str())),
        }
    }
}

/// `mode`: `"try"`, `"acquire"`, `"report"` or `"refund"`.
pub mod mode {
    use super::*;

    /// Writes the name.
    pub fn serialize<S: Serializer>(value: &i32, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match Mode::try_from(*value) {
            Ok(Mode::Acquire) => "acquire",
            Ok(Mode::Report) => "report",
            Ok(Mode::Refund) => "refund",
            _ => "try",
        })
    }

    /// Reads a name; anything else names the accepted ones.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
        let name = String::deserialize(d)?;
        match name.as_str() {
            "try" => Ok(Mode::Try as i32),
            "acquire" => Ok(Mode::Acquire as i32),
            "report" => Ok(Mode::Report as i32),
            "refund" => Ok(Mode::Refund as i32),
            other => Err(serde::de::Error::custom(format!(
                "unknown mode `{other}`: expected `try`, `acquire`, `report` or `refund`"
            ))),
        }
    }
}

/// `limited_by`: `null`, `"limit"`, `"tier"`, `"hard"`, `"global"` or
/// `"deny"`.
pub mod limited_by {
    use super::*;

    const NAMES: [(LimitedBy, &str); 5] = [
        (LimitedBy::Limit, "limit"),
        (LimitedBy::Tier, "tier"),
        (LimitedBy::Hard, "hard"),
        (LimitedBy::Global, "global"),
        (LimitedBy::Deny, "deny"),
    ];

    /// The name of `value`, or `None` for none (or a number the proto
    /// does not define).
    pub fn name(value: i32) -> Option<&'static str> {
        NAMES
            .iter()
            .find(|(l, _)| *l as i32 == value)
            .map(|(_, name)| *name)
    }

    /// Writes the name, or `null` for none.
    pub fn serialize<S: Serializer>(value: &i32, s: S) -> Result<S::Ok, S::Error> {
        match name(*value) {
            Some(name) => s.serialize_str(name),
            None => s.serialize_none(),
        }
    }

    /// Reads a name or `null`.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
        let name = Option::<String>::deserialize(d)?;
        let Some(name) = name else {
            return Ok(LimitedBy::None as i32);
        };
        NAMES
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(l, _)| *l as i32)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown limited_by `{name}`")))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use crate::v1::{LimitedBy, Mode, RateRequest, RateResponse};

    #[test]
    fn enums_read_and_write_as_names_and_unknown_fields_are_refused() {
        let r: RateRequest =
            serde_json::from_str(r#"{"namespace":"n","resource":"r","hits":2,"mode":"acquire"}"#)
                .unwrap();
        assert_eq!(r.mode, Mode::Acquire as i32);
        assert_eq!(r.min_hits, None);
        let bad = serde_json::from_str::<RateRequest>(r#"{"namespace":"n","hitz":2}"#);
        assert!(bad.unwrap_err().to_string().contains("hitz"));
        let bad = serde_json::from_str::<RateRequest>(r#"{"mode":"later"}"#);
        assert!(bad.unwrap_err().to_string().contains("later"));
        let resp = RateResponse {
            limited_by: LimitedBy::Hard as i32,
            ..Default::default()
        };
        let json = serde_json::to_value(&resp).unwrap();
        assert_eq!(json["limited_by"], "hard");
        let none = serde_json::to_value(RateResponse::default()).unwrap();
        assert!(none["limited_by"].is_null());
    }

    #[test]
    fn the_borrowed_body_borrows_plain_strings_and_unescapes_the_rest() {
        let text = r#"{"namespace":"n","resource":"a\/b","domain":"d","hits":2,"mode":"acquire"}"#;
        let b: super::RateRequestJson = serde_json::from_str(text).unwrap();
        let o: RateRequest = serde_json::from_str(text).unwrap();
        assert_eq!(b.view(), o.view());
        assert_eq!(b.view().resource, "a/b");
        assert!(matches!(b.namespace, std::borrow::Cow::Borrowed("n")));
        assert!(matches!(b.resource, std::borrow::Cow::Owned(_)));
        assert_eq!(b.view().min_hits_or_default(), 2);
        assert_eq!(b.view().mode, Mode::Acquire as i32);
    }

    /// serde reads a struct from an array too, by position: both forms
    /// read the same fields from the same positions.
    #[test]
    fn an_array_body_is_read_by_position_alike() {
        for text in [
            r#"["n","r","d",2,1,"acquire"]"#,
            r#"["n","r"]"#,
            r#"["try","n","r"]"#,
            r#"["n","r","d","2"]"#,
        ] {
            let o = serde_json::from_str::<RateRequest>(text);
            let b = serde_json::from_str::<super::RateRequestJson>(text);
            match (&o, &b) {
                (Ok(o), Ok(b)) => assert_eq!(o.view(), b.view(), "{text}"),
                (Err(_), Err(_)) => {}
                _ => panic!("{text}: {o:?} against {b:?}"),
            }
        }
        let b: super::RateRequestJson =
            serde_json::from_str(r#"["n","r","d",2,1,"acquire"]"#).unwrap();
        assert_eq!((b.view().domain, b.view().hits), ("d", Some(2)));
    }

    /// A JSON value of the kinds a body may hold, as text.
    fn value() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            // Strings: plain, with escapes, non-ASCII, or a mode's name.
            "[a-z0-9/._ -]{0,12}".prop_map(|s| format!("{s:?}")),
            Just(r#""a\"b\\c\n\u00e9""#.to_owned()),
            Just(r#""\ud83d\ude00""#.to_owned()),
            Just("\"é—\"".to_owned()),
            Just(r#""try""#.to_owned()),
            Just(r#""acquire""#.to_owned()),
            Just(r#""report""#.to_owned()),
            Just(r#""refund""#.to_owned()),
            any::<u64>().prop_map(|n| n.to_string()),
            Just("-1".to_owned()),
            Just("1.5".to_owned()),
            Just("1e3".to_owned()),
            Just("null".to_owned()),
            Just("true".to_owned()),
            Just("[]".to_owned()),
            Just("{}".to_owned()),
        ]
    }

    proptest::proptest! {
        /// The borrowed form accepts exactly what the proto's serde form
        /// accepts, and reads the same fields from it.
        #[test]
        fn the_borrowed_body_reads_exactly_what_the_proto_reads(
            fields in proptest::collection::vec(
                (
                    proptest::sample::select(vec![
                        "namespace", "resource", "domain", "hits", "min_hits", "mode", "other",
                        "Namespace",
                    ]),
                    value(),
                ),
                0..8,
            ),
            wrap in proptest::sample::select(vec!["object", "array", "cut", "trailing"]),
        ) {
            let inner = fields
                .iter()
                .map(|(k, v)| format!("{k:?}:{v}"))
                .collect::<Vec<_>>()
                .join(",");
            // serde also reads a struct from an array, field by position:
            // the values alone, so the two forms' field orders must agree.
            let values = fields
                .iter()
                .map(|(_, v)| v.as_str())
                .collect::<Vec<_>>()
                .join(",");
            let text = match wrap {
                "object" => format!("{{{inner}}}"),
                "array" => format!("[{values}]"),
                "cut" => format!("{{{inner}").chars().take(inner.len() / 2 + 1).collect(),
                _ => format!("{{{inner}}} x"),
            };
            let owned = serde_json::from_str::<RateRequest>(&text);
            let borrowed = serde_json::from_str::<super::RateRequestJson>(&text);
            match (&owned, &borrowed) {
                (Ok(o), Ok(b)) => proptest::prop_assert_eq!(o.view(), b.view()),
                (Err(_), Err(_)) => {}
                _ => proptest::prop_assert!(false, "{text}: {owned:?} against {borrowed:?}"),
            }
        }
    }
}
