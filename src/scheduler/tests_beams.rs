//! Scenario tests of beam search in the scheduler: a search admitted with room for all its
//! beams, beams forked copy-on-write (a shared partly filled block given up and computed
//! again, never written by two), never preempted, every block back at the end.

use super::checks::{check_batch, check_invariants};
use super::*;

fn beam_spec(id: u64, prompt_len: usize, max_new: usize, width: usize) -> SeqSpec {
    SeqSpec {
        id,
        prompt: (0..prompt_len as u32)
            .map(|t| t + 1000 * id as u32)
            .collect(),
        max_new_tokens: max_new,
        num_draft_tokens: 0,
        cache_salt: 0,
        priority: 0,
        beam_width: width,
    }
}

fn config(policy: SchedulerPolicy, num_blocks: usize) -> SchedulerConfig {
    SchedulerConfig {
        policy,
        num_blocks,
        block_size: 4,
        max_num_tokens: 64,
        max_seq_len: 64,
        ..Default::default()
    }
}

/// One schedule + update in which every sampling chunk samples (token 7); returns the ids
/// reported `Sampled` (beams) and the batch.
fn step(s: &mut Scheduler) -> (Batch, Vec<u64>) {
    let batch = s.schedule();
    check_batch(s, &batch);
    check_invariants(s);
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
    let events = s.update(&batch, &StepOutput { tokens });
    check_invariants(s);
    let sampled = events
        .iter()
        .filter_map(|e| match *e {
            SeqEvent::Sampled { id } => Some(id),
            SeqEvent::Token { id, .. } => {
                let beam = s.running.iter().any(|q| q.id == id && q.is_beam());
                assert!(!beam, "a beam got a token appended: {id}");
                None
            }
            _ => None,
        })
        .collect();
    (batch, sampled)
}

fn fork(slot: u64, parent: u64, token: u32) -> BeamFork {
    BeamFork {
        slot,
        parent,
        token,
    }
}

#[test]
fn forks_share_whole_blocks_and_compute_a_shared_partial_block_again() {
    let mut s = Scheduler::new(config(SchedulerPolicy::GuaranteedNoEvict, 64)).unwrap();
    s.add(beam_spec(10, 6, 8, 3)).unwrap();
    let (batch, sampled) = step(&mut s);
    assert_eq!(batch.seqs.len(), 1, "the first beam alone");
    assert_eq!(sampled, [10]);
    let first = s.running[0].blocks.clone();
    assert_eq!(first.len(), 2, "6 tokens of blocks of 4");
    // The first step: every slot descends from beam 10.
    s.fork_beams(&[fork(10, 10, 100), fork(11, 10, 101), fork(12, 10, 102)])
        .unwrap();
    check_invariants(&s);
    let seq = |s: &Scheduler, id| s.running.iter().find(|q| q.id == id).unwrap().clone();
    assert_eq!(
        seq(&s, 10).blocks,
        first,
        "beam 10 goes on in its own blocks"
    );
    for id in [11, 12] {
        let q = seq(&s, id);
        assert_eq!(
            q.blocks,
            first[..1],
            "the whole block shared, the partial one given up"
        );
        assert_eq!((q.num_computed, q.num_known()), (4, 7));
        assert!(q.forked);
    }
    assert_eq!(s.blocks.ref_count(first[0]), 3);
    let (batch, sampled) = step(&mut s);
    assert_eq!(sampled.len(), 3);
    let c = batch.seqs.iter().find(|c| c.id == 11).unwrap();
    assert_eq!(
        (c.start_pos, c.tokens.len()),
        (4, 3),
        "two tokens again, then 101"
    );
    assert_eq!(c.cached, seq(&s, 11).tokens[..4], "the engines rebuild it");
    let c = batch.seqs.iter().find(|c| c.id == 10).unwrap();
    assert_eq!((c.start_pos, c.tokens.len(), c.cached.len()), (6, 1, 0));

    // Both of the next beams descend from beam 12: it goes on, 10 takes its copy, 11 dies.
    s.fork_beams(&[fork(10, 12, 5), fork(12, 12, 6)]).unwrap();
    assert!(s.cancel(11));
    check_invariants(&s);
    let (ten, twelve) = (seq(&s, 10), seq(&s, 12));
    assert_eq!(ten.tokens[..7], twelve.tokens[..7]);
    assert_eq!((ten.tokens[7], twelve.tokens[7]), (5, 6));
    // 7 tokens computed: beam 12 keeps its partial block, 10 shares the whole one.
    assert_eq!(ten.blocks, twelve.blocks[..1]);
    assert_eq!(twelve.blocks.len(), 2);
    for _ in 0..3 {
        let (_, sampled) = step(&mut s);
        assert_eq!(sampled.len(), 2);
        s.fork_beams(&[fork(10, 10, 1), fork(12, 10, 2)]).unwrap();
        check_invariants(&s);
    }
    for id in [10, 12] {
        assert!(s.cancel(id));
    }
    check_invariants(&s);
    assert_eq!(s.num_used_blocks(), 0, "every block back");
}

