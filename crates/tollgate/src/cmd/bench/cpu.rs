//! CPU time of the client and of the server (`--server-pid`) over the
//! measured window, read from `/proc/<pid>/stat` (Linux; elsewhere the
//! figures are left out).
//!
//! Apart because it is platform-specific and runs beside the load, not in
//! it: one sample when measuring starts, one when it ends.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::drive::RunClock;

/// CPU time used by the client and the server during the measured window.
#[derive(Default)]
pub(super) struct CpuWindow {
    /// Wall-clock length of the window.
    pub(super) wall: Duration,
    pub(super) client: Option<Duration>,
    pub(super) server: Option<Duration>,
}

/// Samples both processes' CPU time when measuring starts and ends.
pub(super) async fn measure_cpu(clock: Arc<RunClock>, server: Option<u32>) -> CpuWindow {
    let sample = || {
        (
            Instant::now(),
            process_cpu("self"),
            server.and_then(|pid| process_cpu(&pid.to_string())),
        )
    };
    tokio::time::sleep_until(clock.measure_from.into()).await;
    let (t0, client0, server0) = sample();
    tokio::time::sleep_until(clock.end.into()).await;
    let (t1, client1, server1) = sample();
    let delta = |a: Option<Duration>, b: Option<Duration>| Some(b?.saturating_sub(a?));
    CpuWindow {
        wall: t1 - t0,
        client: delta(client0, client1),
        server: delta(server0, server1),
    }
}

/// User plus system CPU time of a process (all its threads), from
/// `/proc/<pid>/stat`; `None` where there is no such file (not Linux, no
/// such process).
fn process_cpu(pid: &str) -> Option<Duration> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses; the
    // fields after its closing parenthesis are fixed: utime and stime are
    // the 12th and 13th of them.
    let rest = text.rsplit_once(')')?.1;
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // In clock ticks of USER_HZ, which Linux fixes at 100 for user space
    // on every architecture it runs on.
    Some(Duration::from_millis((utime + stime) * 10))
}
#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    #[cfg(target_os = "linux")]
    fn cpu_time_is_read_from_proc() {
        // Burn CPU until the figure leaves zero (10 ms resolution). Not a
        // fixed wall-clock time: on a loaded machine 30 ms of wall clock
        // can be less than one tick of CPU; the bound only stops a broken
        // reading from looping forever.
        let start = Instant::now();
        let mut x = 0u64;
        while process_cpu("self") == Some(Duration::ZERO)
            && start.elapsed() < Duration::from_secs(60)
        {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
            }
        }
        assert!(x != 1);
        assert!(process_cpu("self").unwrap() > Duration::ZERO);
        assert!(process_cpu("no-such-process").is_none());
    }
}
