//! Criterion: the scheduler's cost per iteration with 256 running sequences in decode
//! (one `schedule` plus one `update`, finished sequences replaced so the batch stays
//! full), and the block manager's allocate/free.
//!
//! `cargo bench --bench scheduler`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use inflight::scheduler::{
    BlockManager, SampledToken, Scheduler, SchedulerConfig, SeqEvent, SeqSpec, StepOutput,
};

const RUNNING: usize = 256;
const PROMPT: usize = 128;
/// Long enough that few sequences finish during a measurement; those that do are replaced.
const MAX_NEW: usize = 2048;

fn spec(id: u64) -> SeqSpec {
    SeqSpec {
        id,
        prompt: (0..PROMPT as u32).map(|t| t + id as u32).collect(),
        max_new_tokens: MAX_NEW,
        num_draft_tokens: 0,
        cache_salt: 0,
        priority: 0,
        beam_width: 1,
    }
}

/// A scheduler with `RUNNING` sequences admitted and prefilled.
fn full_scheduler() -> (Scheduler, u64) {
    let blocks_per_seq = (PROMPT + MAX_NEW).div_ceil(32);
    let mut s = Scheduler::new(SchedulerConfig {
        max_batch_size: RUNNING,
        max_num_tokens: RUNNING * PROMPT,
        num_blocks: RUNNING * blocks_per_seq * 2,
        ..SchedulerConfig::default()
    })
    .expect("valid config");
    for id in 0..RUNNING as u64 {
        s.add(spec(id)).expect("admitted");
    }
    let batch = s.schedule();
    assert_eq!(batch.seqs.len(), RUNNING);
    s.update(&batch, &sample(&batch));
    (s, RUNNING as u64)
}

/// The sampler's answer: one token for every chunk that samples.
fn sample(batch: &inflight::scheduler::Batch) -> StepOutput {
    let tokens = batch
        .seqs
        .iter()
        .filter(|c| c.sample)
        .map(|c| SampledToken {
            id: c.id,
            accepted: Vec::new(),
            token: 7,
            stop: false,
        })
        .collect();
    StepOutput { tokens }
}

fn iteration(c: &mut Criterion) {
    let (mut s, mut next_id) = full_scheduler();
    c.bench_function(
        "scheduler iteration, 256 running (schedule + update)",
        |b| {
            b.iter(|| {
                let batch = s.schedule();
                let out = sample(&batch);
                let events = s.update(black_box(&batch), &out);
                for e in &events {
                    if let SeqEvent::Finished { .. } = e {
                        s.add(spec(next_id)).expect("room for a replacement");
                        next_id += 1;
                    }
                }
                black_box(events.len())
            })
        },
    );
    assert!(s.num_running() >= RUNNING - 1);
}

fn block_manager(c: &mut Criterion) {
    let mut g = c.benchmark_group("block manager");
    g.bench_function("allocate 8 + free 8 (4096 blocks)", |b| {
        let mut m = BlockManager::new(4096, 32);
        b.iter(|| {
            let blocks = m.allocate(black_box(8)).expect("free blocks");
            m.free(&blocks);
        })
    });
    g.bench_function("fill 256 sequences x 8 blocks, then free all", |b| {
        b.iter_batched_ref(
            || BlockManager::new(4096, 32),
            |m| {
                let held: Vec<Vec<u32>> = (0..256).map(|_| m.allocate(8).expect("fits")).collect();
                for blocks in &held {
                    m.free(blocks);
                }
                black_box(m.num_free())
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, iteration, block_manager);
criterion_main!(benches);
