//! Scenario tests of the scheduler, driven directly on the structs.

use super::checks::{check_batch, check_invariants};
use super::*;
use std::collections::HashMap;

fn spec(id: u64, prompt_len: usize, max_new_tokens: usize) -> SeqSpec {
    SeqSpec {
        id,
        prompt: (0..prompt_len as u32)
            .map(|t| t + 1000 * id as u32)
            .collect(),
        max_new_tokens,
        num_draft_tokens: 0,
        cache_salt: 0,
        priority: 0,
        beam_width: 1,
    }
}

fn scheduler(config: SchedulerConfig) -> Scheduler {
    Scheduler::new(config).expect("valid config")
}

fn small(policy: SchedulerPolicy, num_blocks: usize, block_size: usize) -> SchedulerConfig {
    SchedulerConfig {
        policy,
        num_blocks,
        block_size,
        max_num_tokens: 64,
        max_seq_len: 64,
        ..Default::default()
    }
}

/// Samples a token for every chunk with `sample` set: `id * 100 + generated so far`
/// (so recomputed tokens can be told apart), stopping the ids in `stop`.
fn output(s: &Scheduler, batch: &Batch, stop: &[u64]) -> StepOutput {
    let tokens = batch
        .seqs
        .iter()
        .filter(|c| c.sample)
        .map(|c| {
            let seq = s.running.iter().find(|q| q.id == c.id).unwrap();
            SampledToken {
                id: c.id,
                accepted: Vec::new(),
                token: c.id as u32 * 100 + (seq.tokens.len() - seq.prompt_len) as u32,
                stop: stop.contains(&c.id),
            }
        })
        .collect();
    StepOutput { tokens }
}

/// One schedule + update; checks limits and invariants around it.
fn step(s: &mut Scheduler, stop: &[u64]) -> (Batch, Vec<SeqEvent>) {
    let batch = s.schedule();
    check_batch(s, &batch);
    check_invariants(s);
    let out = output(s, &batch, stop);
    let events = s.update(&batch, &out);
    check_invariants(s);
    (batch, events)
}

fn chunk(batch: &Batch, id: u64) -> Option<&ScheduledSeq> {
    batch.seqs.iter().find(|c| c.id == id)
}

fn finished(events: &[SeqEvent]) -> Vec<(u64, FinishReason)> {
    events
        .iter()
        .filter_map(|e| match *e {
            SeqEvent::Finished { id, reason } => Some((id, reason)),
            _ => None,
        })
        .collect()
}

#[test]
fn prefill_then_decode_until_length() {
    let mut s = scheduler(small(SchedulerPolicy::GuaranteedNoEvict, 8, 4));
    s.add(spec(1, 5, 3)).unwrap();
    let (b, ev) = step(&mut s, &[]);
    let c = chunk(&b, 1).unwrap();
    assert_eq!(
        (c.start_pos, c.tokens.len(), c.sample, c.new),
        (0, 5, true, true)
    );
    assert_eq!(c.block_table, vec![0, 1]);
    assert_eq!(ev, vec![SeqEvent::Token { id: 1, token: 100 }]);
    let (b, _) = step(&mut s, &[]);
    let c = chunk(&b, 1).unwrap();
    assert_eq!(
        (c.start_pos, c.tokens.clone(), c.new),
        (5, vec![100], false)
    );
    let (_, ev) = step(&mut s, &[]);
    assert_eq!(
        ev,
        vec![
            SeqEvent::Token { id: 1, token: 102 },
            SeqEvent::Finished {
                id: 1,
                reason: FinishReason::Length
            }
        ]
    );
    assert_eq!((s.num_running(), s.num_free_blocks()), (0, 8));
    assert_eq!(s.iteration(), 3);
    assert!(!s.has_work());
}

#[test]
fn stop_token_finishes_and_frees_blocks() {
    let mut s = scheduler(small(SchedulerPolicy::GuaranteedNoEvict, 8, 4));
    s.add(spec(1, 5, 10)).unwrap();
    s.add(spec(2, 5, 10)).unwrap();
    step(&mut s, &[]);
    assert_eq!(s.num_free_blocks(), 4);
    let (_, ev) = step(&mut s, &[2]);
    assert_eq!(finished(&ev), vec![(2, FinishReason::Stop)]);
    assert_eq!(
        s.num_free_blocks(),
        6,
        "seq 2's blocks freed in the same update"
    );
    s.add(spec(2, 3, 3)).expect("a finished id can be reused");
}

#[test]
fn max_seq_len_finishes_with_length() {
    let mut config = small(SchedulerPolicy::GuaranteedNoEvict, 8, 4);
    config.max_seq_len = 7;
    let mut s = scheduler(config);
    s.add(spec(1, 5, 100)).unwrap();
    step(&mut s, &[]);
    let (_, ev) = step(&mut s, &[]);
    assert_eq!(finished(&ev), vec![(1, FinishReason::Length)]);
    assert_eq!(s.num_free_blocks(), 8);
}

#[test]
fn no_evict_refuses_where_max_utilization_admits() {
    // 4 blocks of 4: each request needs 3 blocks for its life, 1 for its prompt.
    for (policy, admitted) in [
        (SchedulerPolicy::GuaranteedNoEvict, vec![1]),
        (SchedulerPolicy::MaxUtilization, vec![1, 2]),
    ] {
        let mut s = scheduler(small(policy, 4, 4));
        s.add(spec(1, 4, 8)).unwrap();
        s.add(spec(2, 4, 8)).unwrap();
        let (b, _) = step(&mut s, &[]);
        let ids: Vec<u64> = b.seqs.iter().map(|c| c.id).collect();
        assert_eq!(ids, admitted, "{policy:?}");
    }
}

#[test]
fn no_evict_admits_when_blocks_return_and_never_preempts() {
    let mut s = scheduler(small(SchedulerPolicy::GuaranteedNoEvict, 4, 4));
    s.add(spec(1, 4, 8)).unwrap();
    s.add(spec(2, 4, 8)).unwrap();
    let mut done = Vec::new();
    for _ in 0..40 {
        let (b, ev) = step(&mut s, &[]);
        assert!(b.preempted.is_empty());
        if chunk(&b, 2).is_some_and(|c| c.new) {
            assert!(
                done.contains(&1),
                "seq 2 admitted before seq 1 returned blocks"
            );
        }
        done.extend(finished(&ev).into_iter().map(|(id, _)| id));
    }
    assert_eq!(done, vec![1, 2]);
    assert_eq!(s.num_preemptions(), 0);
}

