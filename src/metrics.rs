//! Every metric the server exports, described in one place. Triton's names for
//! compatibility (`nv_inference_*` per served model, `nv_trt_llm_*` for the batcher and
//! KV cache, labelled `model="tensorrt_llm",version="1"`), and our own `inflight_*`
//! latency histograms beside them. Each server has its own recorder (no global state), so
//! several servers can live in one process (the tests do).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use metrics::{Key, Label, Level, Metadata, Recorder, Unit};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

use crate::request::FinishReason;
use crate::scheduler::SchedulerStats;

static META: Metadata<'static> = Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// Buckets for latencies in seconds, from 1 ms to 2 minutes.
const LATENCY_BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// Buckets for the fraction of draft tokens accepted.
const ACCEPTANCE_BUCKETS: [f64; 10] = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0];
const ACCEPTANCE_RATE: &str = "inflight_spec_decode_acceptance_rate";

/// How a request ended, for the success and failure counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Success,
    /// Refused before running (full queue, not ready).
    Rejected,
    Cancelled,
    /// The engine failed.
    Backend,
    /// Bad input.
    Other,
}

impl Outcome {
    pub fn of(reason: Option<FinishReason>) -> Self {
        match reason {
            Some(FinishReason::Stop) | Some(FinishReason::Length) => Outcome::Success,
            Some(FinishReason::Cancelled) => Outcome::Cancelled,
            Some(FinishReason::Error) | None => Outcome::Backend,
        }
    }
}

/// Timing of one request, as seen by the client.
#[derive(Debug, Clone)]
pub struct RequestTiming {
    pub arrived: Instant,
    pub first_token: Option<Instant>,
    pub last_token: Option<Instant>,
    /// Gaps between token-bearing chunks, divided by the tokens each carried.
    pub inter_token: Vec<Duration>,
    pub output_tokens: usize,
}

impl RequestTiming {
    pub fn start() -> Self {
        RequestTiming {
            arrived: Instant::now(),
            first_token: None,
            last_token: None,
            inter_token: Vec::new(),
            output_tokens: 0,
        }
    }

    /// Notes a chunk that carried `tokens` new tokens; `first_at` is when the first of
    /// them was produced, for a chunk that accumulated several (the gaps are then spread
    /// evenly between it and now).
    pub fn tokens(&mut self, tokens: usize, first_at: Option<Instant>) {
        if tokens == 0 {
            return;
        }
        let now = Instant::now();
        if let (None, Some(first)) = (self.last_token, first_at) {
            self.first_token = Some(first);
            if tokens > 1 {
                let gap = now.duration_since(first) / (tokens - 1) as u32;
                self.inter_token
                    .extend(std::iter::repeat_n(gap, tokens - 1));
            }
            self.last_token = Some(now);
            self.output_tokens += tokens;
            return;
        }
        match self.last_token {
            None => self.first_token = Some(now),
            Some(prev) => {
                let gap = now.duration_since(prev) / tokens as u32;
                self.inter_token.extend(std::iter::repeat_n(gap, tokens));
            }
        }
        self.last_token = Some(now);
        self.output_tokens += tokens;
    }

    pub fn ttft(&self) -> Option<Duration> {
        self.first_token.map(|t| t.duration_since(self.arrived))
    }
}

