//! Drives the traffic: warm-up requests first (not measured), then every measured
//! request at its arrival time (open loop) with at most `concurrency` in flight (closed
//! loop when arrivals are immediate), a progress bar, and the records in request order.

use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::client::Target;
use super::conversation::{self, Conversation};
use super::dataset::BenchRequest;
use super::stats::RequestRecord;

/// Everything a run sends, decided before the first request.
#[derive(Debug, Clone)]
pub struct Plan {
    pub warmup: Vec<BenchRequest>,
    pub requests: Vec<BenchRequest>,
    /// A chat replay's conversations, sent instead of `requests` when there are any.
    pub conversations: Vec<Conversation>,
    /// Gap before each request of `requests` (each conversation's start).
    pub gaps: Vec<Duration>,
    /// Requests in flight at most; None for no cap.
    pub concurrency: Option<usize>,
}

/// The measured part of a run.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// In request order.
    pub records: Vec<RequestRecord>,
    /// First send to last completion.
    pub duration: Duration,
    /// Warm-up requests that failed (reported, never counted).
    pub warmup_failures: usize,
}

pub async fn execute(
    target: Arc<Target>,
    http: reqwest::Client,
    plan: Plan,
    show_progress: bool,
) -> Outcome {
    let warmup = run_batch(
        &target,
        &http,
        &plan.warmup,
        &vec![Duration::ZERO; plan.warmup.len()],
        plan.concurrency,
        None,
    )
    .await;
    let warmup_failures = warmup.0.iter().filter(|r| !r.ok).count();
    let turns: usize = plan.conversations.iter().map(|c| c.users.len()).sum();
    let bar = progress(plan.requests.len() + turns, show_progress);
    let (records, duration) = if plan.conversations.is_empty() {
        run_batch(
            &target,
            &http,
            &plan.requests,
            &plan.gaps,
            plan.concurrency,
            Some(&bar),
        )
        .await
    } else {
        conversation::replay(
            &target,
            &http,
            &plan.conversations,
            &plan.gaps,
            plan.concurrency,
            &bar,
        )
        .await
    };
    bar.finish_and_clear();
    Outcome {
        records,
        duration,
        warmup_failures,
    }
}

fn progress(n: usize, show: bool) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(n as u64);
    let style = ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} eta {eta} {msg}",
    )
    .expect("valid template");
    bar.set_style(style);
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// Sends `requests` on their schedule; returns their records and the wall time from the
/// first send to the last completion.
async fn run_batch(
    target: &Arc<Target>,
    http: &reqwest::Client,
    requests: &[BenchRequest],
    gaps: &[Duration],
    concurrency: Option<usize>,
    bar: Option<&ProgressBar>,
) -> (Vec<RequestRecord>, Duration) {
    let slots = concurrency.map(|n| Arc::new(Semaphore::new(n.max(1))));
    let t0 = Instant::now();
    let mut due = tokio::time::Instant::now();
    let mut tasks = JoinSet::new();
    let mut failed = 0;
    let mut records = Vec::with_capacity(requests.len());
    for (i, (req, gap)) in requests.iter().zip(gaps).enumerate() {
        due += *gap;
        tokio::time::sleep_until(due).await;
        let permit = match &slots {
            Some(s) => Some(
                s.clone()
                    .acquire_owned()
                    .await
                    .expect("the semaphore is never closed"),
            ),
            None => None,
        };
        let (target, http, req) = (target.clone(), http.clone(), req.clone());
        tasks.spawn(async move {
            let rec = target.send(&http, i, &req, t0).await;
            drop(permit);
            rec
        });
        // Collect what has finished meanwhile, so the bar moves while requests are sent.
        while let Some(done) = tasks.try_join_next() {
            records.push(tick(done, bar, &mut failed));
        }
    }
    while let Some(done) = tasks.join_next().await {
        records.push(tick(done, bar, &mut failed));
    }
    records.sort_by_key(|r| r.index);
    let span = span(&records);
    (records, span)
}

/// Wall time from the first send to the last completion, over the records of requests
/// that were sent (a lost task's record has no start).
pub(super) fn span(records: &[RequestRecord]) -> Duration {
    let sent = || records.iter().filter(|r| r.latency_s > 0.0);
    let first = sent().map(|r| r.start_s).fold(f64::INFINITY, f64::min);
    let last = sent().map(|r| r.start_s + r.latency_s).fold(0.0, f64::max);
    Duration::from_secs_f64((last - first).max(0.0))
}

fn tick(
    done: Result<RequestRecord, tokio::task::JoinError>,
    bar: Option<&ProgressBar>,
    failed: &mut usize,
) -> RequestRecord {
    let rec = done.unwrap_or_else(|e| RequestRecord {
        error: Some(format!("request task failed: {e}")),
        ..Default::default()
    });
    if let Some(bar) = bar {
        if !rec.ok {
            *failed += 1;
            bar.set_message(format!("{failed} failed"));
        }
        bar.inc(1);
    }
    rec
}