#[test]
fn max_utilization_preempts_newest_and_resumes_with_outputs_kept() {
    // Recompute from the start: without prefix caching it would find its own blocks.
    let mut config = small(SchedulerPolicy::MaxUtilization, 4, 4);
    config.enable_kv_cache_reuse = false;
    let mut s = scheduler(config);
    s.add(spec(1, 4, 8)).unwrap();
    s.add(spec(2, 4, 8)).unwrap();
    let mut tokens: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut preempted_at = None;
    let mut resumed = false;
    let mut done = Vec::new();
    for i in 0..60 {
        let (b, ev) = step(&mut s, &[]);
        if b.preempted == vec![2] && preempted_at.is_none() {
            preempted_at = Some(i);
            assert!(chunk(&b, 2).is_none());
            assert!(chunk(&b, 1).is_some(), "the older seq keeps running");
            assert_eq!(s.waiting.front().map(|q| q.id), Some(2));
            assert!(ev.contains(&SeqEvent::Preempted { id: 2 }));
        }
        if let (Some(_), Some(c)) = (preempted_at, chunk(&b, 2)) {
            if c.new {
                // Recompute: prompt plus the tokens generated before preemption.
                let mut known = spec(2, 4, 8).prompt;
                known.extend(&tokens[&2]);
                assert_eq!(c.tokens, known);
                // Preemption discarded every fed token: all but the last generated one.
                assert_eq!(s.num_preempted_tokens(), known.len() as u64 - 1);
                assert!(c.sample);
                assert!(done.contains(&1), "resumed only once seq 1 freed blocks");
                resumed = true;
            }
        }
        for e in &ev {
            match *e {
                SeqEvent::Token { id, token } => tokens.entry(id).or_default().push(token),
                SeqEvent::Finished { id, reason } => {
                    assert_eq!(reason, FinishReason::Length);
                    done.push(id);
                }
                SeqEvent::Preempted { .. } | SeqEvent::Sampled { .. } => {}
            }
        }
    }
    assert!(preempted_at.is_some() && resumed);
    assert_eq!(s.num_preemptions(), 1);
    assert_eq!(done, vec![1, 2]);
    assert_eq!(
        tokens[&2],
        (200..208).collect::<Vec<u32>>(),
        "no token lost or repeated"
    );
    assert_eq!(s.num_free_blocks(), 4);
}

#[test]
fn max_utilization_swaps_the_newest_out_and_back_in_without_recompute() {
    // The scenario above, with a host cache: seq 2 keeps its computed tokens.
    let mut config = small(SchedulerPolicy::MaxUtilization, 4, 4);
    config.num_host_blocks = 2;
    let mut s = scheduler(config);
    s.add(spec(1, 4, 8)).unwrap();
    s.add(spec(2, 4, 8)).unwrap();
    let mut tokens: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut out_copies = Vec::new();
    let mut resumed = false;
    let mut done = Vec::new();
    for _ in 0..60 {
        let (b, ev) = step(&mut s, &[]);
        assert!(
            b.preempted.is_empty(),
            "the host cache has room: no recompute"
        );
        let (outs, ins): (Vec<BlockCopy>, Vec<BlockCopy>) = b.swaps.iter().partition(|c| c.to_host);
        if !outs.is_empty() {
            assert!(out_copies.is_empty(), "swapped out once");
            assert!(chunk(&b, 2).is_none() && chunk(&b, 1).is_some());
            assert_eq!(s.swapped.front().map(|q| q.id), Some(2));
            // Its computed tokens: the prompt and all generated tokens but the last.
            let computed = 4 + tokens[&2].len() - 1;
            assert_eq!(outs.len(), computed.div_ceil(4));
            assert!(ev.iter().all(|e| !matches!(e, SeqEvent::Preempted { .. })));
            out_copies = outs;
        }
        if !ins.is_empty() {
            assert!(done.contains(&1), "resumed only once seq 1 freed blocks");
            let c = chunk(&b, 2).expect("resumed in the batch that copies it back");
            assert!(c.swapped_in && !c.new);
            // The host blocks it went out to come back, in order, to its new table.
            let hosts: Vec<u32> = out_copies.iter().map(|c| c.host).collect();
            assert_eq!(ins.iter().map(|c| c.host).collect::<Vec<_>>(), hosts);
            let devices: Vec<u32> = ins.iter().map(|c| c.device).collect();
            assert_eq!(devices[..], c.block_table[..devices.len()]);
            // Only the last sampled token is computed: nothing recomputed.
            assert_eq!(c.tokens, vec![*tokens[&2].last().unwrap()]);
            assert_eq!(c.start_pos, 4 + tokens[&2].len() - 1);
            resumed = true;
        }
        for e in &ev {
            match *e {
                SeqEvent::Token { id, token } => tokens.entry(id).or_default().push(token),
                SeqEvent::Finished { id, .. } => done.push(id),
                SeqEvent::Preempted { .. } | SeqEvent::Sampled { .. } => {}
            }
        }
    }
    assert!(!out_copies.is_empty() && resumed);
    assert_eq!((s.num_preemptions(), s.num_preempted_tokens()), (0, 0));
    assert_eq!(s.num_swap_outs(), 1);
    let n = out_copies.len() as u64;
    assert_eq!(s.num_blocks_swapped(), (n, n));
    assert_eq!(done, vec![1, 2]);
    assert_eq!(tokens[&2], (200..208).collect::<Vec<u32>>());
    assert_eq!(s.num_free_blocks(), 4);
}

#[test]
fn a_full_host_cache_falls_back_to_recompute_and_cancel_frees_host_blocks() {
    let mut config = small(SchedulerPolicy::MaxUtilization, 4, 4);
    config.num_host_blocks = 1;
    // Swap space only: no prefix blocks go to the host tier.
    config.enable_kv_cache_reuse = false;
    let mut s = scheduler(config.clone());
    s.add(spec(1, 4, 8)).unwrap();
    s.add(spec(2, 4, 8)).unwrap();
    // Seq 2 needs 2 host blocks when it is preempted (5+ computed tokens): recompute.
    let mut recomputed = false;
    for _ in 0..60 {
        let (b, _) = step(&mut s, &[]);
        assert!(b.swaps.is_empty());
        recomputed |= b.preempted == vec![2];
    }
    assert!(recomputed);
    assert_eq!(s.num_swap_outs(), 0);

    config.num_host_blocks = 2;
    let mut s = scheduler(config);
    s.add(spec(1, 4, 8)).unwrap();
    s.add(spec(2, 4, 8)).unwrap();
    while s.num_swapped() == 0 {
        step(&mut s, &[]);
    }
    assert!(s.cancel(2));
    check_invariants(&s);
    assert_eq!((s.num_swapped(), s.host_blocks.num_free()), (0, 2));
    assert!(!s.cancel(2));
}

