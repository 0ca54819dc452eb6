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
    eventually("nothing", Duration::ZERO, || Err::<(), _>("no".into()));
}

#[test]
fn eventually_returns_what_the_check_found() {
    let mut calls = 0;
    let found = eventually("the second call", Duration::from_secs(60), || {
        calls += 1;
        if calls < 2 {
            Err("not yet".into())
        } else {
            Ok(calls * 10)
        }
    });
    assert_eq!(found, 20);
}

#[tokio::test]
async fn eventually_async_awaits_the_check_until_it_passes() {
    let mut calls = 0;
    let found =
        tollgate_testing::eventually_async("the third call", Duration::from_secs(60), || {
            calls += 1;
            let n = calls;
            async move {
                if n < 3 {
                    Err(format!("call {n}"))
                } else {
                    Ok(n)
                }
            }
        })
        .await;
    assert_eq!(found, 3);
}

#[tokio::test]
#[should_panic(expected = "never happened within 0ns: nothing; last: no")]
async fn eventually_async_fails_with_the_last_complaint() {
    tollgate_testing::eventually_async("nothing", Duration::ZERO, || async {
        Err::<(), _>("no".to_owned())
    })
    .await;
}
