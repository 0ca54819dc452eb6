//! `tollgate sim windows`: seed 004's study of window approximations
//! (fixed window, the two-window weighted approximation, N sub-windows,
//! the exact sliding log) against a perfect sliding window, on seeded
//! random traffic; the core's own algorithms decide.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use tollgate_core::Nanos;
use tollgate_sim::windows::{self, WindowParams};

/// Arguments of `tollgate sim windows`.
#[derive(Args, Debug)]
pub struct WindowsArgs {
    /// Seed of the traffic.
    #[arg(long, default_value_t = 4)]
    pub seed: u64,
    /// The limit per window (seed 004: 100 a minute).
    #[arg(long, default_value_t = 100)]
    pub limit: u64,
    /// Window length in seconds.
    #[arg(long, default_value_t = 60)]
    pub window_s: u64,
    /// Simulated minutes of traffic.
    #[arg(long, default_value_t = 30)]
    pub minutes: u64,
    /// Sub-windows of the N-sub-window contender (seed 004 charts five
    /// 15 s windows).
    #[arg(long, default_value_t = 5)]
    pub sub_windows: u32,
    /// Write the statistics (CSV), the time series (CSV) and the charts
    /// (SVG) to this directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Runs the study and prints its table.
pub fn run(args: &WindowsArgs) -> Result<()> {
    let params = WindowParams {
        seed: args.seed,
        limit: args.limit,
        window: Nanos::from_secs(args.window_s),
        duration: Nanos::from_secs(args.minutes.saturating_mul(60)),
        sub_window_buckets: args.sub_windows,
        ..WindowParams::default()
    };
    let result = windows::run(&params).map_err(|e| anyhow::anyhow!("{e}"))?;
    print!("{}", result.table());
    if let Some(dir) = &args.out {
        let written = result
            .write_outputs(dir)
            .map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
        for path in written {
            eprintln!("wrote {}", path.display());
        }
    }
    Ok(())
}