#[test]
fn chunked_prefill_is_split_and_mixed_with_decodes() {
    let mut config = small(SchedulerPolicy::GuaranteedNoEvict, 32, 4);
    config.enable_chunked_context = true;
    config.max_num_tokens = 16;
    let mut s = scheduler(config);
    s.add(spec(1, 4, 20)).unwrap();
    step(&mut s, &[]);
    s.add(spec(2, 40, 5)).unwrap();
    let mut starts = Vec::new();
    for _ in 0..3 {
        let (b, _) = step(&mut s, &[]);
        assert!(b.num_tokens() <= 16);
        assert_eq!(b.seqs[0].id, 1, "decodes come first");
        assert_eq!(b.seqs[0].tokens.len(), 1);
        let c = chunk(&b, 2).unwrap();
        starts.push((c.start_pos, c.tokens.len(), c.sample, c.new));
        let st = s.last_stats();
        assert_eq!(
            (st.num_generation_requests, st.num_generation_tokens),
            (1, 1)
        );
        assert_eq!(
            (st.num_context_requests, st.num_context_tokens),
            (1, c.tokens.len())
        );
    }
    assert_eq!(
        starts,
        vec![
            (0, 15, false, true),
            (15, 15, false, false),
            (30, 10, true, false)
        ]
    );
    let (b, _) = step(&mut s, &[]);
    assert_eq!(chunk(&b, 2).unwrap().start_pos, 40, "seq 2 decodes now");
    assert_eq!(s.last_stats().num_context_tokens, 0);
}

#[test]
fn without_chunking_a_prompt_waits_for_budget_and_too_long_is_refused() {
    let mut config = small(SchedulerPolicy::GuaranteedNoEvict, 32, 4);
    config.max_num_tokens = 16;
    let mut s = scheduler(config);
    let err = s.add(spec(9, 17, 4)).unwrap_err();
    assert!(
        matches!(
            err,
            AddError::TooLong {
                tokens: 17,
                max: 16,
                ..
            }
        ),
        "{err}"
    );
    s.add(spec(1, 10, 4)).unwrap();
    s.add(spec(2, 10, 4)).unwrap();
    let (b, _) = step(&mut s, &[]);
    assert_eq!(b.seqs.len(), 1, "seq 2 does not fit the remaining 6 tokens");
    let (b, _) = step(&mut s, &[]);
    let ids: Vec<(u64, usize)> = b.seqs.iter().map(|c| (c.id, c.tokens.len())).collect();
    assert_eq!(ids, vec![(1, 1), (2, 10)]);
}

#[test]
fn queue_full_rejects_at_once() {
    let mut config = small(SchedulerPolicy::GuaranteedNoEvict, 32, 4);
    config.max_queue_size = 2;
    let mut s = scheduler(config);
    s.add(spec(1, 4, 4)).unwrap();
    s.add(spec(2, 4, 4)).unwrap();
    let err = s.add(spec(3, 4, 4)).unwrap_err();
    assert_eq!(err, AddError::QueueFull { max: 2 });
    assert_eq!(
        err.to_string(),
        "the request queue is full (2 waiting requests); retry later"
    );
    assert_eq!(s.num_waiting(), 2);
    step(&mut s, &[]);
    assert_eq!(s.num_waiting(), 0);
    s.add(spec(3, 4, 4)).expect("room again once admitted");
}

#[test]
fn add_refuses_empty_and_duplicate() {
    let mut s = scheduler(small(SchedulerPolicy::GuaranteedNoEvict, 32, 4));
    assert_eq!(s.add(spec(1, 0, 4)), Err(AddError::Empty));
    s.add(spec(1, 3, 4)).unwrap();
    assert_eq!(s.add(spec(1, 3, 4)), Err(AddError::DuplicateId));
    step(&mut s, &[]);
    assert_eq!(s.add(spec(1, 3, 4)), Err(AddError::DuplicateId), "running");
    assert_eq!(s.num_waiting() + s.num_running(), 1);
}

#[test]
fn max_batch_size_is_respected() {
    let mut config = small(SchedulerPolicy::MaxUtilization, 64, 4);
    config.max_batch_size = 2;
    let mut s = scheduler(config);
    for id in 1..=5 {
        s.add(spec(id, 3, 2)).unwrap();
    }
    let mut order = Vec::new();
    for _ in 0..10 {
        let (b, ev) = step(&mut s, &[]);
        assert!(b.seqs.len() <= 2 && s.num_running() <= 2);
        order.extend(finished(&ev).into_iter().map(|(id, _)| id));
    }
    assert_eq!(order, vec![1, 2, 3, 4, 5], "FCFS, two at a time");
}

#[test]
fn cancel_waiting_and_running() {
    let mut config = small(SchedulerPolicy::GuaranteedNoEvict, 8, 4);
    config.max_batch_size = 1;
    let mut s = scheduler(config);
    s.add(spec(1, 6, 10)).unwrap();
    s.add(spec(2, 6, 10)).unwrap();
    s.add(spec(3, 6, 10)).unwrap();
    step(&mut s, &[]);
    assert!(s.cancel(2), "waiting");
    assert!(!s.cancel(2), "already gone");
    assert!(!s.cancel(42), "unknown");
    // Cancel a running sequence while its batch is in flight.
    let b = s.schedule();
    assert_eq!(b.cancelled, vec![2]);
    let out = output(&s, &b, &[]);
    assert_eq!(s.num_free_blocks(), 6);
    assert!(s.cancel(1));
    assert_eq!(s.num_free_blocks(), 8, "freed at once");
    check_invariants(&s);
    assert!(s.update(&b, &out).is_empty(), "late token ignored");
    check_invariants(&s);
    let (b, _) = step(&mut s, &[]);
    assert_eq!(b.cancelled, vec![1]);
    assert_eq!(b.seqs[0].id, 3);
    let (b, _) = step(&mut s, &[]);
    assert!(b.cancelled.is_empty(), "reported once");
}

#[test]
fn stale_or_replayed_updates_are_ignored() {
    let mut s = scheduler(small(SchedulerPolicy::GuaranteedNoEvict, 8, 4));
    s.add(spec(1, 5, 10)).unwrap();
    let b1 = s.schedule();
    let out1 = output(&s, &b1, &[]);
    assert_eq!(s.update(&b1, &out1).len(), 1);
    assert!(s.update(&b1, &out1).is_empty(), "replay");
    assert_eq!(s.running[0].num_computed, 5, "not advanced twice");
    // A batch lost with its engine: the next update makes its chunk schedulable again.
    let lost = s.schedule();
    assert_eq!(chunk(&lost, 1).unwrap().start_pos, 5);
    let empty = s.schedule();
    assert!(empty.seqs.is_empty(), "in flight, not scheduled twice");
    s.update(&empty, &StepOutput::default());
    let (b, _) = step(&mut s, &[]);
    assert_eq!(chunk(&b, 1).unwrap().start_pos, 5, "recomputed");
}

