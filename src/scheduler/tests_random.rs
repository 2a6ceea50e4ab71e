//! Randomized test: thousands of seeded add / schedule / update / cancel operations
//! under both policies, chunking on and off, with a fake engine that writes every
//! computed token into a simulated paged KV pool and, before sampling, reads the whole
//! context back through the block table. Some requests speculate: the fake engine
//! writes random draft tokens after their last known one and accepts a random prefix. Checked after every step: the invariants of
//! `checks::check_invariants`, the batch limits, the engine's view of the KV cache, the
//! event stream; at the end, that every request finished or was cancelled. Runs with
//! overlap plan the next batch ahead of the one in flight (`schedule_ahead`): the fake
//! engine feeds a continued sequence the token the in-flight batch sampled.

use super::checks::{check_batch, check_invariants};
use super::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{HashMap, HashSet, VecDeque};

/// The test's own record of each accepted request.
#[derive(Default)]
struct Oracle {
    /// Known tokens per live request, grown from `Token` events.
    known: HashMap<u64, Vec<u32>>,
    /// (prompt length, max_new_tokens) per live request.
    limits: HashMap<u64, (usize, usize)>,
    accepted: HashSet<u64>,
    ended: HashSet<u64>,
    /// Cache salt per accepted request.
    salts: HashMap<u64, u64>,
}

/// A fake engine over a simulated KV pool: slot -> what a real K/V there would stand for
/// (a hash of the sequence's cache salt and every token up to that position: prefix
/// caching may share it between sequences of the same salt, never others), and a host
/// pool that preempted sequences' blocks are swapped to.
struct Engine {
    pool: Vec<Option<u64>>,
    host: Vec<Option<u64>>,
    block_size: usize,
    /// The window its attention reads (the config's `kv_window`).
    window: Option<usize>,
}

/// The content of each position of `tokens` for a sequence with `salt`.
fn contents(salt: u64, tokens: &[u32]) -> Vec<u64> {
    use std::hash::{Hash, Hasher};
    let mut h = salt;
    tokens
        .iter()
        .map(|t| {
            let mut s = std::hash::DefaultHasher::new();
            (h, t).hash(&mut s);
            h = s.finish();
            h
        })
        .collect()
}

impl Engine {
    fn new(config: &SchedulerConfig) -> Self {
        Engine {
            pool: vec![None; config.num_blocks * config.block_size],
            host: vec![None; config.num_host_blocks * config.block_size],
            block_size: config.block_size,
            window: config.kv_window,
        }
    }
}

impl Engine {
    /// Writes every chunk's tokens (and drafts), checks the context read back before
    /// sampling, and samples (accepting some drafts, sometimes stopping, rarely losing
    /// the token). A chunk planned ahead takes its token from `prev`, the output of the
    /// batch still in flight, as a device would.
    fn execute(
        &mut self,
        batch: &Batch,
        prev: Option<&StepOutput>,
        oracle: &Oracle,
        rng: &mut StdRng,
    ) -> StepOutput {
        let bs = self.block_size;
        let slot = |table: &[u32], pos: usize| table[pos / bs] as usize * bs + pos % bs;
        for copy in &batch.swaps {
            let (d, h) = (copy.device as usize * bs, copy.host as usize * bs);
            if copy.to_host {
                self.host[h..h + bs].copy_from_slice(&self.pool[d..d + bs]);
            } else {
                self.pool[d..d + bs].copy_from_slice(&self.host[h..h + bs]);
            }
        }
        let mut out = StepOutput::default();
        for c in &batch.seqs {
            let mut known = oracle.known[&c.id].clone();
            let mut tokens = c.tokens.clone();
            if c.tokens == [PENDING_TOKEN] {
                assert_eq!(
                    c.start_pos,
                    known.len(),
                    "continues right after the known tokens"
                );
                assert!(prev.is_some(), "planned ahead of a batch in flight");
                let Some(sampled) = prev.and_then(|p| p.tokens.iter().find(|t| t.id == c.id))
                else {
                    // That batch lost the token: this chunk is stale, its update ignored.
                    continue;
                };
                assert!(
                    sampled.accepted.is_empty(),
                    "no continuation of a speculating seq"
                );
                tokens = vec![sampled.token];
                known.push(sampled.token);
            }
            let salt = oracle.salts[&c.id];
            let end = c.start_pos + tokens.len();
            let mut written = known[..c.start_pos].to_vec();
            written.extend(&tokens);
            let content = contents(salt, &written);
            for (pos, &k) in content.iter().enumerate().skip(c.start_pos) {
                self.pool[slot(&c.block_table, pos)] = Some(k);
            }
            if !c.sample {
                continue;
            }
            // The sampling query, at end - 1, reads its window (a block given back before
            // it would be an index past the pool here).
            let first = self.window.map_or(0, |w| end.saturating_sub(w));
            let want = contents(salt, &known[..end]);
            for (pos, &w) in want.iter().enumerate().skip(first) {
                let got = self.pool[slot(&c.block_table, pos)];
                assert_eq!(got, Some(w), "seq {} KV at {pos} corrupted", c.id);
            }
            let draft: Vec<u32> = (0..c.max_draft).map(|_| rng.gen_range(0..50_000)).collect();
            written.extend(&draft);
            let content = contents(salt, &written);
            for i in 0..draft.len() {
                self.pool[slot(&c.block_table, end + i)] = Some(content[end + i]);
            }
            if rng.gen_bool(0.02) {
                continue;
            }
            let accepted = draft[..rng.gen_range(0..=draft.len())].to_vec();
            out.tokens.push(SampledToken {
                id: c.id,
                accepted,
                token: rng.gen_range(0..50_000),
                stop: rng.gen_bool(0.04),
            });
        }
        out
    }
}

