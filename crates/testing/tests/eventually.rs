use std::time::Duration;

use tollgate_testing::eventually;

#[test]
fn eventually_returns_once_the_check_passes() {
    let mut calls = 0;
    eventually("the third call", Duration::from_secs(60), || {
        calls += 1;
        if calls < 3 {
            Err(format!("call {calls}"))
        } else {
            Ok(())
        }
    });
    assert_eq!(calls, 3);
}

#[test]
#[should_panic(expected = "never happened within 0ns: nothing; last: no")]
fn eventually_fails_with_the_last_complaint() {
    eventually("nothing", Duration::ZERO, || Err("no".into()));
}