#[test]
fn missing_sample_reschedules_the_same_chunk() {
    let mut s = scheduler(small(SchedulerPolicy::GuaranteedNoEvict, 8, 4));
    s.add(spec(1, 5, 10)).unwrap();
    let b = s.schedule();
    assert!(s.update(&b, &StepOutput::default()).is_empty());
    check_invariants(&s);
    let (b, ev) = step(&mut s, &[]);
    let c = chunk(&b, 1).unwrap();
    assert_eq!((c.start_pos, c.tokens.len(), c.new), (0, 5, true));
    assert_eq!(ev.len(), 1);
}

#[test]
fn pipelined_batches_do_not_reschedule_in_flight_seqs() {
    let mut s = scheduler(small(SchedulerPolicy::GuaranteedNoEvict, 16, 4));
    s.add(spec(1, 5, 10)).unwrap();
    let b1 = s.schedule();
    s.add(spec(2, 5, 10)).unwrap();
    let b2 = s.schedule();
    let ids: Vec<u64> = b2.seqs.iter().map(|c| c.id).collect();
    assert_eq!(ids, vec![2]);
    let (o1, o2) = (output(&s, &b1, &[]), output(&s, &b2, &[]));
    assert_eq!(s.update(&b1, &o1).len(), 1);
    assert_eq!(s.update(&b2, &o2).len(), 1);
    let (b3, _) = step(&mut s, &[]);
    assert_eq!(b3.seqs.len(), 2);
}

#[test]
fn id_reused_after_cancel_in_flight_is_not_updated_by_the_old_batch() {
    let mut s = scheduler(small(SchedulerPolicy::GuaranteedNoEvict, 16, 4));
    s.add(spec(1, 5, 10)).unwrap();
    let old = s.schedule();
    let old_out = output(&s, &old, &[]);
    assert!(s.cancel(1));
    s.add(spec(1, 3, 10)).unwrap();
    let new = s.schedule();
    assert_eq!(chunk(&new, 1).unwrap().tokens.len(), 3);
    assert!(
        s.update(&old, &old_out).is_empty(),
        "the old batch is not the new seq's"
    );
    assert_eq!(s.running[0].num_computed, 0);
    check_invariants(&s);
    let new_out = output(&s, &new, &[]);
    assert_eq!(s.update(&new, &new_out).len(), 1);
    assert_eq!(s.running[0].num_computed, 3);
}

/// A speculating sequence: its decode chunks get room for drafts, accepted drafts and the
/// sampled token are all emitted, the computed count covers the accepted drafts (the
/// rejected ones' KV is simply not counted), and the next chunk is the sampled token.
#[test]
fn speculative_decode_steps() {
    let mut s = scheduler(small(SchedulerPolicy::GuaranteedNoEvict, 16, 4));
    s.add(SeqSpec {
        num_draft_tokens: 3,
        cache_salt: 0,
        ..spec(1, 5, 20)
    })
    .unwrap();
    let batch = s.schedule();
    assert_eq!(batch.seqs[0].max_draft, 0, "no drafts while prefilling");
    s.update(&batch, &output(&s, &batch, &[]));

    let batch = s.schedule();
    check_batch(&s, &batch);
    let chunk = &batch.seqs[0];
    assert_eq!(
        (chunk.start_pos, chunk.tokens.len(), chunk.max_draft),
        (5, 1, 3)
    );
    assert!(
        chunk.block_table.len() * 4 >= 6 + 3,
        "blocks for the drafts"
    );
    let out = StepOutput {
        tokens: vec![SampledToken {
            id: 1,
            accepted: vec![71, 72],
            token: 73,
            stop: false,
        }],
    };
    let events = s.update(&batch, &out);
    check_invariants(&s);
    let tokens: Vec<u32> = events
        .iter()
        .filter_map(|e| match e {
            SeqEvent::Token { token, .. } => Some(*token),
            _ => None,
        })
        .collect();
    assert_eq!(tokens, [71, 72, 73]);
    let seq = &s.running[0];
    assert_eq!((seq.num_computed, seq.num_known()), (8, 9));

    let batch = s.schedule();
    let chunk = &batch.seqs[0];
    assert_eq!((chunk.start_pos, chunk.tokens.clone()), (8, vec![73]));
}

/// Near the length limit fewer drafts are allowed, so accepted drafts plus the sampled
/// token never pass it; a stop on the sampled token ends the sequence after the drafts.
#[test]
fn speculative_limits_and_stop() {
    let mut s = scheduler(small(SchedulerPolicy::MaxUtilization, 16, 4));
    s.add(SeqSpec {
        num_draft_tokens: 4,
        cache_salt: 0,
        ..spec(1, 3, 4)
    })
    .unwrap();
    s.add(SeqSpec {
        num_draft_tokens: 4,
        cache_salt: 0,
        ..spec(2, 3, 20)
    })
    .unwrap();
    let batch = s.schedule();
    s.update(&batch, &output(&s, &batch, &[]));
    let batch = s.schedule();
    let room: HashMap<u64, usize> = batch.seqs.iter().map(|c| (c.id, c.max_draft)).collect();
    assert_eq!(
        room[&1], 2,
        "3 prompt + 1 generated of 7: 2 drafts and 1 sampled"
    );
    assert_eq!(room[&2], 4);
    let out = StepOutput {
        tokens: vec![
            SampledToken {
                id: 1,
                accepted: vec![5, 6],
                token: 7,
                stop: false,
            },
            SampledToken {
                id: 2,
                accepted: vec![8],
                token: 9,
                stop: true,
            },
        ],
    };
    let events = s.update(&batch, &out);
    check_invariants(&s);
    assert!(events.contains(&SeqEvent::Finished {
        id: 1,
        reason: FinishReason::Length
    }));
    assert!(events.contains(&SeqEvent::Finished {
        id: 2,
        reason: FinishReason::Stop
    }));
    let count = |id| {
        events
            .iter()
            .filter(|e| matches!(e, SeqEvent::Token { id: i, .. } if *i == id))
            .count()
    };
    assert_eq!((count(1), count(2)), (3, 2));
    assert_eq!(s.num_used_blocks(), 0, "both finished: every block back");
}