/// The server's metrics.
pub struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let recorder = PrometheusBuilder::new()
            .set_buckets(&LATENCY_BUCKETS)
            .expect("non-empty buckets")
            .set_buckets_for_metric(Matcher::Full(ACCEPTANCE_RATE.into()), &ACCEPTANCE_BUCKETS)
            .expect("non-empty buckets")
            .build_recorder();
        let handle = recorder.handle();
        let m = Metrics { recorder, handle };
        m.describe();
        m
    }

    fn describe(&self) {
        let r = &self.recorder;
        let c = |name: &'static str, help: &'static str| {
            r.describe_counter(name.into(), None, help.into())
        };
        c(
            "nv_inference_request_success",
            "Number of successful inference requests, all batch sizes",
        );
        c(
            "nv_inference_request_failure",
            "Number of failed inference requests, all batch sizes",
        );
        c(
            "nv_inference_count",
            "Number of inferences performed (batch elements)",
        );
        c(
            "nv_inference_exec_count",
            "Number of model executions performed (engine iterations)",
        );
        c(
            "nv_inference_request_duration_us",
            "Cumulative inference request duration in microseconds",
        );
        c(
            "nv_inference_queue_duration_us",
            "Cumulative time requests spend waiting to be scheduled, in microseconds",
        );
        c(
            "inflight_engine_compute_duration_us",
            "Cumulative time engine iterations spent in the forward pass (and sampling on the \
             device), in microseconds",
        );
        c(
            "inflight_engine_wait_duration_us",
            "Cumulative time the engine waited between back-to-back iterations (host sampling, \
             scheduling, drafting, messages), in microseconds; on a GPU, the device's own idle \
             time between them, measured with events",
        );
        c(
            "inflight_engine_wait_count",
            "Back-to-back engine iterations whose wait is counted",
        );
        c(
            "inflight_iterations_planned_ahead_total",
            "Engine iterations planned while the previous one ran (overlap): their decodes \
             took that iteration's tokens on the device, so it never waited for the host",
        );
        c(
            "inflight_preemptions_total",
            "Running sequences preempted by recompute to free KV cache blocks \
             (max_utilization); each is recomputed from its prompt and outputs later",
        );
        c(
            "inflight_preempted_tokens_total",
            "Computed tokens whose KV cache preemption discarded: the prefill work that \
             recompute repeats",
        );
        c(
            "inflight_long_rope_restarts_total",
            "Sequences computed again from their first token with LongRoPE's long factors \
             when a decode crossed the model's original context (Phi-3), as transformers does",
        );
        c(
            "inflight_swap_preemptions_total",
            "Running sequences preempted by swapping their KV cache blocks out to the host \
             cache (max_utilization with kv_cache_host_memory_bytes); nothing is recomputed",
        );
        c(
            "inflight_kv_blocks_swapped_out_total",
            "KV cache blocks copied to the host cache by preemption",
        );
        c(
            "inflight_kv_blocks_swapped_in_total",
            "KV cache blocks copied back from the host cache when a swapped sequence resumed",
        );
        c(
            "inflight_kv_blocks_offloaded_total",
            "Cached KV cache blocks evicted from the device cache and copied to the prefix \
             cache's host tier (kv_cache_host_memory_bytes)",
        );
        c(
            "inflight_kv_blocks_onloaded_total",
            "KV cache blocks of a prompt's prefix found in the host tier and copied back \
             instead of computed",
        );
        c(
            "inflight_prefix_cache_queries_total",
            "Prompt (and recomputed) tokens of sequences admitted, each looked up in the \
             prefix cache",
        );
        c(
            "inflight_prefix_cache_hits_total",
            "Of those, tokens whose KV cache blocks were found in the prefix cache and \
             reused instead of computed",
        );
        r.describe_gauge(
            "inflight_kv_cache_reusable_blocks".into(),
            None,
            "KV cache blocks holding a full computed prefix that later requests may reuse \
             (held by sequences, or reclaimable when memory is needed)"
                .into(),
        );
        r.describe_gauge(
            "inflight_kv_cache_host_reusable_blocks".into(),
            None,
            "Blocks of the prefix cache's host tier: prefixes evicted from the device cache \
             that a hit copies back instead of computing"
                .into(),
        );
        c(
            "inflight_spec_decode_steps_total",
            "Target steps that verified draft tokens (speculative decoding)",
        );
        c(
            "inflight_spec_decode_draft_tokens_total",
            "Draft tokens proposed to the target model (speculative decoding)",
        );
        c(
            "inflight_spec_decode_accepted_tokens_total",
            "Draft tokens the target model accepted (speculative decoding)",
        );
        r.describe_histogram(
            ACCEPTANCE_RATE.into(),
            None,
            "Fraction of its draft tokens each speculative prompt accepted".into(),
        );
        let g = |name: &'static str, help: &'static str| {
            r.describe_gauge(name.into(), None, help.into())
        };
        g(
            "nv_inference_pending_request_count",
            "Instantaneous number of pending requests awaiting execution",
        );
        g("nv_trt_llm_request_metrics", "TRT LLM request metrics");
        g(
            "nv_trt_llm_runtime_memory_metrics",
            "TRT LLM runtime memory metrics",
        );
        g(
            "nv_trt_llm_kv_cache_block_metrics",
            "TRT LLM KV cache block metrics",
        );
        g(
            "nv_trt_llm_inflight_batcher_metrics",
            "TRT LLM inflight batcher metrics",
        );
        g("nv_trt_llm_general_metrics", "General TRT LLM metrics");
        let h = |name: &'static str, help: &'static str| {
            r.describe_histogram(name.into(), Some(Unit::Seconds), help.into())
        };
        h(
            "inflight_time_to_first_token_seconds",
            "Time from a request's arrival to its first output token",
        );
        h(
            "inflight_inter_token_latency_seconds",
            "Time between consecutive output tokens of a request",
        );
        h(
            "inflight_e2e_request_latency_seconds",
            "Time from a request's arrival to its last chunk",
        );
    }

    fn key(name: &'static str, labels: &[(&'static str, String)]) -> Key {
        Key::from_parts(
            name,
            labels
                .iter()
                .map(|(k, v)| Label::new(*k, v.clone()))
                .collect::<Vec<_>>(),
        )
    }

    fn counter(&self, name: &'static str, labels: &[(&'static str, String)], by: u64) {
        self.recorder
            .register_counter(&Self::key(name, labels), &META)
            .increment(by);
    }

    fn gauge(&self, name: &'static str, labels: &[(&'static str, String)], value: f64) {
        self.recorder
            .register_gauge(&Self::key(name, labels), &META)
            .set(value);
    }

    fn histogram(&self, name: &'static str, model: &str, value: f64) {
        let labels = [("model", model.to_string())];
        self.recorder
            .register_histogram(&Self::key(name, &labels), &META)
            .record(value);
    }

    /// Records the speculative decoding of one finished prompt of `model`.
    pub fn speculative(&self, model: &str, steps: usize, proposed: usize, accepted: usize) {
        if proposed == 0 {
            return;
        }
        let labels = [("model", model.to_string()), ("version", "1".to_string())];
        self.counter("inflight_spec_decode_steps_total", &labels, steps as u64);
        self.counter(
            "inflight_spec_decode_draft_tokens_total",
            &labels,
            proposed as u64,
        );
        self.counter(
            "inflight_spec_decode_accepted_tokens_total",
            &labels,
            accepted as u64,
        );
        self.histogram(ACCEPTANCE_RATE, model, accepted as f64 / proposed as f64);
    }

    /// Records a finished (or refused) request of `model` with `prompts` batch elements.
    /// As in Triton, a request to an ensemble (or a BLS model) counts for it and for its
    /// composing model (`composing`: its model's token-ids name, `tensorrt_llm` by default).
    pub fn request_done(
        &self,
        (model, composing): (&str, Option<&str>),
        outcome: Outcome,
        prompts: usize,
        timing: &RequestTiming,
        queue: Duration,
    ) {
        self.request_counters(model, outcome, prompts, timing, queue);
        if let Some(core) = composing.filter(|c| *c != model) {
            self.request_counters(core, outcome, prompts, timing, queue);
        }
        if outcome == Outcome::Rejected || outcome == Outcome::Other {
            return;
        }
        if let Some(t) = timing.ttft() {
            self.histogram(
                "inflight_time_to_first_token_seconds",
                model,
                t.as_secs_f64(),
            );
        }
        for gap in &timing.inter_token {
            self.histogram(
                "inflight_inter_token_latency_seconds",
                model,
                gap.as_secs_f64(),
            );
        }
        self.histogram(
            "inflight_e2e_request_latency_seconds",
            model,
            timing.arrived.elapsed().as_secs_f64(),
        );
    }

    fn request_counters(
        &self,
        model: &str,
        outcome: Outcome,
        prompts: usize,
        timing: &RequestTiming,
        queue: Duration,
    ) {
        let labels = [("model", model.to_string()), ("version", "1".to_string())];
        match outcome {
            Outcome::Success => self.counter("nv_inference_request_success", &labels, 1),
            other => {
                let reason = match other {
                    Outcome::Rejected => "REJECTED",
                    Outcome::Cancelled => "CANCELED",
                    Outcome::Backend => "BACKEND",
                    _ => "OTHER",
                };
                let l = [
                    labels[0].clone(),
                    labels[1].clone(),
                    ("reason", reason.to_string()),
                ];
                self.counter("nv_inference_request_failure", &l, 1);
            }
        }
        if outcome == Outcome::Rejected || outcome == Outcome::Other {
            return;
        }
        self.counter("nv_inference_count", &labels, prompts as u64);
        let total = timing.arrived.elapsed();
        self.counter(
            "nv_inference_request_duration_us",
            &labels,
            total.as_micros() as u64,
        );
        self.counter(
            "nv_inference_queue_duration_us",
            &labels,
            queue.as_micros() as u64,
        );
    }

    /// Sets the batcher and KV cache gauges from one model's scheduler counts (at scrape
    /// time): TRT-LLM's `nv_trt_llm_*` and the execution counters labelled with its `core`
    /// name, the pending counts with each of its `models` names. The KV cache's `kv_bytes`
    /// count as GPU memory when `kv_on_gpu`, else as host memory.
    pub fn scheduler(
        &self,
        (models, core): (&[&str], &str),
        s: &SchedulerStats,
        iterations_total: u64,
        kv_bytes: usize,
        kv_on_gpu: bool,
    ) {
        let used = s.total_blocks - s.free_blocks;
        let hit_rate = if s.prefix_queried_tokens == 0 {
            0.0
        } else {
            s.prefix_hit_tokens as f64 / s.prefix_queried_tokens as f64
        };
        let fraction = if s.total_blocks == 0 {
            0.0
        } else {
            used as f64 / s.total_blocks as f64
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let (cpu_bytes, gpu_bytes) = if kv_on_gpu {
            (0, kv_bytes)
        } else {
            (kv_bytes, 0)
        };
        let (req, kv, ib, gen, mem) = (
            "request_type",
            "kv_cache_block_type",
            "inflight_batcher_specific_metric",
            "general_type",
            "memory_type",
        );
        let (requests, blocks, batcher, general, memory) = (
            "nv_trt_llm_request_metrics",
            "nv_trt_llm_kv_cache_block_metrics",
            "nv_trt_llm_inflight_batcher_metrics",
            "nv_trt_llm_general_metrics",
            "nv_trt_llm_runtime_memory_metrics",
        );
        // (metric, label key, label value, value), labelled as TRT-LLM's backend does.
        let gauges = [
            (requests, req, "active", s.active_requests as f64),
            (requests, req, "max", s.max_batch_size as f64),
            (requests, req, "scheduled", s.running as f64),
            (requests, req, "context", s.context_requests as f64),
            (requests, req, "waiting", s.waiting as f64),
            (blocks, kv, "max", s.total_blocks as f64),
            (blocks, kv, "free", s.free_blocks as f64),
            (blocks, kv, "used", used as f64),
            (blocks, kv, "tokens_per", s.block_size as f64),
            (blocks, kv, "fraction", fraction),
            (
                blocks,
                kv,
                "reused",
                (s.prefix_hit_tokens / s.block_size.max(1) as u64) as f64,
            ),
            (blocks, kv, "cache_hit_rate", hit_rate),
            (batcher, ib, "micro_batch_id", 0.0),
            (
                batcher,
                ib,
                "generation_requests",
                s.generation_requests as f64,
            ),
            (batcher, ib, "total_context_tokens", s.context_tokens as f64),
            (general, gen, "iteration_counter", iterations_total as f64),
            (general, gen, "timestamp", now.as_micros() as f64),
            (memory, mem, "cpu", cpu_bytes as f64),
            (memory, mem, "gpu", gpu_bytes as f64),
            (memory, mem, "pinned", 0.0),
        ];
        for (name, key, label, value) in gauges {
            let labels = [
                (key, label.to_string()),
                ("model", core.to_string()),
                ("version", "1".to_string()),
            ];
            self.gauge(name, &labels, value);
        }
        self.gauge(
            "inflight_kv_cache_reusable_blocks",
            &[("model", core.to_string()), ("version", "1".to_string())],
            s.cached_blocks as f64,
        );
        self.gauge(
            "inflight_kv_cache_host_reusable_blocks",
            &[("model", core.to_string()), ("version", "1".to_string())],
            s.host_cached_blocks as f64,
        );
        for model in models {
            let labels = [("model", model.to_string()), ("version", "1".to_string())];
            self.gauge(
                "nv_inference_pending_request_count",
                &labels,
                s.waiting as f64,
            );
        }
        // Every engine iteration is one model execution of the composing model.
        let exec = [("model", core.to_string()), ("version", "1".to_string())];
        let t = &s.engine_time;
        let counters = [
            ("nv_inference_exec_count", iterations_total),
            (
                "inflight_engine_compute_duration_us",
                t.compute.as_micros() as u64,
            ),
            (
                "inflight_engine_wait_duration_us",
                t.wait.as_micros() as u64,
            ),
            ("inflight_engine_wait_count", t.waits),
            ("inflight_preemptions_total", s.preemptions),
            ("inflight_preempted_tokens_total", s.preempted_tokens),
            ("inflight_swap_preemptions_total", s.swap_outs),
            ("inflight_long_rope_restarts_total", s.long_rope_restarts),
            ("inflight_kv_blocks_swapped_out_total", s.blocks_swapped_out),
            ("inflight_kv_blocks_swapped_in_total", s.blocks_swapped_in),
            ("inflight_iterations_planned_ahead_total", s.planned_ahead),
            (
                "inflight_prefix_cache_queries_total",
                s.prefix_queried_tokens,
            ),
            ("inflight_prefix_cache_hits_total", s.prefix_hit_tokens),
            ("inflight_kv_blocks_offloaded_total", s.blocks_offloaded),
            ("inflight_kv_blocks_onloaded_total", s.blocks_onloaded),
        ];
        for (name, value) in counters {
            let key = Self::key(name, &exec);
            self.recorder.register_counter(&key, &META).absolute(value);
        }
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        self.handle.render()
    }
}
