//! One run from start to end: connect, start the clock, spawn the load
//! tasks (closed loop here, open loop in `pacing`), the CPU sampler and the
//! progress bar, and merge what the tasks measured into a [`Report`].
//!
//! Apart so that the orchestration reads in one place, with each concern
//! it starts in its own module.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use tokio::sync::Semaphore;

use super::client::{call, connect, Client};
use super::cpu::measure_cpu;
use super::pacing::{open_task, pace, Tickets};
use super::plan::LoadPlan;
use super::report::Report;
use super::tally::Tally;
use super::BenchArgs;

/// The clock of a run, shared by every task.
pub(super) struct RunClock {
    /// Load starts (warm-up begins).
    pub(super) start: Instant,
    /// Measuring starts: requests sent (or, open loop, intended) before it
    /// are not counted.
    pub(super) measure_from: Instant,
    /// No request is sent (or intended) from here on.
    pub(super) end: Instant,
    /// Open loop: tickets still queued at this point are given up on, so
    /// an overloaded server cannot make a run last forever.
    pub(super) give_up: Instant,
    /// Answers so far, warm-up included (for the progress bar).
    pub(super) answered: AtomicU64,
}

/// Closed loop: send, wait, repeat until the end.
async fn closed_task(
    mut client: Client,
    plan: Arc<LoadPlan>,
    clock: Arc<RunClock>,
    mut rng: SmallRng,
) -> Result<Tally> {
    let mut tally = Tally::new()?;
    loop {
        let sent = Instant::now();
        if sent >= clock.end {
            return Ok(tally);
        }
        let key = plan.keys.draw(&mut rng);
        let outcome = call(&mut client, &plan, key).await;
        let done = Instant::now();
        clock.answered.fetch_add(1, Ordering::Relaxed);
        if sent >= clock.measure_from {
            tally.record(outcome, done - sent);
        }
    }
}

pub(super) async fn drive(args: &BenchArgs, plan: LoadPlan) -> Result<Report> {
    let clients = connect(&plan).await?;
    let plan = Arc::new(plan);
    let start = Instant::now();
    let measure_from = start + plan.warmup;
    let end = measure_from + plan.duration;
    let clock = Arc::new(RunClock {
        start,
        measure_from,
        end,
        // Long enough for a real backlog to drain and be measured, short
        // enough that a stuck server does not hold the run hostage.
        give_up: end + plan.timeout,
        answered: AtomicU64::new(0),
    });
    let progress = progress_bar(&clock);
    let cpu = tokio::spawn(measure_cpu(Arc::clone(&clock), args.server_pid));

    let tickets = plan.rate.map(|rate| {
        let run = (plan.warmup + plan.duration).as_secs_f64();
        Arc::new(Tickets {
            due: Semaphore::new(0),
            next: AtomicU64::new(0),
            // Tickets whose intended time falls before the end.
            total: (run * rate).ceil() as u64,
            rate,
        })
    });
    let stop = Arc::new(AtomicBool::new(false));
    let pacer = tickets.as_ref().map(|t| {
        let (t, c, s) = (Arc::clone(t), Arc::clone(&clock), Arc::clone(&stop));
        let tasks = plan.concurrency;
        std::thread::spawn(move || pace(&t, &c, tasks, &s))
    });

    let mut tasks = Vec::with_capacity(plan.concurrency);
    for i in 0..plan.concurrency {
        let client = clients[i % clients.len()].clone();
        let rng = SmallRng::seed_from_u64(args.seed.wrapping_add(i as u64));
        let (p, c) = (Arc::clone(&plan), Arc::clone(&clock));
        tasks.push(match &tickets {
            Some(t) => tokio::spawn(open_task(client, p, c, Arc::clone(t), rng)),
            None => tokio::spawn(closed_task(client, p, c, rng)),
        });
    }

    let mut total = Tally::new()?;
    let mut failure = None;
    for task in tasks {
        match task.await {
            Ok(Ok(tally)) => total.merge(tally)?,
            Ok(Err(e)) => failure = Some(e),
            Err(e) => failure = Some(anyhow::anyhow!("a load task failed: {e}")),
        }
    }
    // The pacer ends by itself once every ticket is out; this only cuts it
    // short if the tasks ended early.
    stop.store(true, Ordering::Relaxed);
    if let Some(p) = pacer {
        if p.join().is_err() {
            failure.get_or_insert_with(|| anyhow::anyhow!("the pacer thread panicked"));
        }
    }
    progress.finish_and_clear();
    if let Some(e) = failure {
        return Err(e);
    }
    // The window's CPU was sampled at its end, which has passed.
    let cpu = cpu.await.unwrap_or_default();
    Ok(Report::new(args, &plan, &total, cpu))
}

/// A bar over the run's length, with the current answer rate; indicatif
/// draws nothing when stderr is not a terminal.
fn progress_bar(clock: &Arc<RunClock>) -> ProgressBar {
    let length = clock.end.duration_since(clock.start);
    let bar = ProgressBar::new(u64::try_from(length.as_millis()).unwrap_or(u64::MAX));
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} {prefix:9} [{bar:40}] {elapsed:>4} {msg}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    let (bar2, clock) = (bar.clone(), Arc::clone(clock));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        let (mut last_at, mut last_n) = (Instant::now(), 0);
        while !bar2.is_finished() {
            tick.tick().await;
            let now = Instant::now();
            let n = clock.answered.load(Ordering::Relaxed);
            let rate = (n - last_n) as f64 / now.duration_since(last_at).as_secs_f64();
            (last_at, last_n) = (now, n);
            bar2.set_prefix(if now < clock.measure_from {
                "warm-up"
            } else {
                "measuring"
            });
            bar2.set_position(
                u64::try_from(now.duration_since(clock.start).as_millis()).unwrap_or(u64::MAX),
            );
            bar2.set_message(format!("{rate:.0} req/s"));
        }
    });
    bar
}
