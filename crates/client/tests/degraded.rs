//! A degraded grant says why: every server tried, each with its error.
//!
//! Issue 23: a call granted without a server only said `Via::Degraded`
//! (and the CLI printed `granted 1 via degraded; `), with no word of which
//! servers failed or how. The servers here are loopback ports nothing
//! listens on, so every connection is refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::time::Duration;

use tollgate_client::{Client, ClientConfig, Error, FailureKind, Via};

/// A loopback address nothing listens on: a port the system just handed
/// out on `127.0.0.2`, closed again before it is used (test servers bind
/// their free ports on `127.0.0.1`, so none of them takes it meanwhile).
fn closed_port() -> String {
    let listener = TcpListener::bind("127.0.0.2:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

#[tokio::test]
async fn a_degraded_grant_names_each_server_and_its_error() {
    let (a, b) = (closed_port(), closed_port());
    let mut config = ClientConfig::new([a.clone(), b.clone()]);
    // A failed server is not tried again for an hour: the hold below
    // meets the backoff, however slow the machine.
    config.reconnect_base = Duration::from_secs(3600);
    config.reconnect_max = Duration::from_secs(3600);
    let client = Client::new(config).unwrap();

    let grant = client
        .request("default", "api", "acme")
        .hits(3)
        .min_hits(1)
        .send()
        .await
        .unwrap();
    assert_eq!((grant.granted, grant.via), (1, Via::Degraded));
    let outage = grant.outage.expect("a degraded grant says why");
    let servers: Vec<&str> = outage.tried.iter().map(|u| u.server.as_str()).collect();
    assert_eq!(servers, [a.as_str(), b.as_str()], "in the order tried");
    for u in &outage.tried {
        assert!(u.error.starts_with("cannot connect: "), "{u:?}");
        assert!(
            u.error.to_lowercase().contains("connection refused"),
            "{u:?}"
        );
        assert!(!u.error.contains(&u.server), "named once: {u:?}");
    }
    let text = outage.to_string();
    assert!(
        text.starts_with(&format!("{a}: cannot connect: ")),
        "{text}"
    );
    assert!(text.contains(&format!("; {b}: cannot connect: ")), "{text}");

    // Both servers are now in their reconnection backoff: a hold is not
    // even attempted on them, and says so with the failure behind it.
    let hold = client.hold("default", "pool", "acme").send().await.unwrap();
    assert!(hold.is_degraded());
    let outage = hold.outage().expect("a degraded hold says why");
    let servers: Vec<&str> = outage.tried.iter().map(|u| u.server.as_str()).collect();
    assert_eq!(servers, [a.as_str(), b.as_str()]);
    for u in &outage.tried {
        assert!(
            u.error.starts_with("failed recently (cannot connect: "),
            "{u:?}"
        );
        assert!(
            u.error.to_lowercase().contains("connection refused"),
            "{u:?}"
        );
    }
}

#[tokio::test]
async fn without_fail_open_the_error_names_each_server_and_its_error() {
    let (a, b) = (closed_port(), closed_port());
    let mut config = ClientConfig::new([a.clone(), b.clone()]);
    config.fail_open = false;
    let err = Client::new(config)
        .unwrap()
        .request("default", "api", "acme")
        .send()
        .await
        .unwrap_err();
    let Error::Unavailable(outage) = &err else {
        panic!("{err:?}")
    };
    // The structured outage, as a degraded grant has it.
    let servers: Vec<&str> = outage.tried.iter().map(|u| u.server.as_str()).collect();
    assert_eq!(servers, [a.as_str(), b.as_str()]);
    assert!(outage
        .tried
        .iter()
        .all(|u| u.kind == FailureKind::Unreachable));
    assert_eq!(err.outage(), Some(outage));
    let why = &outage.to_string();
    assert!(why.starts_with(&format!("{a}: cannot connect: ")), "{why}");
    assert!(why.contains(&format!("; {b}: cannot connect: ")), "{why}");
    assert!(
        err.to_string().starts_with("no tollgate server answered: "),
        "{err}"
    );
}

/// Review of issue 23: an address with a user and password was kept as
/// the server's name, and so printed in every outage (stdout, JSON,
/// logs). It is refused when the client is made, without showing them.
#[test]
fn a_server_address_with_a_user_or_password_is_refused_unshown() {
    for address in [
        "http://admin:hunter2@127.0.0.1:8081",
        "https://admin:hunter2@tollgate.internal:8081",
        "admin:hunter2@127.0.0.1:8081",
        // A `/` in the password, where the parse fails and would quote it.
        "http://admin:hun/ter2@127.0.0.1:8081",
    ] {
        let err = Client::new(ClientConfig::new([address])).unwrap_err();
        let Error::Invalid(why) = &err else {
            panic!("{address}: {err:?}")
        };
        assert!(why.contains("user or password"), "{why}");
        assert!(!why.contains("ter2") && !why.contains("admin"), "{why}");
    }
}