#[test]
fn a_search_is_admitted_only_with_room_for_every_beam() {
    // A beam's life: 6 + 10 tokens, 4 blocks; three beams claim 12.
    for policy in [
        SchedulerPolicy::GuaranteedNoEvict,
        SchedulerPolicy::MaxUtilization,
    ] {
        let mut s = Scheduler::new(config(policy, 11)).unwrap();
        assert!(
            matches!(s.add(beam_spec(1, 6, 10, 3)), Err(AddError::TooLong { .. })),
            "{policy:?}: could never run"
        );
        let mut s = Scheduler::new(config(policy, 12)).unwrap();
        let mut other = beam_spec(2, 8, 2, 1);
        other.prompt[0] += 1;
        s.add(other).unwrap();
        s.add(beam_spec(1, 6, 10, 3)).unwrap();
        let (batch, _) = step(&mut s);
        assert_eq!(batch.seqs.len(), 1, "{policy:?}: the search waits");
        while s.num_running() > 0 {
            step(&mut s);
        }
        let (batch, sampled) = step(&mut s);
        assert_eq!(
            (batch.seqs.len(), sampled),
            (1, vec![1]),
            "{policy:?}: then runs"
        );
    }
}

#[test]
fn beams_are_never_preempted_and_others_make_room() {
    // The search first; a long prompt admitted beside it in chunks of a few tokens (under
    // max_utilization each chunk is admitted on what is free, the search's reserve kept)
    // grows into the reserve and gives its blocks back when the beams need them.
    let mut c = config(SchedulerPolicy::MaxUtilization, 16);
    c.max_num_tokens = 8;
    c.enable_chunked_context = true;
    let mut s = Scheduler::new(c).unwrap();
    s.add(beam_spec(1, 4, 16, 2)).unwrap();
    s.add(beam_spec(2, 48, 8, 1)).unwrap();
    step(&mut s);
    s.fork_beams(&[fork(1, 1, 3), fork(100, 1, 4)]).unwrap();
    let mut preempted_other = false;
    for i in 0..15 {
        let (batch, sampled) = step(&mut s);
        assert!(!batch.preempted.contains(&1) && !batch.preempted.contains(&100));
        preempted_other |= batch.preempted.contains(&2);
        if sampled.len() == 2 {
            s.fork_beams(&[fork(1, 100, i), fork(100, 100, i + 1)])
                .unwrap();
        }
        check_invariants(&s);
    }
    assert!(preempted_other, "the other sequence gave its blocks up");
}

#[test]
fn a_search_fits_the_batch_and_its_recompute_fits_a_step() {
    let mut c = config(SchedulerPolicy::GuaranteedNoEvict, 64);
    c.max_batch_size = 4;
    let mut s = Scheduler::new(c.clone()).unwrap();
    assert!(matches!(
        s.add(beam_spec(1, 6, 4, 5)),
        Err(AddError::TooManyBeams { beams: 5, max: 4 })
    ));
    // Two other sequences run: a search of three waits for one of them to end.
    for id in [2, 3] {
        let mut other = beam_spec(id, 5, 2 + id as usize, 1);
        other.prompt[0] += 7;
        s.add(other).unwrap();
    }
    s.add(beam_spec(1, 6, 4, 3)).unwrap();
    let (batch, _) = step(&mut s);
    assert!(batch.seqs.iter().all(|c| c.id != 1), "2 + 3 beams > 4");
    let mut admitted = false;
    for _ in 0..8 {
        let (batch, _) = step(&mut s);
        if batch.seqs.iter().any(|c| c.id == 1) {
            assert!(s.running.len() < 4 - 1, "room for all three beams");
            admitted = true;
            break;
        }
    }
    assert!(admitted);
    // Without chunked context a step must hold a block's tokens: a fork computes them.
    c.enable_chunked_context = false;
    c.max_num_tokens = 3;
    let mut s = Scheduler::new(c).unwrap();
    assert!(matches!(
        s.add(beam_spec(1, 2, 2, 2)),
        Err(AddError::TooLong {
            limit: Limit::MaxNumTokens,
            ..
        })
    ));
}

#[test]
fn beams_keep_their_blocks_under_a_sliding_window() {
    // Window 8, blocks of 4: a fork restarts at its partial block's start, whose window
    // reaches a block its parent alone would have given back.
    let config = SchedulerConfig {
        kv_window: Some(8),
        ..config(SchedulerPolicy::GuaranteedNoEvict, 64)
    };
    let mut s = Scheduler::new(config).unwrap();
    s.add(beam_spec(10, 11, 8, 2)).unwrap();
    step(&mut s);
    for _ in 0..6 {
        s.fork_beams(&[fork(10, 10, 1), fork(11, 10, 2)]).unwrap();
        check_invariants(&s);
        let (batch, _) = step(&mut s);
        for c in &batch.seqs {
            assert!(
                !c.block_table.contains(&DROPPED),
                "beam {} dropped a block",
                c.id
            );
        }
    }
    for id in [10, 11] {
        assert!(s.cancel(id));
    }
    assert_eq!(s.num_used_blocks(), 0, "every block back");
}
