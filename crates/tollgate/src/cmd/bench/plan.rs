//! The shape of a run: the arguments checked and resolved into a [`LoadPlan`]
//! before anything connects, and how request keys are drawn.
//!
//! Apart so that every refusal of bad arguments is in one place and runs
//! without a network or a runtime (parse, then resolve).

use std::time::Duration;

use anyhow::{bail, Result};
use rand::rngs::SmallRng;
use rand::Rng;
use rand_distr::Zipf;

use super::{Api, BenchArgs, KeyDistribution};

/// The validated shape of a run.
pub(super) struct LoadPlan {
    pub(super) api: Api,
    pub(super) target: String,
    pub(super) concurrency: usize,
    pub(super) connections: usize,
    pub(super) warmup: Duration,
    pub(super) duration: Duration,
    pub(super) rate: Option<f64>,
    pub(super) timeout: Duration,
    pub(super) keys: Keys,
    pub(super) template: Template,
}

impl LoadPlan {
    pub(super) fn new(args: &BenchArgs) -> Result<LoadPlan> {
        if args.concurrency == 0 {
            bail!("--concurrency must be at least 1");
        }
        if args.keys == 0 {
            bail!("--keys must be at least 1");
        }
        if args.duration.is_zero() {
            bail!("--duration must be more than 0");
        }
        if args.hits == 0 {
            bail!("--hits must be at least 1");
        }
        if args.api == Api::Rls && u32::try_from(args.hits).is_err() {
            bail!(
                "--hits: Envoy's hits_addend is 32 bits, at most {}",
                u32::MAX
            );
        }
        if let Some(r) = args.rate {
            // Also refuses NaN. The bounds keep every intended send time
            // (n / rate) a sane duration.
            if !(0.01..=1e9).contains(&r) {
                bail!("--rate must be between 0.01 and 10^9 requests per second");
            }
        }
        let connections = args.connections.unwrap_or(args.concurrency.min(4));
        if connections == 0 {
            bail!("--connections must be at least 1");
        }
        let keys = match args.distribution {
            KeyDistribution::Uniform => Keys::Uniform(args.keys),
            KeyDistribution::Zipf => Keys::Zipf(
                Zipf::new(args.keys as f64, args.zipf_exponent)
                    .map_err(|e| anyhow::anyhow!("--zipf-exponent {}: {e}", args.zipf_exponent))?,
            ),
        };
        // A scheme is accepted and dropped: each API adds its own.
        let target = args
            .target
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        if target.is_empty() {
            bail!("--target is empty (expected host:port)");
        }
        Ok(LoadPlan {
            api: args.api,
            target,
            concurrency: args.concurrency,
            connections: connections.min(args.concurrency),
            warmup: args.warmup,
            duration: args.duration,
            rate: args.rate,
            timeout: args.timeout,
            keys,
            template: Template {
                namespace: args.namespace.clone(),
                resource: args.resource.clone(),
                domain_name: args.domain_name.clone(),
                descriptor_key: args.descriptor_key.clone(),
                hits: args.hits,
            },
        })
    }
}

/// The fixed part of every request.
pub(super) struct Template {
    pub(super) namespace: String,
    pub(super) resource: String,
    pub(super) domain_name: String,
    pub(super) descriptor_key: String,
    pub(super) hits: u64,
}

/// How keys are drawn.
#[derive(Clone, Copy)]
pub(super) enum Keys {
    Uniform(u64),
    Zipf(Zipf<f64>),
}

impl Keys {
    /// A key index in `0..K`.
    pub(super) fn draw(&self, rng: &mut SmallRng) -> u64 {
        match self {
            Keys::Uniform(k) => rng.random_range(0..*k),
            // Zipf draws ranks 1..=K as floats; rank 1 is `user-0`.
            Keys::Zipf(z) => (rng.sample(z) as u64).saturating_sub(1),
        }
    }
}
#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use rand::rngs::SmallRng;
    use rand::SeedableRng;
    use rand_distr::Zipf;

    use super::*;

    #[test]
    fn keys_stay_in_range_and_zipf_favours_the_first() {
        let mut rng = SmallRng::seed_from_u64(7);
        let uniform = Keys::Uniform(10);
        let zipf = Keys::Zipf(Zipf::new(10.0, 1.0).unwrap());
        let mut counts = [0u32; 10];
        for _ in 0..10_000 {
            assert!(uniform.draw(&mut rng) < 10);
            let k = zipf.draw(&mut rng);
            assert!(k < 10);
            counts[k as usize] += 1;
        }
        // Harmonic weights: key 0 takes about 34%, key 9 about 3.4%.
        assert!(counts[0] > 3 * counts[9], "{counts:?}");
        assert!(counts[0] > counts[1]);
    }
}
