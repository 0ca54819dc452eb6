//! Clock checks: the health verdict from the clock offsets the probes
//! measure (pings go out on the probe timer, pongs are measured on
//! receipt), and the largest offset, for readiness and metrics.
//!
//! Apart because it is the node's one judgment of time, and it never
//! changes what the node decides (limiting goes on; only readiness
//! reports it).

use tollgate_core::Nanos;

use super::Node;
use crate::metrics as m;

impl Node {
    /// Unhealthy when the clocks of most members are beyond the bound
    /// from this node's: then this node's clock is the odd one out. (Of
    /// two nodes, neither can tell whose clock is wrong: both report it.)
    pub(super) fn check_clocks(&mut self) {
        let worst = self.worst_skew().as_u64();
        metrics::gauge!(m::SKEW).set(worst as f64 / 1e9);
        let bound = u128::from(self.config.max_clock_skew.as_u64());
        let off = self
            .offsets
            .values()
            .filter(|o| o.unsigned_abs() > bound)
            .count();
        let healthy = off * 2 <= self.offsets.len();
        if healthy != self.replica.is_healthy() {
            if healthy {
                tracing::info!("clock back within the allowed skew of the peers");
            } else {
                tracing::warn!(
                    skew_ms = worst / 1_000_000,
                    max_ms = self.config.max_clock_skew.as_u64() / 1_000_000,
                    "clock skew to a peer beyond the allowed bound: reporting unhealthy"
                );
            }
        }
        metrics::gauge!(m::HEALTHY).set(if healthy { 1.0 } else { 0.0 });
        self.replica.set_healthy(healthy);
    }

    /// The largest clock offset measured to a peer.
    pub fn worst_skew(&self) -> Nanos {
        let worst = self
            .offsets
            .values()
            .map(|o| o.unsigned_abs())
            .max()
            .unwrap_or(0);
        Nanos::new(u64::try_from(worst).unwrap_or(u64::MAX))
    }
}