/// Overlap: with a decode in flight, the next batch continues it with the token that batch
/// samples; updates apply in order; a block is taken at a block boundary; the sequence is
/// not continued where its sampling depends on the token or the token may be its last.
#[test]
fn decodes_continue_ahead_of_the_batch_in_flight() {
    let mut s = scheduler(small(SchedulerPolicy::GuaranteedNoEvict, 16, 4));
    s.add(spec(1, 3, 4)).unwrap();
    s.add(spec(2, 4, 10)).unwrap();
    let b1 = s.schedule();
    let o1 = output(&s, &b1, &[]);
    // Seq 2's sampling needs the token: it would wait out an iteration, so none is planned.
    let none = s.schedule_ahead(|id| id != 2);
    assert!(none.seqs.is_empty());
    assert_eq!(
        s.iteration(),
        b1.iteration,
        "an empty plan ahead is no iteration"
    );
    let b2 = s.schedule_ahead(|_| true);
    check_batch(&s, &b2);
    check_invariants(&s);
    let c = chunk(&b2, 1).expect("seq 1 continues");
    assert_eq!(
        (c.start_pos, &c.tokens[..], c.sample),
        (3, &[PENDING_TOKEN][..], true)
    );
    assert_eq!(c.block_table.len(), 1, "position 3 fits the first block");
    assert_eq!(chunk(&b2, 2).map(|c| c.start_pos), Some(4), "seq 2 too");
    assert_eq!(s.update(&b1, &o1).len(), 2);
    check_invariants(&s);
    // Both are in flight with b2 now; b3 continues seq 1 past the block boundary.
    let b3 = s.schedule_ahead(|_| true);
    check_batch(&s, &b3);
    let c = chunk(&b3, 1).expect("seq 1 continues again");
    assert_eq!((c.start_pos, c.block_table.len()), (4, 2));
    assert_eq!(chunk(&b3, 2).map(|c| c.start_pos), Some(5));
    // b2 samples seq 1's second token of 4, b3 its third; b4 computes the third and
    // samples the fourth, its last, which no batch computes: nothing continues after b4.
    let o2 = output(&s, &b2, &[]);
    let ev = s.update(&b2, &o2);
    assert_eq!(
        ev,
        vec![
            SeqEvent::Token { id: 1, token: 101 },
            SeqEvent::Token { id: 2, token: 201 }
        ]
    );
    let b4 = s.schedule_ahead(|_| true);
    check_batch(&s, &b4);
    assert_eq!(chunk(&b4, 1).map(|c| c.start_pos), Some(5));
    let o3 = output(&s, &b3, &[]);
    s.update(&b3, &o3);
    let b5 = s.schedule_ahead(|_| true);
    check_batch(&s, &b5);
    assert!(chunk(&b5, 1).is_none(), "its pending token is its last");
    let o4 = output(&s, &b4, &[]);
    let ev = s.update(&b4, &o4);
    assert_eq!(finished(&ev), vec![(1, FinishReason::Length)]);
    let o5 = output(&s, &b5, &[]);
    s.update(&b5, &o5);
    check_invariants(&s);
}

/// A sequence that stops in the batch in flight also ran in the batch planned ahead: that
/// result is ignored and the blocks are freed once.
#[test]
fn a_stop_in_flight_makes_the_continuation_stale() {
    let mut s = scheduler(small(SchedulerPolicy::MaxUtilization, 8, 4));
    s.add(spec(1, 4, 10)).unwrap();
    let b1 = s.schedule();
    let o1 = output(&s, &b1, &[1]);
    let b2 = s.schedule_ahead(|_| true);
    assert_eq!(chunk(&b2, 1).map(|c| c.block_table.len()), Some(2));
    let o2 = output(&s, &b2, &[]);
    assert_eq!(finished(&s.update(&b1, &o1)), vec![(1, FinishReason::Stop)]);
    assert_eq!(
        s.num_free_blocks(),
        8,
        "both blocks freed with the sequence"
    );
    assert!(
        s.update(&b2, &o2).is_empty(),
        "the continuation's result is ignored"
    );
    check_invariants(&s);
    assert!(!s.has_work());
}

/// Continuations never preempt: without a free block the sequence waits for its update.
#[test]
fn a_continuation_that_needs_a_block_waits_when_there_is_none() {
    let mut s = scheduler(small(SchedulerPolicy::MaxUtilization, 2, 4));
    s.add(spec(1, 4, 2)).unwrap();
    s.add(spec(2, 4, 2)).unwrap();
    let b1 = s.schedule();
    assert_eq!((b1.seqs.len(), s.num_free_blocks()), (2, 0));
    let b2 = s.schedule_ahead(|_| true);
    assert!(b2.seqs.is_empty() && b2.preempted.is_empty());
    assert_eq!(
        s.iteration(),
        b1.iteration,
        "an empty plan ahead is no iteration"
    );
    let o1 = output(&s, &b1, &[]);
    assert_eq!(s.update(&b1, &o1).len(), 2);
    check_invariants(&s);
}

/// A sequence whose prompt starts with `prefix` (as `spec`'s, then its own tokens).
fn spec_with_prefix(id: u64, prefix: &[u32], own: usize) -> SeqSpec {
    let mut s = spec(id, own, 4);
    s.prompt.splice(0..0, prefix.iter().copied());
    s
}

#[test]
fn a_shared_prefix_is_computed_once_and_its_blocks_shared() {
    // Blocks of 4; a 10-token prefix is two whole blocks and two tokens of a third.
    let mut s = scheduler(small(SchedulerPolicy::GuaranteedNoEvict, 32, 4));
    let prefix: Vec<u32> = (500..510).collect();
    s.add(spec_with_prefix(1, &prefix, 3)).unwrap();
    s.add(spec_with_prefix(2, &prefix, 5)).unwrap();
    // The second waits while the first computes the blocks it would reuse.
    let (b, _) = step(&mut s, &[]);
    assert!(chunk(&b, 1).is_some() && chunk(&b, 2).is_none());
    let (b, _) = step(&mut s, &[]);
    let c = chunk(&b, 2).unwrap();
    // It starts after the two cached blocks, which it shares; the rest is its own.
    assert_eq!((c.start_pos, c.tokens.len(), c.new), (8, 7, false));
    assert_eq!(c.cached, prefix[..8]);
    let first = &s.running.iter().find(|q| q.id == 1).unwrap().blocks;
    assert_eq!(c.block_table[..2], first[..2]);
    assert_ne!(c.block_table[2], first[2]);
    assert_eq!(s.prefix_cache_tokens(), (13 + 15, 8));
    // Finished, the blocks stay cached (counted free); a third sequence finds them.
    while s.num_running() > 0 {
        step(&mut s, &[1, 2]);
    }
    assert_eq!(s.num_free_blocks(), s.num_total_blocks());
    assert!(s.num_cached_blocks() >= 2);
    s.add(spec_with_prefix(3, &prefix, 1)).unwrap();
    let (b, _) = step(&mut s, &[]);
    assert_eq!(chunk(&b, 3).unwrap().start_pos, 8);
    // A prompt that is all cached blocks still computes its last token, in a block of its
    // own: the last cached block is left out.
    let mut whole = spec(4, 0, 4);
    whole.prompt = prefix[..8].to_vec();
    s.add(whole).unwrap();
    let (b, _) = step(&mut s, &[]);
    let c = chunk(&b, 4).unwrap();
    assert_eq!((c.start_pos, c.tokens.len()), (4, 4));
}