fn random_config(rng: &mut StdRng, policy: SchedulerPolicy, chunked: bool) -> SchedulerConfig {
    let mut c = SchedulerConfig {
        max_batch_size: rng.gen_range(1..=8),
        max_num_tokens: rng.gen_range(4..=64),
        max_queue_size: rng.gen_range(1..=16),
        max_queued_tokens: 0,
        policy,
        enable_chunked_context: chunked,
        block_size: [1, 2, 4, 8, 16][rng.gen_range(0..5)],
        num_blocks: rng.gen_range(4..=64),
        num_host_blocks: [0, 2, 8, 64][rng.gen_range(0..4)],
        max_seq_len: rng.gen_range(2..=96),
        enable_kv_cache_reuse: true,
        overlap: true,
        kv_window: None,
        long_rope_from: None,
    };
    // A sliding window in some configs, chosen from what was drawn (a draw of its own
    // would change every seed's scenario).
    c.kv_window = [None, None, Some(3), Some(8), Some(20)][(c.num_blocks + c.max_seq_len) % 5];
    // LongRoPE's original context likewise.
    c.long_rope_from = [None, None, Some(10), Some(30)][(c.max_num_tokens + c.block_size) % 4];
    c
}

/// Schedules (ahead of `prev`, the batch in flight, when given), runs the engine and
/// checks the batch against the oracle.
fn schedule(
    s: &mut Scheduler,
    engine: &mut Engine,
    oracle: &Oracle,
    rng: &mut StdRng,
    prev: Option<&StepOutput>,
) -> (Batch, StepOutput) {
    let idle = s.running.iter().all(|q| q.in_flight.is_none());
    let had_work = s.num_running() + s.num_waiting() > 0;
    let restarts = s.num_long_rope_restarts();
    // Some sequences' sampling depends on the pending token: they are not continued.
    let batch = match prev {
        Some(_) => s.schedule_ahead(|id| id % 3 != 0),
        None => s.schedule(),
    };
    check_batch(s, &batch);
    check_invariants(s);
    if idle && had_work {
        assert!(
            !batch.seqs.is_empty(),
            "work pending but nothing scheduled: {:?} waiting {:?} running {:?}",
            s.config,
            s.waiting
                .iter()
                .map(|q| (q.id, q.num_known(), q.max_len, q.long_rope))
                .collect::<Vec<_>>(),
            s.running
                .iter()
                .map(|q| (q.id, q.num_computed, q.num_known(), q.long_rope))
                .collect::<Vec<_>>()
        );
    }
    if s.config.policy == SchedulerPolicy::GuaranteedNoEvict {
        // Only sequences computed again with LongRoPE's long factors.
        let restarted = (s.num_long_rope_restarts() - restarts) as usize;
        assert_eq!(
            batch.preempted.len(),
            restarted,
            "GuaranteedNoEvict preempted"
        );
    }
    for c in &batch.seqs {
        let known = &oracle.known[&c.id];
        if c.tokens == [PENDING_TOKEN] {
            assert!(
                prev.is_some() && c.id % 3 != 0,
                "continued only ahead, as allowed"
            );
            assert_eq!(c.start_pos, known.len());
            continue;
        }
        assert_eq!(
            c.tokens[..],
            known[c.start_pos..c.start_pos + c.tokens.len()]
        );
    }
    let out = engine.execute(&batch, prev, oracle, rng);
    (batch, out)
}

