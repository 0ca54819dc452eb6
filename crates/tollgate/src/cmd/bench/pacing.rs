//! The open loop (`--rate`): a pacer thread releases tickets on time, and
//! tasks take them in order and measure each request from its intended
//! send time, so a stalled server shows in every request queued behind it
//! (no coordinated omission).
//!
//! Apart from the closed loop because its timing is the delicate part: a
//! thread of its own (the runtime's timer is too coarse), tickets given up
//! on after the deadline, and one closing permit per task.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use rand::rngs::SmallRng;
use tokio::sync::Semaphore;

use super::client::{call, Client};
use super::drive::RunClock;
use super::plan::LoadPlan;
use super::tally::{nanos, Tally};

/// Tickets of the open loop: the pacer adds a permit per due request; a
/// task takes one, then the next ticket number, whose intended send time
/// is `start + n / rate`.
pub(super) struct Tickets {
    pub(super) due: Semaphore,
    pub(super) next: AtomicU64,
    /// Tickets in the whole run, warm-up included.
    pub(super) total: u64,
    pub(super) rate: f64,
}

impl Tickets {
    pub(super) fn intended(&self, clock: &RunClock, n: u64) -> Instant {
        clock.start + Duration::from_secs_f64(n as f64 / self.rate)
    }
}

/// Open loop: take the next due ticket, send, measure from its intended
/// time.
pub(super) async fn open_task(
    mut client: Client,
    plan: Arc<LoadPlan>,
    clock: Arc<RunClock>,
    tickets: Arc<Tickets>,
    mut rng: SmallRng,
) -> Result<Tally> {
    let mut tally = Tally::new()?;
    loop {
        match tickets.due.acquire().await {
            Ok(permit) => permit.forget(),
            Err(_) => return Ok(tally),
        }
        let n = tickets.next.fetch_add(1, Ordering::Relaxed);
        if n >= tickets.total {
            // One of the closing permits: every ticket is taken.
            return Ok(tally);
        }
        let intended = tickets.intended(&clock, n);
        let counted = intended >= clock.measure_from;
        if Instant::now() >= clock.give_up {
            if counted {
                tally.unsent += 1;
            }
            continue;
        }
        let key = plan.keys.draw(&mut rng);
        let sent = Instant::now();
        let outcome = call(&mut client, &plan, key).await;
        let done = Instant::now();
        clock.answered.fetch_add(1, Ordering::Relaxed);
        if counted {
            tally
                .lag
                .saturating_record(nanos(sent.saturating_duration_since(intended)));
            tally.record(outcome, done.saturating_duration_since(intended));
        }
    }
}

/// Releases the open loop's tickets on time, from a thread of its own: the
/// async runtime's timer has millisecond resolution, far too coarse to pace
/// requests a few microseconds apart. A sleeping thread costs nothing; its
/// wake-up lateness (about 80 µs at the median on the 2-vCPU machine of
/// docs/benchmarks.md, mostly the kernel's timer slack) is counted in
/// every latency, as it should be, since latency is measured from the
/// intended time, and shows in `send_lag_us`.
pub(super) fn pace(tickets: &Tickets, clock: &RunClock, tasks: usize, stop: &AtomicBool) {
    let mut issued = 0u64;
    while issued < tickets.total && !stop.load(Ordering::Relaxed) {
        let elapsed = clock.start.elapsed().as_secs_f64();
        // Ticket n is due at n / rate, so floor(elapsed × rate) + 1 are.
        let due = ((elapsed * tickets.rate) as u64)
            .saturating_add(1)
            .min(tickets.total);
        if due > issued {
            // In bounded steps: a semaphore holds at most usize::MAX >> 3
            // permits.
            let step = (due - issued).min(1 << 20);
            tickets.due.add_permits(step as usize);
            issued += step;
            if issued < due {
                continue;
            }
        }
        if issued < tickets.total {
            let next = tickets.intended(clock, issued);
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
    }
    // One closing permit per task: each takes one, finds the tickets used
    // up and ends.
    tickets.due.add_permits(tasks);
}
