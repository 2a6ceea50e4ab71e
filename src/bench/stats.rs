//! What a run measured and the figures drawn from it: per-request records in, the
//! summary out (throughput, latency, time to first token, inter-token latency,
//! goodput under an SLO). Percentiles interpolate linearly between order statistics,
//! as numpy's default does, so figures compare with vLLM's and genai-perf's.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What one request measured. Times are seconds; `start_s` counts from the run's start.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    pub index: usize,
    /// Finished with at least one token and no error.
    pub ok: bool,
    pub error: Option<String>,
    pub start_s: f64,
    /// Send to the end of the response body.
    pub latency_s: f64,
    /// Send to the first event that carried a token.
    pub ttft_s: Option<f64>,
    /// Gaps between token events, an event of k tokens giving k gaps of a k-th each.
    pub itl_s: Vec<f64>,
    /// The server's count (`usage`) when it gives one, else the request's own.
    pub input_tokens: usize,
    /// The server's count (`usage`) when it gives one, else the tokens the events carried.
    pub output_tokens: usize,
    /// `max_tokens` asked for.
    pub expected_output_tokens: usize,
}

impl RequestRecord {
    /// Mean time per output token after the first (vLLM's TPOT).
    pub fn tpot_s(&self) -> Option<f64> {
        let ttft = self.ttft_s?;
        (self.output_tokens > 1).then(|| (self.latency_s - ttft) / (self.output_tokens - 1) as f64)
    }
}

/// The `q`-th percentile (0..=100) of sorted values, interpolated linearly between the
/// two nearest ranks; NaN for no values.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        n => {
            let rank = q.clamp(0.0, 100.0) / 100.0 * (n - 1) as f64;
            let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
            sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
        }
    }
}

/// A distribution's summary, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Dist {
    pub count: usize,
    pub mean: f64,
    pub min: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Dist {
    /// Summarises values given in seconds; None for no values.
    pub fn of_secs(values: impl IntoIterator<Item = f64>) -> Option<Dist> {
        let mut ms: Vec<f64> = values
            .into_iter()
            .map(|s| s * 1e3)
            .filter(|v| v.is_finite())
            .collect();
        if ms.is_empty() {
            return None;
        }
        ms.sort_by(f64::total_cmp);
        Some(Dist {
            count: ms.len(),
            mean: ms.iter().sum::<f64>() / ms.len() as f64,
            min: ms[0],
            p50: percentile(&ms, 50.0),
            p90: percentile(&ms, 90.0),
            p99: percentile(&ms, 99.0),
            max: ms[ms.len() - 1],
        })
    }
}

/// Service-level objectives; a request meets the SLO when it meets every one given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Slo {
    pub ttft_ms: Option<f64>,
    /// Mean time per output token after the first.
    pub tpot_ms: Option<f64>,
    pub latency_ms: Option<f64>,
}

impl Slo {
    pub fn is_set(&self) -> bool {
        self.ttft_ms.is_some() || self.tpot_ms.is_some() || self.latency_ms.is_some()
    }

    pub fn met_by(&self, r: &RequestRecord) -> bool {
        let within = |limit: Option<f64>, secs: Option<f64>| {
            limit.is_none_or(|l| secs.is_some_and(|s| s * 1e3 <= l))
        };
        r.ok && within(self.ttft_ms, r.ttft_s)
            && within(self.tpot_ms, r.tpot_s().or(Some(0.0)))
            && within(self.latency_ms, Some(r.latency_s))
    }
}

/// Requests that met the SLO, and their rate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Goodput {
    pub slo: Slo,
    pub good_requests: usize,
    pub requests_per_s: f64,
}

