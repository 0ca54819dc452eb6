//! Calendar windows in the config: `fixed_window` with `align: calendar`,
//! `window: 1d | 1w | 1mo | 1y` and `timezone`, in tollgate's format and
//! in the Lyft format's algorithm extension; the errors, the normalized
//! output, and the canonical form the limit's fingerprint is made of.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use tollgate_config::{load_str, AlgorithmSpec, ConfigError, ResourceKind};
use tollgate_core::{Align, CalendarUnit, Nanos};

fn errors(text: &str) -> Vec<String> {
    match load_str("t.yaml", text) {
        Ok(_) => panic!("expected an error"),
        Err(ConfigError { errors }) => errors.iter().map(|e| e.to_string()).collect(),
    }
}

fn one_error(text: &str) -> String {
    let e = errors(text);
    assert_eq!(e.len(), 1, "{e:?}");
    e.into_iter().next().unwrap()
}

/// A one-resource document with the resource's fields as given.
fn doc(fields: &str) -> String {
    format!("namespaces:\n  - name: n\n    resources:\n      - {{ name: q, algorithm: fixed_window, limit: 1000, {fields} }}\n")
}

/// The algorithm of resource `q` of namespace `n`.
fn spec_of(text: &str) -> AlgorithmSpec {
    let loaded = load_str("t.yaml", text).unwrap_or_else(|e| panic!("{e}"));
    let r = loaded.config.namespace("n").unwrap().resource("q").unwrap();
    let ResourceKind::Rate(rate) = &r.kind else {
        panic!("not a rate limit")
    };
    rate.default.algorithm().unwrap().clone()
}

/// The calendar of a calendar fixed window: its unit and zone.
fn calendar_of(spec: &AlgorithmSpec) -> (CalendarUnit, String) {
    match spec {
        AlgorithmSpec::FixedWindow {
            align: Align::Calendar(c),
            window,
            ..
        } => {
            assert_eq!(*window, c.unit().nominal());
            (c.unit(), c.zone().to_owned())
        }
        other => panic!("not a calendar window: {other:?}"),
    }
}

#[test]
fn a_monthly_window_in_a_zone_is_read() {
    let spec = spec_of(&doc("window: 1mo, align: calendar, timezone: Europe/Paris"));
    assert_eq!(
        calendar_of(&spec),
        (CalendarUnit::Month, "Europe/Paris".into())
    );
    assert_eq!(
        spec.to_string(),
        "fixed_window { limit: 1000, window: 1mo, align: calendar, timezone: Europe/Paris }"
    );
}

#[test]
fn the_zone_defaults_to_utc_and_is_spelled_as_the_database_does() {
    let spec = spec_of(&doc("window: 1y, align: calendar"));
    assert_eq!(calendar_of(&spec), (CalendarUnit::Year, "UTC".into()));
    let spec = spec_of(&doc(
        "window: 1mo, align: calendar, timezone: america/new_york",
    ));
    assert_eq!(calendar_of(&spec).1, "America/New_York");
}

#[test]
fn days_and_weeks_may_be_calendar_windows_too() {
    for (window, unit) in [
        ("1d", CalendarUnit::Day),
        ("24h", CalendarUnit::Day),
        ("1w", CalendarUnit::Week),
        ("7d", CalendarUnit::Week),
    ] {
        let spec = spec_of(&doc(&format!(
            "window: {window}, align: calendar, timezone: Asia/Tokyo"
        )));
        assert_eq!(calendar_of(&spec).0, unit, "{window}");
    }
}

#[test]
fn the_zone_is_part_of_the_canonical_form() {
    // The view's limit id hashes this form: a changed zone (or alignment)
    // is a new limit with fresh counters.
    let paris = spec_of(&doc("window: 1mo, align: calendar, timezone: Europe/Paris"));
    let berlin = spec_of(&doc(
        "window: 1mo, align: calendar, timezone: Europe/Berlin",
    ));
    let utc = spec_of(&doc("window: 1mo, align: calendar"));
    let days = spec_of(&doc("window: 30d"));
    let forms: Vec<String> = [paris, berlin, utc, days]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for (i, a) in forms.iter().enumerate() {
        for b in &forms[i + 1..] {
            assert_ne!(a, b);
        }
    }
}

#[test]
fn an_unknown_zone_is_named_with_its_position() {
    let e = one_error(&doc(
        "window: 1mo, align: calendar, timezone: Europe/Pariss",
    ));
    assert!(e.starts_with("t.yaml:4:"), "{e}");
    assert!(
        e.contains("resource `q`") && e.contains("`timezone`") && e.contains("`Europe/Pariss`"),
        "{e}"
    );
}

