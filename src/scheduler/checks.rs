//! Checks shared by the scheduler's tests: the limits every batch respects and the
//! invariants the scheduler keeps between calls (no block leaked, double-owned or
//! double-freed; sequence lengths and id sets consistent; the NoEvict guarantee).

use super::*;
use std::collections::HashMap;

/// The batch respects the configured limits and each chunk is well formed.
pub(super) fn check_batch(s: &Scheduler, batch: &Batch) {
    let c = &s.config;
    assert!(batch.seqs.len() <= c.max_batch_size, "batch size exceeded");
    assert!(
        batch.num_tokens() <= c.max_num_tokens,
        "token budget exceeded"
    );
    let mut ids: Vec<u64> = batch.seqs.iter().map(|x| x.id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), batch.seqs.len(), "a sequence scheduled twice");
    for x in &batch.seqs {
        assert!(!x.tokens.is_empty());
        let end = x.start_pos + x.tokens.len();
        assert!(
            x.block_table.len() * c.block_size >= end + x.max_draft,
            "block table too short"
        );
        assert_eq!(x.new, x.start_pos == 0);
        let seq = s
            .running
            .iter()
            .find(|q| q.id == x.id)
            .expect("scheduled ⊆ running");
        // Past LongRoPE's original context a sequence is computed with the long factors
        // from its first token: every chunk reaching there (drafts too) says so, and so does
        // every later chunk of it.
        if let Some(from) = c.long_rope_from {
            let end = x.start_pos + x.tokens.len();
            if end > from {
                assert!(x.long_rope, "a chunk of {} past the original context", x.id);
            } else if !x.long_rope {
                assert!(
                    end + x.max_draft <= from,
                    "drafts of {} past the context",
                    x.id
                );
            }
        }
        assert_eq!(x.long_rope, seq.long_rope);
        if x.tokens == [PENDING_TOKEN] {
            // Planned ahead: the token the in-flight chunk samples, right after it.
            assert_eq!(x.start_pos, seq.num_known(), "a continuation's position");
            assert!(x.sample && x.max_draft == 0 && !x.new);
            assert_eq!(seq.ahead, Some(batch.iteration));
            assert!(seq.in_flight.is_some_and(|it| it < batch.iteration));
            continue;
        }
        // A chunk writes only blocks of its own that no later sequence may find.
        for b in
            &x.block_table[x.start_pos / c.block_size..(end + x.max_draft).div_ceil(c.block_size)]
        {
            assert_ne!(
                *b, DROPPED,
                "a chunk writes a block given back to the window"
            );
            assert_eq!(s.blocks.ref_count(*b), 1, "a chunk writes shared block {b}");
            assert!(!s.blocks.is_cached(*b), "a chunk writes cached block {b}");
        }
        if !x.cached.is_empty() {
            assert_eq!(x.cached[..], seq.tokens[..x.start_pos], "the cached prefix");
        }
        assert_eq!(x.tokens[..], seq.tokens[x.start_pos..end]);
        assert_eq!(x.sample, end == seq.num_known());
        assert!(x.max_draft == 0 || x.sample, "drafts after a prefill chunk");
        assert!(
            x.max_draft <= seq.draft_room(),
            "drafts past the length limit"
        );
        if !c.enable_chunked_context {
            assert_eq!(end, seq.num_known(), "a chunk without chunked context");
        }
    }
}