/// Applies a step output and checks the events it yields.
fn update(s: &mut Scheduler, oracle: &mut Oracle, batch: &Batch, out: &StepOutput) {
    let events = s.update(batch, out);
    check_invariants(s);
    let mut tokens: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut finishes: HashMap<u64, FinishReason> = HashMap::new();
    for e in &events {
        match *e {
            SeqEvent::Token { id, token } => {
                assert!(oracle.known.contains_key(&id), "token for ended seq {id}");
                assert!(out.tokens.iter().any(|t| t.id == id), "was sampled");
                assert!(batch.seqs.iter().any(|c| c.id == id && c.sample));
                assert!(!finishes.contains_key(&id), "token after finish");
                tokens.entry(id).or_default().push(token);
                oracle.known.get_mut(&id).unwrap().push(token);
            }
            SeqEvent::Finished { id, reason } => {
                assert!(finishes.insert(id, reason).is_none());
                if tokens.contains_key(&id) {
                    continue;
                }
                // Only a sequence that generates nothing ends without a token: when the
                // chunk that reaches its prompt's end is applied.
                assert_eq!(oracle.limits[&id].1, 0, "seq {id} finished without a token");
                assert_eq!(reason, FinishReason::Length);
                let c = batch.seqs.iter().find(|c| c.id == id).expect("scheduled");
                assert!(c.sample && c.start_pos + c.tokens.len() == oracle.known[&id].len());
                end(oracle, id);
            }
            SeqEvent::Preempted { id } => {
                assert!(batch.preempted.contains(&id));
                // Else computed again with LongRoPE's long factors (since re-admitted, or
                // waiting).
                let long = batch.seqs.iter().any(|c| c.id == id && c.long_rope)
                    || s.waiting
                        .iter()
                        .chain(&s.running)
                        .any(|q| q.id == id && q.long_rope);
                assert!(s.config.policy == SchedulerPolicy::MaxUtilization || long);
            }
            SeqEvent::Sampled { id } => panic!("seq {id} is no beam"),
        }
    }
    for (id, emitted) in tokens {
        let sampled = out.tokens.iter().find(|t| t.id == id).expect("was sampled");
        let chunk = batch.seqs.iter().find(|c| c.id == id).expect("scheduled");
        assert!(sampled.accepted.len() <= chunk.max_draft);
        let mut want = sampled.accepted.clone();
        want.push(sampled.token);
        assert_eq!(
            emitted, want,
            "seq {id}: accepted drafts, then the sampled token"
        );
        let (prompt, max_new) = oracle.limits[&id];
        let known = oracle.known[&id].len();
        let limit = (prompt + max_new).min(s.config.max_seq_len);
        assert!(known <= limit, "seq {id} generated past its limit");
        let expected = if sampled.stop {
            Some(FinishReason::Stop)
        } else if known == limit {
            Some(FinishReason::Length)
        } else {
            None
        };
        assert_eq!(finishes.get(&id).copied(), expected, "seq {id}");
        if expected.is_some() {
            end(oracle, id);
        }
    }
}

fn end(oracle: &mut Oracle, id: u64) {
    oracle.known.remove(&id);
    oracle.limits.remove(&id);
    assert!(oracle.ended.insert(id), "seq {id} ended twice");
}