#[test]
fn evicted_prefix_blocks_go_to_the_host_tier_and_come_back_on_a_hit() {
    let mut config = small(SchedulerPolicy::GuaranteedNoEvict, 6, 4);
    config.num_host_blocks = 8;
    let mut s = scheduler(config);
    let prefix: Vec<u32> = (500..508).collect();
    // Seq 1 computes the two prefix blocks and stops: they stay cached on the device.
    s.add(spec_with_prefix(1, &prefix, 3)).unwrap();
    let (b, _) = step(&mut s, &[1]);
    let a = chunk(&b, 1).unwrap().block_table[..2].to_vec();
    assert_eq!(s.num_cached_blocks(), 2);
    // Seq 2 needs all six device blocks: the prefix blocks are reclaimed, tail first, and
    // copied to the host tier before its forward pass writes them.
    s.add(spec(2, 24, 1)).unwrap();
    let (b, _) = step(&mut s, &[]);
    assert!(chunk(&b, 2).is_some());
    let outs: Vec<BlockCopy> = b.swaps.clone();
    assert!(outs.iter().all(|c| c.to_host));
    assert_eq!(
        outs.iter().map(|c| c.device).collect::<Vec<_>>(),
        vec![a[1], a[0]]
    );
    assert_eq!(s.num_host_cached_blocks(), 2);
    assert_eq!(s.num_cached_blocks(), 6, "seq 2's own blocks");
    // Seq 3 starts with the prefix: both blocks come back from the host tier into new
    // device blocks (three of seq 2's cached blocks are reclaimed, and go out first).
    s.add(spec_with_prefix(3, &prefix, 1)).unwrap();
    let (b, _) = step(&mut s, &[]);
    let c = chunk(&b, 3).unwrap();
    assert_eq!((c.start_pos, c.tokens.len()), (8, 1));
    assert_eq!(c.cached, prefix);
    let first_in = b.swaps.iter().position(|c| !c.to_host).unwrap();
    assert!(b.swaps[..first_in].iter().all(|c| c.to_host));
    assert_eq!(first_in, 3, "seq 2's reclaimed blocks go out first");
    let ins = &b.swaps[first_in..];
    assert!(ins.iter().all(|c| !c.to_host));
    assert_eq!(
        ins.iter().map(|c| c.host).collect::<Vec<_>>(),
        vec![outs[1].host, outs[0].host],
        "the prefix's host blocks, in order"
    );
    assert_eq!(
        ins.iter().map(|c| c.device).collect::<Vec<_>>(),
        c.block_table[..2]
    );
    assert_eq!(s.num_blocks_offloaded(), (5, 2));
    assert_eq!(s.prefix_cache_tokens().1, 8);
    // Back on the device and registered: a fourth sequence shares them as they are.
    s.add(spec_with_prefix(4, &prefix, 2)).unwrap();
    let table3 = s.running.iter().find(|q| q.id == 3).unwrap().blocks.clone();
    let (b, _) = step(&mut s, &[]);
    let c = chunk(&b, 4).unwrap();
    assert_eq!(c.start_pos, 8);
    assert_eq!(c.block_table[..2], table3[..2]);
    assert!(b.swaps.iter().all(|c| c.to_host), "nothing copied back");
    assert_eq!(s.num_blocks_offloaded().1, 2);
    // A lost engine takes both tiers with it.
    while s.num_running() > 0 {
        step(&mut s, &[3, 4]);
    }
    s.clear_prefix_cache();
    assert_eq!((s.num_cached_blocks(), s.num_host_cached_blocks()), (0, 0));
    check_invariants(&s);
}

#[test]
fn a_swap_out_takes_the_host_blocks_of_its_steps_offloads() {
    // Five device blocks of 4 tokens, two host blocks.
    let mut config = small(SchedulerPolicy::MaxUtilization, 5, 4);
    config.num_host_blocks = 2;
    let mut s = scheduler(config);
    // Seq 1 leaves one cached block; seqs 2 and 3 take the four free ones.
    s.add(spec(1, 4, 4)).unwrap();
    step(&mut s, &[1]);
    assert_eq!((s.num_cached_blocks(), s.num_free_blocks()), (1, 5));
    s.add(spec(2, 7, 10)).unwrap();
    s.add(spec(3, 7, 10)).unwrap();
    // At position 8 both need a third block: seq 2 reclaims the cached one (its copy to the
    // host tier takes one host block), seq 3 finds none and is preempted, with two computed
    // blocks to swap out: the tier's copy gives its host block back.
    let mut swapped = false;
    for _ in 0..6 {
        let (b, _) = step(&mut s, &[]);
        assert!(b.preempted.is_empty(), "swapped, not recomputed");
        if s.num_swap_outs() == 1 && !swapped {
            swapped = true;
            assert_eq!(
                b.swaps.len(),
                2,
                "the swap-out's copies only: {:?}",
                b.swaps
            );
            assert!(b.swaps.iter().all(|c| c.to_host));
            assert_eq!(s.num_blocks_offloaded(), (0, 0));
            assert_eq!(s.num_host_cached_blocks(), 0);
        }
    }
    assert!(swapped);
}

#[test]
fn reuse_off_computes_every_prompt_whole() {
    let mut config = small(SchedulerPolicy::GuaranteedNoEvict, 32, 4);
    config.enable_kv_cache_reuse = false;
    let mut s = scheduler(config);
    let prefix: Vec<u32> = (500..510).collect();
    s.add(spec_with_prefix(1, &prefix, 3)).unwrap();
    s.add(spec_with_prefix(2, &prefix, 5)).unwrap();
    let (b, _) = step(&mut s, &[]);
    assert_eq!(chunk(&b, 2).unwrap().start_pos, 0);
    assert_eq!(s.num_cached_blocks(), 0);
    assert_eq!(s.prefix_cache_tokens().1, 0);
}

#[test]
fn last_step_counts_read_zero_once_idle() {
    let mut s = scheduler(small(SchedulerPolicy::GuaranteedNoEvict, 8, 4));
    s.add(spec(1, 6, 2)).unwrap();
    step(&mut s, &[]);
    let busy = s.last_stats();
    assert_eq!((busy.num_context_requests, busy.num_context_tokens), (1, 6));
    while s.has_work() {
        step(&mut s, &[]);
    }
    let idle = s.last_stats();
    assert_eq!(idle.iteration, busy.iteration + 1);
    assert_eq!(
        (
            idle.num_context_requests,
            idle.num_generation_requests,
            idle.num_generation_tokens
        ),
        (0, 0, 0)
    );
}