/// Blocks: none leaked or double-owned, counts consistent. Sequences: consistent
/// lengths, limits respected, the id set matches.
pub(super) fn check_invariants(s: &Scheduler) {
    s.blocks.check_consistent();
    let bs = s.config.block_size;
    let mut owned: Vec<u32> = Vec::new();
    for seq in &s.waiting {
        assert!(seq.blocks.is_empty(), "waiting seq {} holds blocks", seq.id);
        assert_eq!(seq.num_computed, 0);
        assert_eq!(seq.in_flight, None);
    }
    for seq in &s.running {
        assert!(seq.num_computed <= seq.num_known());
        assert!(seq.num_known() <= seq.max_len);
        assert!(seq.blocks.len() >= seq.num_computed.div_ceil(bs));
        // One position past the known tokens: a chunk planned ahead holds it (and keeps it
        // when dropped as stale).
        assert!(
            seq.blocks.len() <= (seq.num_known() + seq.num_draft + 1).div_ceil(bs),
            "over-allocated"
        );
        assert!(seq.ahead.is_none() || seq.in_flight.is_some());
        // Blocks are given back only under a window, and only wholly behind it.
        for (j, &b) in seq.blocks.iter().enumerate() {
            if b == DROPPED {
                let window = s
                    .config
                    .kv_window
                    .expect("a block dropped without a window");
                assert!(
                    (j + 1) * bs + window <= seq.num_computed + 1,
                    "block {j} of {} dropped inside the window",
                    seq.id
                );
            }
        }
        owned.extend(seq.blocks.iter().filter(|&&b| b != DROPPED));
    }
    // Each block's references are its owners; a block owned by several sequences is a
    // cached one, inside every owner's computed tokens (never written again).
    let mut owners: HashMap<u32, usize> = HashMap::new();
    for &b in &owned {
        *owners.entry(b).or_default() += 1;
    }
    // Beams of one search share blocks whether or not they are cached.
    let mut searches: HashMap<u32, Vec<u64>> = HashMap::new();
    for seq in s.running.iter().filter(|q| q.is_beam()) {
        for &b in seq.blocks.iter().filter(|&&b| b != DROPPED) {
            searches.entry(b).or_default().push(seq.group);
        }
    }
    for (&b, &n) in &owners {
        assert_eq!(s.blocks.ref_count(b) as usize, n, "block {b} refcount");
        let one_search = searches
            .get(&b)
            .is_some_and(|g| g.len() == n && g.iter().all(|&x| x == g[0]));
        if n > 1 && !one_search {
            assert!(s.blocks.is_cached(b), "shared block {b} is not cached");
        }
    }
    for seq in &s.running {
        for (j, &b) in seq.blocks.iter().enumerate() {
            if b != DROPPED && owners[&b] > 1 {
                assert!(
                    (j + 1) * bs <= seq.num_computed,
                    "shared block {b} not computed for {}",
                    seq.id
                );
            }
        }
    }
    assert_eq!(
        s.blocks.num_free() + owners.len(),
        s.blocks.num_total(),
        "blocks leaked"
    );
    s.host_blocks.check_consistent();
    let mut held: Vec<u32> = Vec::new();
    for seq in &s.swapped {
        assert_eq!(
            seq.blocks.len(),
            seq.num_computed.div_ceil(bs),
            "swapped blocks"
        );
        assert!(seq.num_computed > 0 && seq.num_computed < seq.num_known());
        assert_eq!((seq.in_flight, seq.ahead), (None, None));
        held.extend(&seq.blocks);
    }
    let n = held.len();
    held.sort_unstable();
    held.dedup();
    assert_eq!(held.len(), n, "a host block held by two sequences");
    assert_eq!(
        s.host_blocks.num_free() + n,
        s.host_blocks.num_total(),
        "host blocks leaked"
    );
    assert!(s.running.len() <= s.config.max_batch_size);
    let mut ids: Vec<u64> = s
        .waiting
        .iter()
        .chain(&s.running)
        .chain(&s.swapped)
        .map(|q| q.id)
        .collect();
    ids.sort_unstable();
    let mut live: Vec<u64> = s.live.iter().copied().collect();
    live.sort_unstable();
    assert_eq!(ids, live, "live ids out of sync");
    // Each search may still claim `width x` a beam's life less the blocks its beams hold,
    // under either policy.
    let mut held_by: HashMap<u64, (usize, Vec<u32>)> = HashMap::new();
    for q in s.running.iter().filter(|q| q.is_beam()) {
        let e = held_by
            .entry(q.group)
            .or_insert((q.beam_width * q.max_kv_tokens().div_ceil(bs), Vec::new()));
        e.1.extend(&q.blocks);
    }
    let mut reserve: usize = held_by
        .into_values()
        .map(|(whole, mut held)| {
            held.sort_unstable();
            held.dedup();
            whole - held.len()
        })
        .sum();
    // Under max_utilization the other sequences may hold the rest: they can be preempted.
    let mut preemptible = 0;
    if s.config.policy == SchedulerPolicy::GuaranteedNoEvict {
        reserve += s
            .running
            .iter()
            .filter(|q| !q.is_beam())
            .map(|q| q.max_kv_tokens().div_ceil(bs) - q.blocks.len())
            .sum::<usize>();
    } else {
        preemptible = owners
            .keys()
            .filter(|b| !searches.contains_key(b) && s.blocks.ref_count(**b) == 1)
            .count();
    }
    assert!(
        reserve <= s.blocks.num_free() + preemptible,
        "reserve guarantee broken"
    );
}