fn add(s: &mut Scheduler, oracle: &mut Oracle, rng: &mut StdRng, id: u64) {
    // Half the prompts start with one of three shared prefixes, under one of two salts (drawn
    // apart from `rng`, whose stream the rest of the run follows).
    let mut side = StdRng::seed_from_u64(id.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let group = side.gen_range(0..6u32);
    let cache_salt = side.gen_range(0..2);
    let mut prompt: Vec<u32> = match group {
        g @ 0..3 => (0..2 + 3 * g).map(|i| 60_000 + 100 * g + i).collect(),
        _ => Vec::new(),
    };
    prompt.extend((0..rng.gen_range(0..40)).map(|_| rng.gen_range(0..50_000)));
    let spec = SeqSpec {
        id,
        max_new_tokens: rng.gen_range(0..30),
        num_draft_tokens: [0, 0, 1, 3, 5][rng.gen_range(0..5)],
        cache_salt,
        prompt,
        // Drawn apart from `rng` too: three levels, most at the default.
        priority: [0, 0, -1, 2][side.gen_range(0..4)],
        beam_width: 1,
    };
    let full = s.num_waiting() >= s.config.max_queue_size;
    let queued: usize = s
        .waiting
        .iter()
        .chain(&s.swapped)
        .map(|q| q.num_known())
        .sum();
    let max_queued = s.config.max_queued_tokens;
    let over = max_queued > 0 && queued + spec.prompt.len() > max_queued;
    match s.add(spec.clone()) {
        Ok(()) => {
            assert!(!full && !over && !spec.prompt.is_empty());
            oracle
                .limits
                .insert(id, (spec.prompt.len(), spec.max_new_tokens));
            oracle.known.insert(id, spec.prompt);
            oracle.salts.insert(id, spec.cache_salt);
            oracle.accepted.insert(id);
        }
        Err(AddError::QueueFull { max }) => assert!(full && max == s.config.max_queue_size),
        Err(AddError::QueueTokensFull { queued: q, max }) => {
            assert!(over && !full && q == queued && max == max_queued)
        }
        Err(AddError::Empty) => assert!(spec.prompt.is_empty()),
        Err(AddError::TooLong { tokens, max, .. }) => assert!(tokens > max),
        Err(AddError::DuplicateId) => panic!("fresh id {id} refused"),
        Err(AddError::TooManyBeams { .. }) => panic!("no beams here"),
    }
}

/// Returns how many chunks were planned ahead (continued with a pending token), how
/// many prompt tokens were found in the prefix cache, and how many blocks came back from
/// its host tier.
fn run(
    seed: u64,
    policy: SchedulerPolicy,
    chunked: bool,
    ahead: bool,
    ops: usize,
) -> (usize, u64, u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut config = random_config(&mut rng, policy, chunked);
    // Prefix caching on in two runs of three.
    config.enable_kv_cache_reuse = !seed.is_multiple_of(3);
    // A queued-token limit in half the runs (drawn apart from `rng`, as the salts are).
    config.max_queued_tokens = [0, 300, 0, 100][(seed / 3 % 4) as usize];
    let mut s = Scheduler::new(config.clone()).unwrap();
    let mut engine = Engine::new(&config);
    let mut oracle = Oracle::default();
    let mut outstanding: VecDeque<(Batch, StepOutput)> = VecDeque::new();
    let mut applied: Option<(Batch, StepOutput)> = None;
    let mut next_id = 1u64;
    let mut continued = 0;
    for _ in 0..ops {
        match rng.gen_range(0..20) {
            0..=5 => {
                add(&mut s, &mut oracle, &mut rng, next_id);
                next_id += 1;
            }
            6 => {
                let id = rng.gen_range(0..next_id + 3);
                let live = oracle.known.contains_key(&id);
                assert_eq!(s.cancel(id), live, "cancel({id})");
                if live {
                    end(&mut oracle, id);
                }
                check_invariants(&s);
            }
            7 => {
                // A replayed batch is ignored.
                if let Some((b, o)) = &applied {
                    assert!(s.update(b, o).is_empty());
                    check_invariants(&s);
                }
            }
            _ => {
                // With one batch in flight, the next is planned ahead of it (overlap)
                // or, in the pipelined case, beside it.
                let prev = match outstanding.back() {
                    Some((_, o)) if ahead => Some(o.clone()),
                    _ => None,
                };
                let step = schedule(&mut s, &mut engine, &oracle, &mut rng, prev.as_ref());
                continued += step
                    .0
                    .seqs
                    .iter()
                    .filter(|c| c.tokens == [PENDING_TOKEN])
                    .count();
                outstanding.push_back(step);
                let r = rng.gen_range(0..100);
                if r < 4 {
                    outstanding.pop_front(); // lost with its engine
                } else if (r < 12 || (ahead && r < 60)) && outstanding.len() < 2 {
                    continue; // the next batch is scheduled before this one is applied
                }
                while let Some((b, o)) = outstanding.pop_front() {
                    update(&mut s, &mut oracle, &b, &o);
                    applied = Some((b, o));
                }
            }
        }
    }
    for (b, o) in std::mem::take(&mut outstanding) {
        update(&mut s, &mut oracle, &b, &o);
    }
    drain(&mut s, &mut engine, &mut oracle, &mut rng);
    assert_eq!(
        oracle.ended, oracle.accepted,
        "a request neither finished nor cancelled"
    );
    assert_eq!(s.num_free_blocks(), s.num_total_blocks());
    assert!(
        oracle.accepted.len() > 10,
        "seed {seed}: the test exercised too little"
    );
    let (_, hits) = s.prefix_cache_tokens();
    assert!(config.enable_kv_cache_reuse || hits == 0);
    let (offloaded, onloaded) = s.num_blocks_offloaded();
    if !config.enable_kv_cache_reuse || config.num_host_blocks == 0 {
        assert_eq!((offloaded, onloaded), (0, 0), "a host tier without one");
    }
    (continued, hits, onloaded)
}

/// Runs until every request is done; bounded so that a livelock fails the test.
fn drain(s: &mut Scheduler, engine: &mut Engine, oracle: &mut Oracle, rng: &mut StdRng) {
    for _ in 0..100_000 {
        if !s.has_work() {
            return;
        }
        let (b, o) = schedule(s, engine, oracle, rng, None);
        update(s, oracle, &b, &o);
    }
    panic!("requests still pending after 100000 iterations");
}

#[test]
fn random_operations_keep_every_invariant() {
    let policies = [
        SchedulerPolicy::GuaranteedNoEvict,
        SchedulerPolicy::MaxUtilization,
    ];
    for policy in policies {
        for chunked in [false, true] {
            let (mut continued, mut hits, mut onloaded) = (0, 0, 0);
            for ahead in [false, true] {
                for seed in 0..12 {
                    let (c, h, o) = run(seed * 7919 + chunked as u64, policy, chunked, ahead, 3000);
                    continued += c;
                    hits += h;
                    onloaded += o;
                }
            }
            assert!(continued > 100, "overlap planned {continued} chunks ahead");
            assert!(hits > 100, "{hits} prompt tokens found in the prefix cache");
            assert!(
                onloaded > 20,
                "{onloaded} blocks came back from the host tier"
            );
        }
    }
}

#[test]
fn max_utilization_random_runs_do_preempt_and_swap() {
    // Guards the test above against never reaching the preemption paths.
    let (mut preempted, mut swapped) = (0, 0);
    for seed in 0..20 {
        let mut rng = StdRng::seed_from_u64(seed);
        let config = SchedulerConfig {
            policy: SchedulerPolicy::MaxUtilization,
            enable_chunked_context: seed % 2 == 0,
            num_blocks: 24,
            block_size: 4,
            max_batch_size: 8,
            max_num_tokens: 64,
            max_seq_len: 64,
            max_queue_size: 64,
            max_queued_tokens: 0,
            // Every other run swaps, into a host cache that sometimes runs out.
            num_host_blocks: [0, 6, 24][seed as usize % 3],
            enable_kv_cache_reuse: seed % 4 < 2,
            overlap: true,
            // Independent of the chunking above.
            kv_window: [None, Some(9)][seed as usize / 2 % 2],
            long_rope_from: None,
        };
        let mut s = Scheduler::new(config.clone()).unwrap();
        let mut engine = Engine::new(&config);
        let mut oracle = Oracle::default();
        for id in 1..=30 {
            add(&mut s, &mut oracle, &mut rng, id);
        }
        while s.has_work() {
            let (b, o) = schedule(&mut s, &mut engine, &oracle, &mut rng, None);
            preempted += b.preempted.len();
            swapped += b.swaps.iter().filter(|c| c.to_host).count();
            update(&mut s, &mut oracle, &b, &o);
        }
        assert_eq!(oracle.ended, oracle.accepted);
        assert_eq!(s.num_swapped(), 0);
        let (out, back) = s.num_blocks_swapped();
        assert_eq!(out, back, "every block swapped out came back");
    }
    assert!(preempted > 0 && swapped > 0, "{preempted} {swapped}");
}