#[test]
fn max_queued_tokens_refuses_past_the_limit_and_a_prompt_that_never_fits() {
    let mut config = small(SchedulerPolicy::GuaranteedNoEvict, 8, 4);
    config.max_queued_tokens = 20;
    let mut s = scheduler(config);
    s.add(spec(1, 12, 2)).unwrap();
    assert_eq!(
        s.add(spec(2, 9, 2)),
        Err(AddError::QueueTokensFull {
            queued: 12,
            max: 20
        })
    );
    s.add(spec(3, 8, 2)).unwrap();
    assert!(matches!(
        s.add(spec(4, 21, 2)),
        Err(AddError::TooLong {
            tokens: 21,
            max: 20,
            limit: Limit::QueuedTokens
        })
    ));
    // Admitted sequences leave the queue: room again.
    step(&mut s, &[]);
    assert_eq!(s.num_waiting(), 0);
    s.add(spec(2, 9, 2)).unwrap();
}

#[test]
fn a_sequence_without_new_tokens_ends_when_its_prompt_is_computed() {
    // max_new_tokens 0 (an embedding): its prompt in chunks, then it ends with no token,
    // its blocks freed, beside a sequence that generates.
    let mut config = small(SchedulerPolicy::GuaranteedNoEvict, 8, 4);
    config.enable_chunked_context = true;
    config.max_num_tokens = 8;
    let mut s = scheduler(config);
    s.add(spec(1, 10, 0)).unwrap();
    s.add(spec(2, 2, 2)).unwrap();
    let (b, events) = step(&mut s, &[]);
    assert_eq!(
        chunk(&b, 1).map(|c| (c.tokens.len(), c.sample)),
        Some((8, false))
    );
    assert!(events.is_empty());
    let (b, events) = step(&mut s, &[]);
    let last = chunk(&b, 1).expect("the prompt's last chunk");
    assert_eq!(
        (last.start_pos, last.tokens.len(), last.sample),
        (8, 2, true)
    );
    assert_eq!(finished(&events), vec![(1, FinishReason::Length)]);
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, SeqEvent::Token { id: 1, .. })),
        "no token for it: {events:?}"
    );
    assert_eq!(s.num_running(), 1, "seq 2 goes on");
    step(&mut s, &[]);
    assert_eq!(s.num_free_blocks(), 8);
}

#[test]
fn the_sequences_of_one_prompt_share_its_blocks() {
    // Four sequences of one 20-token prompt (OpenAI's n = 4), blocks of 4, against four
    // separate requests that share nothing (other salts).
    let used = |salted: bool| {
        let mut s = scheduler(small(SchedulerPolicy::GuaranteedNoEvict, 64, 4));
        for id in 1..=4 {
            let mut spec = spec(id, 0, 8);
            spec.prompt = (500..520).collect();
            spec.cache_salt = if salted { id } else { 0 };
            s.add(spec).unwrap();
        }
        // Until every sequence has computed its first generated token (22 to 24 positions
        // each: 6 blocks).
        while s.running.len() < 4 || s.running.iter().any(|q| q.num_computed < 21) {
            step(&mut s, &[]);
        }
        (s.num_used_blocks(), s.prefix_cache_tokens().1)
    };
    let (shared, hits) = used(false);
    let (apart, no_hits) = used(true);
    assert_eq!((apart, no_hits), (4 * 6, 0));
    // Shared: the prompt's 4 whole blocks that leave its last token to compute (the first
    // sequence computed them), then 2 of each sequence's own.
    assert_eq!((shared, hits), (4 + 4 * 2, 3 * 16));
}

fn urgent(id: u64, prompt_len: usize, max_new_tokens: usize, priority: i32) -> SeqSpec {
    SeqSpec {
        priority,
        ..spec(id, prompt_len, max_new_tokens)
    }
}

#[test]
fn waiting_sequences_are_admitted_by_priority_then_arrival() {
    // One sequence at a time (batch of 1): admission order is the queue's.
    let config = SchedulerConfig {
        max_batch_size: 1,
        ..small(SchedulerPolicy::GuaranteedNoEvict, 64, 4)
    };
    let mut s = scheduler(config);
    for (id, p) in [(1, 0), (2, 5), (3, -1), (4, 0), (5, -1)] {
        s.add(urgent(id, 3, 2, p)).unwrap();
    }
    let mut admitted = Vec::new();
    for _ in 0..40 {
        let (b, _) = step(&mut s, &[]);
        admitted.extend(b.seqs.iter().filter(|c| c.new).map(|c| c.id));
    }
    assert_eq!(admitted, vec![3, 5, 1, 4, 2]);
}

#[test]
fn an_urgent_sequence_preempts_less_urgent_ones_under_max_utilization() {
    let mut config = small(SchedulerPolicy::MaxUtilization, 6, 4);
    config.enable_kv_cache_reuse = false;
    let mut s = scheduler(config);
    // Two running sequences of priority 3 and 1 come to hold all 6 blocks (3 each).
    s.add(urgent(1, 8, 7, 3)).unwrap();
    s.add(urgent(2, 8, 7, 1)).unwrap();
    for _ in 0..3 {
        let (b, _) = step(&mut s, &[]);
        assert!(b.preempted.is_empty());
    }
    assert_eq!(s.num_free_blocks(), 0);
    // A waiting sequence of the same value as the least urgent running one takes nothing.
    s.add(urgent(4, 4, 4, 3)).unwrap();
    let (b, _) = step(&mut s, &[]);
    assert!(b.preempted.is_empty() && chunk(&b, 4).is_none());
    // A more urgent one: the least urgent running sequence (1) makes room, not 2, and
    // goes back to the queue ahead of 4 (same level, preempted first).
    s.add(urgent(3, 4, 4, 0)).unwrap();
    let (b, _) = step(&mut s, &[]);
    assert_eq!(b.preempted, vec![1]);
    assert!(
        chunk(&b, 3).is_some_and(|c| c.new),
        "admitted in the same step"
    );
    assert!(
        chunk(&b, 2).is_some(),
        "the more urgent running sequence keeps running"
    );
    let queue: Vec<u64> = s.waiting.iter().map(|q| q.id).collect();
    assert_eq!(queue, vec![1, 4]);
    // Every sequence ends at its length, the urgent one before the waiting ones.
    let mut done: Vec<u64> = Vec::new();
    for _ in 0..200 {
        let (_, ev) = step(&mut s, &[]);
        for (id, reason) in finished(&ev) {
            assert_eq!(reason, FinishReason::Length);
            done.push(id);
        }
    }
    let at = |id| done.iter().position(|&d| d == id).unwrap();
    assert!(at(3) < at(1) && at(3) < at(4), "{done:?}");
    assert_eq!(done.len(), 4);
    assert_eq!(s.num_free_blocks(), 6);
}

#[test]
fn no_evict_never_preempts_for_priority() {
    let mut s = scheduler(small(SchedulerPolicy::GuaranteedNoEvict, 8, 4));
    s.add(urgent(1, 4, 20, 5)).unwrap();
    step(&mut s, &[]);
    s.add(urgent(2, 4, 20, 0)).unwrap();
    for _ in 0..5 {
        let (b, _) = step(&mut s, &[]);
        assert!(b.preempted.is_empty());
        assert!(chunk(&b, 2).is_none(), "waits for seq 1's reserved blocks");
    }
}

