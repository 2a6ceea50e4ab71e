//! Traffic shape, drawn from a seeded generator so that two runs with the same `--seed`
//! send the same traffic: the gaps between request arrivals (Poisson, constant, or all at
//! once) and the normal length distributions of `token-norm-dist`. These are the seed's
//! `get_list_of_delays` and `get_norm_dist_tokens`.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// How requests arrive in an open loop.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum Arrivals {
    /// A Poisson process of `rate` requests per second: exponential gaps of mean 1/rate.
    Poisson { rate: f64 },
    /// One request every 1/rate seconds.
    Constant { rate: f64 },
    /// Every request at once (the seed's request rate of -1); a concurrency cap, if any,
    /// turns this into a closed loop.
    Immediate,
}

impl Arrivals {
    /// The gap before each of `n` requests (the first is drawn too, as in the seed).
    pub fn gaps(&self, n: usize, rng: &mut StdRng) -> Vec<Duration> {
        (0..n).map(|_| self.gap(rng)).collect()
    }

    fn gap(&self, rng: &mut StdRng) -> Duration {
        match *self {
            // Inverse-transform sampling: -ln(U)/rate with U in (0, 1].
            Arrivals::Poisson { rate } => {
                let u: f64 = 1.0 - rng.gen::<f64>();
                Duration::from_secs_f64(-u.ln() / rate)
            }
            Arrivals::Constant { rate } => Duration::from_secs_f64(1.0 / rate),
            Arrivals::Immediate => Duration::ZERO,
        }
    }
}

/// A normal distribution of token counts, rounded and clamped to `1..=max`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub(crate) struct NormalLengths {
    pub mean: f64,
    pub stdev: f64,
    /// Upper clamp (a model's context); `usize::MAX` for none.
    pub max: usize,
}

impl NormalLengths {
    pub fn new(mean: f64, stdev: f64) -> Self {
        NormalLengths {
            mean,
            stdev,
            max: usize::MAX,
        }
    }

    /// `n` lengths. The generator advances by the same amount whatever the stdev, so a
    /// change of stdev does not shift the draws that follow.
    pub fn sample(&self, n: usize, rng: &mut StdRng) -> Vec<usize> {
        (0..n)
            .map(|_| {
                let x = self.mean + self.stdev * standard_normal(rng);
                (x.round().max(1.0) as usize).min(self.max.max(1))
            })
            .collect()
    }
}

/// One standard normal draw (Box–Muller; the second value is dropped so each call
/// consumes exactly two uniforms).
fn standard_normal(rng: &mut StdRng) -> f64 {
    let u1: f64 = 1.0 - rng.gen::<f64>();
    let u2: f64 = rng.gen();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// The generator of one concern of a run (`stream` names it), derived from the run's
/// seed, so the lengths do not change when, say, the arrival process does.
pub fn rng_for(seed: u64, stream: u64) -> StdRng {
    StdRng::seed_from_u64(seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// Seeds of the independent draws of a run.
pub(crate) mod streams {
    pub const ARRIVALS: u64 = 1;
    pub const INPUT_LENGTHS: u64 = 2;
    pub const OUTPUT_LENGTHS: u64 = 3;
    pub const PROMPT_TOKENS: u64 = 4;
    pub const DATASET_ORDER: u64 = 5;
    pub const WARMUP: u64 = 6;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mean_sd(xs: &[f64]) -> (f64, f64) {
        let n = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
        (mean, var.sqrt())
    }

    fn secs(gaps: &[Duration]) -> Vec<f64> {
        gaps.iter().map(Duration::as_secs_f64).collect()
    }

    #[test]
    fn poisson_mean_gap_is_one_over_rate_within_5_percent() {
        for (seed, rate) in [(0, 1.0), (1, 8.0), (2, 250.0)] {
            let gaps = secs(
                &Arrivals::Poisson { rate }.gaps(10_000, &mut rng_for(seed, streams::ARRIVALS)),
            );
            let (mean, sd) = mean_sd(&gaps);
            assert!(
                (mean * rate - 1.0).abs() < 0.05,
                "rate {rate}: mean gap {mean}"
            );
            // Exponential: stdev equals the mean (coefficient of variation 1).
            assert!(
                (sd / mean - 1.0).abs() < 0.05,
                "rate {rate}: cv {}",
                sd / mean
            );
            assert!(gaps.iter().all(|&g| g >= 0.0 && g.is_finite()));
        }
    }

    #[test]
    fn constant_gaps_are_exact_and_immediate_is_zero() {
        let mut rng = rng_for(3, streams::ARRIVALS);
        let gaps = secs(&Arrivals::Constant { rate: 4.0 }.gaps(10_000, &mut rng));
        assert!(gaps.iter().all(|&g| (g - 0.25).abs() < 1e-9));
        assert!(Arrivals::Immediate
            .gaps(5, &mut rng)
            .iter()
            .all(Duration::is_zero));
    }

    #[test]
    fn same_seed_same_traffic_other_seed_other_traffic() {
        let a = Arrivals::Poisson { rate: 3.0 };
        let draw = |seed| a.gaps(100, &mut rng_for(seed, streams::ARRIVALS));
        assert_eq!(draw(42), draw(42));
        assert_ne!(draw(42), draw(43));
        let lens = |seed| {
            NormalLengths::new(128.0, 20.0).sample(100, &mut rng_for(seed, streams::INPUT_LENGTHS))
        };
        assert_eq!(lens(7), lens(7));
        assert_ne!(lens(7), lens(8));
    }

    #[test]
    fn normal_lengths_have_the_asked_mean_and_stdev() {
        let lens =
            NormalLengths::new(128.0, 16.0).sample(10_000, &mut rng_for(5, streams::INPUT_LENGTHS));
        let xs: Vec<f64> = lens.iter().map(|&l| l as f64).collect();
        let (mean, sd) = mean_sd(&xs);
        assert!((mean - 128.0).abs() < 1.0, "mean {mean}");
        assert!((sd - 16.0).abs() < 0.8, "stdev {sd}");
        // About 68% within one stdev, as a normal distribution has.
        let within = xs.iter().filter(|&&x| (x - 128.0).abs() <= 16.0).count() as f64 / 1e4;
        assert!((within - 0.68).abs() < 0.03, "within 1 sd: {within}");
    }

    #[test]
    fn zero_stdev_gives_the_mean_and_lengths_stay_in_range() {
        let mut rng = rng_for(9, streams::OUTPUT_LENGTHS);
        assert!(NormalLengths::new(64.0, 0.0)
            .sample(1000, &mut rng)
            .iter()
            .all(|&l| l == 64));
        let wide = NormalLengths {
            mean: 4.0,
            stdev: 50.0,
            max: 30,
        }
        .sample(10_000, &mut rng);
        assert!(wide.iter().all(|&l| (1..=30).contains(&l)));
        assert!(wide.contains(&1) && wide.contains(&30));
    }
}
