//! JSON forms of the proto enums: names (`"acquire"`, `"hard"`) rather
//! than numbers, for the HTTP API.

use serde::{Deserialize, Deserializer, Serializer};

use crate::v1::{LimitedBy, Mode};

/// `mode`: `"try"` or `"acquire"`.
pub mod mode {
    use super::*;

    /// Writes the name.
    pub fn serialize<S: Serializer>(value: &i32, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match Mode::try_from(*value) {
            Ok(Mode::Acquire) => "acquire",
            _ => "try",
        })
    }

    /// Reads a name; anything else names the accepted ones.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
        let name = String::deserialize(d)?;
        match name.as_str() {
            "try" => Ok(Mode::Try as i32),
            "acquire" => Ok(Mode::Acquire as i32),
            other => Err(serde::de::Error::custom(format!(
                "unknown mode `{other}`: expected `try` or `acquire`"
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
}
