use std::net::{TcpListener, UdpSocket};
use std::process::Command;
use std::time::Duration;

use tollgate_testing::{accepts, eventually, free_port, free_udp_addr, wait_ready, KillOnDrop};

/// Whether process `pid` still exists (a reaped child does not).
fn exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// A port is free when it is handed out; another process (tests run in
/// parallel) may take it in the instant before it is bound, which is the
/// documented risk, so a few tries are allowed: one bindable port in
/// twenty shows the function works, a broken one never gives any.
#[test]
fn a_free_port_can_be_bound_and_then_accepts_once_listened_on() {
    let listener = (0..20)
        .find_map(|_| {
            let port = free_port();
            assert_ne!(port, 0);
            TcpListener::bind(("127.0.0.1", port)).ok()
        })
        .expect("no port free_port gave could be bound");
    assert!(accepts(listener.local_addr().unwrap()));
    let udp = (0..20)
        .find_map(|_| {
            let udp = free_udp_addr();
            assert!(udp.ip().is_loopback() && udp.port() != 0);
            UdpSocket::bind(udp).ok()
        })
        .expect("no address free_udp_addr gave could be bound");
    assert!(udp.local_addr().unwrap().ip().is_loopback());
}

#[test]
fn nothing_accepts_on_a_port_no_one_listens_on() {
    let addr = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    assert!(!accepts(addr));
}

#[test]
fn a_guarded_child_is_killed_and_reaped_when_dropped() {
    let child = KillOnDrop::spawn(Command::new("sleep").arg("600")).unwrap();
    let pid = child.id();
    assert!(exists(pid));
    drop(child);
    assert!(!exists(pid), "sleep 600 outlived its guard");
}

#[test]
fn a_guarded_child_is_killed_when_the_test_panics() {
    let pid = std::sync::Arc::new(std::sync::Mutex::new(0));
    let seen = std::sync::Arc::clone(&pid);
    let panicked = std::thread::spawn(move || {
        let child = KillOnDrop::spawn(Command::new("sleep").arg("600")).unwrap();
        *seen.lock().unwrap() = child.id();
        panic!("the test failed");
    })
    .join();
    assert!(panicked.is_err());
    let pid = *pid.lock().unwrap();
    assert!(!exists(pid), "sleep 600 outlived the panicking test");
}

#[test]
fn waiting_for_a_server_that_exits_says_so() {
    let mut child = KillOnDrop::spawn(&mut Command::new("true")).unwrap();
    let e = wait_ready(&mut child, Duration::from_secs(60), || false).unwrap_err();
    assert!(e.starts_with("it exited (exit status: 0)"), "{e}");
}

#[test]
fn waiting_for_a_server_returns_once_it_is_ready() {
    let mut child = KillOnDrop::spawn(Command::new("sleep").arg("600")).unwrap();
    let mut asked = 0;
    wait_ready(&mut child, Duration::from_secs(60), || {
        asked += 1;
        asked == 3
    })
    .unwrap();
    assert_eq!(asked, 3);
}

#[test]
fn waiting_for_a_server_that_never_answers_ends_at_the_bound() {
    let mut child = KillOnDrop::spawn(Command::new("sleep").arg("600")).unwrap();
    let e = wait_ready(&mut child, Duration::ZERO, || false).unwrap_err();
    assert_eq!(e, "no answer within 0ns");
}

#[test]
fn a_signal_reaches_the_child() {
    let mut child = KillOnDrop::spawn(Command::new("sleep").arg("600")).unwrap();
    assert!(tollgate_testing::signal(child.id(), "TERM"));
    eventually(
        "sleep ends on SIGTERM",
        Duration::from_secs(60),
        || match child.try_wait().unwrap() {
            Some(status) => Ok(status),
            None => Err("still running".into()),
        },
    );
}