#[test]
fn a_sliding_window_gives_back_the_blocks_behind_it() {
    // Window 8, blocks of 4: the query at position p sees p - 7 ..= p.
    let config = |window| SchedulerConfig {
        kv_window: window,
        enable_chunked_context: true,
        max_num_tokens: 8,
        ..small(SchedulerPolicy::MaxUtilization, 16, 4)
    };
    let mut s = scheduler(config(Some(8)));
    s.add(spec(1, 20, 20)).unwrap();
    // The 20-token prompt in chunks of 8: after 16 computed, the next query (16) sees 9..,
    // so blocks 0 and 1 (positions 0..8) are given back.
    step(&mut s, &[]);
    assert!(!s.running[0].blocks.contains(&DROPPED));
    step(&mut s, &[]);
    assert_eq!(s.running[0].num_computed, 16);
    assert_eq!(s.running[0].blocks[..2], [DROPPED, DROPPED]);
    assert_ne!(s.running[0].blocks[2], DROPPED);
    // Two such sequences need 20 blocks of the 16 whole, but hold at most 4 each under
    // the window: both run to the end without preemption; without it, one is preempted.
    for (window, preempted) in [(Some(8), false), (None, true)] {
        let mut s = scheduler(config(window));
        s.add(spec(1, 20, 20)).unwrap();
        s.add(spec(2, 20, 20)).unwrap();
        let (mut held_max, mut done) = (0, 0);
        while done < 2 {
            let (_, events) = step(&mut s, &[]);
            done += finished(&events).len();
            for q in &s.running {
                held_max = held_max.max(q.blocks.iter().filter(|&&b| b != DROPPED).count());
            }
        }
        assert_eq!(
            s.preemptions + s.swap_outs > 0,
            preempted,
            "window {window:?}"
        );
        if window.is_some() {
            assert!(held_max <= 4, "held {held_max} blocks");
        }
        assert_eq!(s.blocks.num_free(), 16, "every block back at the end");
    }
}

#[test]
fn without_a_window_blocks_are_kept() {
    let mut s = scheduler(small(SchedulerPolicy::MaxUtilization, 16, 4));
    s.add(spec(1, 20, 4)).unwrap();
    step(&mut s, &[]);
    step(&mut s, &[]);
    assert!(!s.running[0].blocks.contains(&DROPPED));
}

#[test]
fn long_rope_takes_long_prompts_and_recomputes_a_decode_that_crosses() {
    // LongRoPE's original context of 12 positions, blocks of 4.
    let config = SchedulerConfig {
        long_rope_from: Some(12),
        ..small(SchedulerPolicy::MaxUtilization, 32, 4)
    };
    let mut s = scheduler(config.clone());
    // A prompt past the original context: long from its first chunk, no recompute.
    s.add(spec(1, 13, 2)).unwrap();
    let (b, _) = step(&mut s, &[]);
    assert!(chunk(&b, 1).unwrap().long_rope);
    let (b, _) = step(&mut s, &[]);
    assert!(chunk(&b, 1).unwrap().long_rope && b.preempted.is_empty());
    // A prompt of 10 decodes short at positions 10 and 11; the token at position 12 is
    // computed with the whole sequence again, long (as transformers does at the crossing).
    let mut s = scheduler(config.clone());
    s.add(spec(2, 10, 6)).unwrap();
    let (b, _) = step(&mut s, &[]);
    assert!(!chunk(&b, 2).unwrap().long_rope);
    for pos in [10, 11] {
        let (b, _) = step(&mut s, &[]);
        let c = chunk(&b, 2).unwrap();
        assert_eq!((c.start_pos, c.long_rope), (pos, false));
    }
    let (b, _) = step(&mut s, &[]);
    assert_eq!(b.preempted, vec![2], "the short cache is dropped");
    let c = chunk(&b, 2).unwrap();
    assert_eq!((c.start_pos, c.tokens.len(), c.long_rope), (0, 13, true));
    assert_eq!((s.num_preemptions(), s.num_long_rope_restarts()), (0, 1));
    let (b, _) = step(&mut s, &[]);
    let c = chunk(&b, 2).unwrap();
    assert_eq!((c.start_pos, c.long_rope), (13, true));
    assert!(b.preempted.is_empty(), "crossed once");
    // Planned ahead, the crossing token waits for its update instead of continuing short.
    let mut s = scheduler(config.clone());
    s.add(spec(3, 12, 4)).unwrap();
    let b = s.schedule();
    check_batch(&s, &b);
    assert!(
        !chunk(&b, 3).unwrap().long_rope,
        "positions 0..=11 are short"
    );
    let out = output(&s, &b, &[]);
    let ahead = s.schedule_ahead(|_| true);
    assert!(ahead.seqs.is_empty(), "the pending token at 12 would cross");
    s.update(&b, &out);
    check_invariants(&s);
    let (b, _) = step(&mut s, &[]);
    assert_eq!(b.preempted, vec![3]);
    assert!(chunk(&b, 3).unwrap().long_rope);
    // A speculating sequence drafts no further than the original context: the tokens
    // before it are the short factors' as without drafts.
    let mut s = scheduler(config.clone());
    let mut drafting = spec(7, 10, 6);
    drafting.num_draft_tokens = 4;
    s.add(drafting).unwrap();
    step(&mut s, &[]);
    for (pos, drafts) in [(10, 1), (11, 0)] {
        let (b, _) = step(&mut s, &[]);
        let c = chunk(&b, 7).unwrap();
        assert_eq!(
            (c.start_pos, c.max_draft, c.long_rope),
            (pos, drafts, false)
        );
    }
    let (b, _) = step(&mut s, &[]);
    assert_eq!(b.preempted, vec![7]);
    assert!(chunk(&b, 7).unwrap().long_rope);
    // Blocks computed long do not serve a short prompt with the same tokens, nor the
    // reverse.
    let mut s = scheduler(SchedulerConfig {
        enable_kv_cache_reuse: true,
        ..config
    });
    s.add(spec(4, 14, 1)).unwrap();
    while s.num_running() + s.num_waiting() > 0 {
        step(&mut s, &[]);
    }
    let mut short = spec(5, 9, 1);
    short.prompt = spec(4, 14, 1).prompt[..9].to_vec();
    s.add(short).unwrap();
    let (b, _) = step(&mut s, &[]);
    assert_eq!(chunk(&b, 5).unwrap().start_pos, 0, "no long block reused");
    let mut long = spec(6, 14, 1);
    long.prompt = spec(4, 14, 1).prompt;
    s.add(long).unwrap();
    let (b, _) = step(&mut s, &[]);
    assert_eq!(
        chunk(&b, 6).unwrap().start_pos,
        12,
        "long blocks serve a long prompt"
    );
}