#[test]
fn a_zone_without_a_calendar_is_an_error() {
    let e = one_error(&doc("window: 1h, timezone: Europe/Paris"));
    assert!(
        e.contains("`timezone` applies only to `align: calendar`"),
        "{e}"
    );
    let e = one_error(&doc("window: 1h, align: first_hit, timezone: UTC"));
    assert!(e.contains("`timezone` applies only"), "{e}");
}

#[test]
fn months_and_years_need_a_calendar() {
    for window in ["1mo", "2y"] {
        let e = one_error(&doc(&format!("window: {window}")));
        assert!(
            e.contains(&format!(
                "`window: {window}` is a calendar period: add `align: calendar`"
            )),
            "{e}"
        );
    }
}

#[test]
fn a_calendar_window_is_one_unit() {
    for window in ["2mo", "3d", "90m", "1"] {
        let e = one_error(&doc(&format!("window: {window}, align: calendar")));
        assert!(
            e.contains("a calendar window (`align: calendar`) is one day, week, month or year")
                && e.contains(&format!("found `{window}`")),
            "{window}: {e}"
        );
    }
    let e = one_error(&doc("window: 1mo, align: sideways"));
    assert!(
        e.contains("align must be `epoch`, `first_hit` or `calendar`, found `sideways`"),
        "{e}"
    );
}

#[test]
fn the_normalized_output_keeps_the_calendar_and_reads_back() {
    let text = "namespaces:\n  - name: n\n    resources:\n      - name: q\n        algorithm: fixed_window\n        limit: 1000\n        window: 1mo\n        align: calendar\n        timezone: europe/paris\n        domains:\n          acme: { limit: 5000 }\n          globex: { algorithm: fixed_window, limit: 10, window: 1d, align: calendar, timezone: Asia/Tokyo }\n";
    let first = load_str("a.yaml", text).unwrap().config;
    let yaml = tollgate_config::emit::to_yaml(&first);
    for line in [
        "window: 1mo",
        "align: calendar",
        "timezone: Europe/Paris",
        "timezone: Asia/Tokyo",
    ] {
        assert!(yaml.contains(line), "{line} missing:\n{yaml}");
    }
    let second = load_str("b.yaml", &yaml)
        .unwrap_or_else(|e| panic!("{e}\n{yaml}"))
        .config;
    let a = first.namespace("n").unwrap().resource("q").unwrap();
    let b = second.namespace("n").unwrap().resource("q").unwrap();
    assert_eq!(a.kind, b.kind);
    let ResourceKind::Rate(rate) = &b.kind else {
        panic!()
    };
    assert_eq!(
        calendar_of(rate.for_domain("acme").algorithm().unwrap()),
        (CalendarUnit::Month, "Europe/Paris".into())
    );
    assert_eq!(
        calendar_of(rate.for_domain("globex").algorithm().unwrap()),
        (CalendarUnit::Day, "Asia/Tokyo".into())
    );
}

/// In the Lyft format `unit: month` keeps upstream's meaning (30 days from
/// the epoch); a calendar month is the algorithm extension's.
#[test]
fn the_lyft_format_keeps_its_month_and_takes_a_calendar_as_an_extension() {
    let text = "domain: d\ndescriptors:\n  - key: plain\n    rate_limit: { unit: month, requests_per_unit: 10 }\n  - key: calendar\n    rate_limit: { algorithm: fixed_window, limit: 10, window: 1mo, align: calendar, timezone: Europe/Paris }\n";
    let loaded = load_str("t.yaml", text).unwrap_or_else(|e| panic!("{e}"));
    let ns = &loaded.config.namespaces[0];
    let spec = |name: &str| {
        let r = ns.resource(name).unwrap();
        let ResourceKind::Rate(rate) = &r.kind else {
            panic!()
        };
        (
            rate.default.algorithm().unwrap().clone(),
            r.envoy.as_ref().unwrap().limit,
        )
    };
    let (plain, _) = spec("plain");
    assert_eq!(
        plain,
        AlgorithmSpec::FixedWindow {
            limit: 10,
            window: Nanos::from_secs(30 * 86_400),
            align: Align::Epoch
        }
    );
    let (calendar, limit) = spec("calendar");
    assert_eq!(
        calendar_of(&calendar),
        (CalendarUnit::Month, "Europe/Paris".into())
    );
    // Envoy's answer names the unit of a calendar month: MONTH.
    assert_eq!(
        limit.map(|l| (l.requests_per_unit, l.unit)),
        Some((10, tollgate_config::model::EnvoyUnit::Month))
    );
    // Written back as the extension, and read back the same.
    let yaml = tollgate_config::emit::to_yaml(&loaded.config);
    assert!(
        yaml.contains("window: 1mo, align: calendar, timezone: Europe/Paris"),
        "{yaml}"
    );
    let again = load_str("b.yaml", &yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    assert_eq!(
        again.config.namespaces[0]
            .resource("calendar")
            .unwrap()
            .kind,
        ns.resource("calendar").unwrap().kind
    );
}