/// Every figure of a run. Throughput counts completed requests over the run's wall time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub total_requests: usize,
    pub completed: usize,
    pub failed: usize,
    /// First send to last completion (the seed's "Total latency").
    pub duration_s: f64,
    pub requests_per_s: f64,
    pub output_tokens_per_s: f64,
    /// Input and output tokens per second.
    pub total_tokens_per_s: f64,
    pub total_input_tokens: usize,
    pub total_output_tokens: usize,
    pub avg_input_tokens: f64,
    pub avg_output_tokens: f64,
    /// Completed requests whose output length differs from the `max_tokens` asked.
    pub output_length_mismatches: usize,
    /// Sum of request latencies (the seed's "Total request latencies").
    pub sum_latency_ms: f64,
    pub latency_ms: Option<Dist>,
    pub ttft_ms: Option<Dist>,
    pub itl_ms: Option<Dist>,
    pub tpot_ms: Option<Dist>,
    pub goodput: Option<Goodput>,
    /// Distinct error messages with their counts, most frequent first (at most 5).
    pub errors: Vec<(String, usize)>,
}

pub fn summarize(records: &[RequestRecord], duration: Duration, slo: &Slo) -> Summary {
    let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.ok).collect();
    let secs = duration.as_secs_f64().max(1e-9);
    let n = ok.len();
    let total_in: usize = ok.iter().map(|r| r.input_tokens).sum();
    let total_out: usize = ok.iter().map(|r| r.output_tokens).sum();
    let avg = |t: usize| if n == 0 { 0.0 } else { t as f64 / n as f64 };
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    for r in records.iter().filter(|r| !r.ok) {
        let msg = r.error.clone().unwrap_or_else(|| "no output tokens".into());
        *errors.entry(msg.chars().take(240).collect()).or_default() += 1;
    }
    let mut errors: Vec<(String, usize)> = errors.into_iter().collect();
    errors.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    errors.truncate(5);
    let goodput = slo.is_set().then(|| {
        let good = ok.iter().filter(|r| slo.met_by(r)).count();
        Goodput {
            slo: *slo,
            good_requests: good,
            requests_per_s: good as f64 / secs,
        }
    });
    Summary {
        total_requests: records.len(),
        completed: n,
        failed: records.len() - n,
        duration_s: duration.as_secs_f64(),
        requests_per_s: n as f64 / secs,
        output_tokens_per_s: total_out as f64 / secs,
        total_tokens_per_s: (total_in + total_out) as f64 / secs,
        total_input_tokens: total_in,
        total_output_tokens: total_out,
        avg_input_tokens: avg(total_in),
        avg_output_tokens: avg(total_out),
        output_length_mismatches: ok
            .iter()
            .filter(|r| r.output_tokens != r.expected_output_tokens)
            .count(),
        sum_latency_ms: ok.iter().map(|r| r.latency_s * 1e3).sum(),
        latency_ms: Dist::of_secs(ok.iter().map(|r| r.latency_s)),
        ttft_ms: Dist::of_secs(ok.iter().filter_map(|r| r.ttft_s)),
        itl_ms: Dist::of_secs(ok.iter().flat_map(|r| r.itl_s.iter().copied())),
        tpot_ms: Dist::of_secs(ok.iter().filter_map(|r| r.tpot_s())),
        goodput,
        errors,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn percentiles_match_numpy_linear_interpolation() {
        // numpy.percentile([1..=10], q) with the default "linear" method.
        let xs: Vec<f64> = (1..=10).map(f64::from).collect();
        for (q, want) in [
            (0.0, 1.0),
            (50.0, 5.5),
            (90.0, 9.1),
            (99.0, 9.91),
            (100.0, 10.0),
            (25.0, 3.25),
        ] {
            assert!(
                close(percentile(&xs, q), want),
                "p{q}: {}",
                percentile(&xs, q)
            );
        }
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert!(percentile(&[], 50.0).is_nan());
        assert!(close(percentile(&[0.0, 100.0], 99.0), 99.0));
        // 1..=1000: p99 sits between 990 and 991.
        let big: Vec<f64> = (1..=1000).map(f64::from).collect();
        assert!(close(percentile(&big, 99.0), 990.01));
        assert!(close(percentile(&big, 90.0), 900.1));
    }

    #[test]
    fn dist_sorts_and_converts_to_ms() {
        let d = Dist::of_secs([0.003, 0.001, 0.002, 0.004]).unwrap();
        assert_eq!((d.count, d.min, d.max), (4, 1.0, 4.0));
        assert!(close(d.mean, 2.5) && close(d.p50, 2.5) && close(d.p90, 3.7) && close(d.p99, 3.97));
        assert!(Dist::of_secs([]).is_none());
    }

    fn rec(ok: bool, latency: f64, ttft: f64, out: usize) -> RequestRecord {
        RequestRecord {
            ok,
            error: (!ok).then(|| "HTTP 503: busy".into()),
            latency_s: latency,
            ttft_s: ok.then_some(ttft),
            itl_s: if ok {
                vec![(latency - ttft) / (out - 1) as f64; out - 1]
            } else {
                vec![]
            },
            input_tokens: 100,
            output_tokens: if ok { out } else { 0 },
            expected_output_tokens: 10,
            ..Default::default()
        }
    }

    #[test]
    fn summary_counts_only_completed_requests_and_reports_failures() {
        let records = vec![
            rec(true, 1.0, 0.1, 10),
            rec(true, 2.0, 0.2, 10),
            rec(false, 0.5, 0.0, 1),
            rec(true, 1.5, 0.3, 4),
        ];
        let s = summarize(&records, Duration::from_secs(4), &Slo::default());
        assert_eq!((s.total_requests, s.completed, s.failed), (4, 3, 1));
        assert!(close(s.requests_per_s, 0.75));
        assert!(close(s.output_tokens_per_s, 24.0 / 4.0));
        assert!(close(s.avg_input_tokens, 100.0) && close(s.avg_output_tokens, 8.0));
        assert_eq!(s.output_length_mismatches, 1);
        assert!(close(s.sum_latency_ms, 4500.0));
        assert_eq!(s.errors, vec![("HTTP 503: busy".to_string(), 1)]);
        let ttft = s.ttft_ms.unwrap();
        assert!(close(ttft.p50, 200.0) && close(ttft.mean, 200.0));
        // TPOT of the first request: 0.9 s over 9 tokens.
        assert!(close(s.tpot_ms.unwrap().min, 100.0));
        assert_eq!(s.itl_ms.unwrap().count, 9 + 9 + 3);
        assert!(s.goodput.is_none());
    }

    #[test]
    fn goodput_counts_requests_meeting_every_slo() {
        let records = vec![
            rec(true, 1.0, 0.1, 10),
            rec(true, 2.0, 0.2, 10),
            rec(false, 0.5, 0.0, 1),
            rec(true, 1.5, 0.3, 4),
        ];
        let slo = Slo {
            ttft_ms: Some(250.0),
            tpot_ms: None,
            latency_ms: Some(1800.0),
        };
        let g = summarize(&records, Duration::from_secs(2), &slo)
            .goodput
            .unwrap();
        // The first meets both; the second is too slow overall; the last starts too late.
        assert_eq!(g.good_requests, 1);
        assert!(close(g.requests_per_s, 0.5));
        let tpot = Slo {
            tpot_ms: Some(250.0),
            ..Slo::default()
        };
        assert_eq!(
            summarize(&records, Duration::from_secs(2), &tpot)
                .goodput
                .unwrap()
                .good_requests,
            2
        );
    }

    #[test]
    fn an_all_failed_run_has_no_distributions() {
        let s = summarize(
            &[rec(false, 0.1, 0.0, 1)],
            Duration::from_millis(100),
            &Slo::default(),
        );
        assert_eq!((s.completed, s.failed), (0, 1));
        assert!(s.latency_ms.is_none() && s.ttft_ms.is_none());
        assert_eq!(s.requests_per_s, 0.0);
    }
}
