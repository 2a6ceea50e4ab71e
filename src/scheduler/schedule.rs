//! Planning one iteration: which sequences compute which tokens, which waiting
//! sequences are admitted, and which running ones are preempted for blocks.

use super::batch::{Batch, BlockCopy, IterationStats, ScheduledSeq, PENDING_TOKEN};
use super::block_manager::DROPPED;
use super::policy::SchedulerPolicy;
use super::sequence::Sequence;
use super::Scheduler;

/// The iteration being planned.
struct Step {
    iteration: u64,
    /// Tokens still allowed in this iteration (`max_num_tokens` minus those scheduled).
    budget: usize,
    seqs: Vec<ScheduledSeq>,
    /// Preempted by recompute (and restarted with LongRoPE's long factors).
    preempted: Vec<u64>,
    /// Of `preempted`, those restarted with the long factors ([`Scheduler::restart_long`]):
    /// computed again for their positions, not for blocks.
    restarted: usize,
    /// Preempted by swapping (their copies are in `swaps`).
    swapped_out: usize,
    swaps: Vec<BlockCopy>,
    /// Host blocks this step's copies read for the prefix cache's host tier (onloads):
    /// referenced until planning ends, so that no later copy in the step overwrites one.
    host_pins: Vec<u32>,
    /// Host blocks this step's copies to the host tier write (offloads), referenced until
    /// planning ends likewise; a swap-out that finds no room takes them back.
    offloaded: Vec<u32>,
}

/// Where admission finds one block of a prompt's cached prefix.
#[derive(Clone, Copy, Debug)]
enum Found {
    /// A device block, shared as it is.
    Device(u32),
    /// A block of the host tier, copied into a new device block.
    Host(u32),
}

impl Scheduler {
    /// Plans the next iteration.
    ///
    /// Invariant: each sequence's computed tokens catch up with its known tokens
    /// (prompt + generated). A sequence's chunk is the next `min(uncomputed, budget)`
    /// known tokens (all of them without chunked context, or it waits); a prompt is
    /// one or several such chunks, a decode is a chunk of the one token sampled last
    /// iteration, a preempted sequence recomputes all its known tokens the same way.
    /// `sample` is set when a chunk reaches the last known token; such a chunk of a
    /// running sequence that speculates also gets room (blocks and budget) for
    /// `max_draft` draft tokens after it.
    ///
    /// Order: running sequences with one token to catch up (decodes) first, then
    /// running sequences with more (prefill chunks), both in admission order; then
    /// swapped sequences (their blocks copied back in), then waiting sequences, FCFS,
    /// while `max_batch_size`, `max_num_tokens` and blocks (per the policy) allow.
    /// Blocks are allocated here as chunks need them.
    pub fn schedule(&mut self) -> Batch {
        self.plan(None)
    }

    /// Plans the next iteration while the last one is still being computed, as
    /// [`schedule`](Self::schedule) does, and first gives each running sequence whose
    /// in-flight chunk samples its next token a one-token chunk of that token
    /// ([`PENDING_TOKEN`], at position `num_known`), when `continues(id)` allows it (its
    /// sampling does not depend on that token) and the sequence neither speculates nor
    /// could end by length with that token. Such a chunk never preempts: a sequence whose
    /// block does not fit waits for its update instead. Nothing is planned (an empty batch,
    /// no iteration) while an in-flight sequence could not go on in it and will not end
    /// (a prefill chunk, a speculating sequence, or one `continues` refuses): it would
    /// otherwise run only every other iteration.
    pub fn schedule_ahead(&mut self, continues: impl Fn(u64) -> bool) -> Batch {
        self.plan(Some(&continues))
    }

    fn plan(&mut self, continues: Option<&dyn Fn(u64) -> bool>) -> Batch {
        let from = self.config.long_rope_from;
        let stalls = |s: &Sequence| continues.is_some_and(|c| ahead(s, c, from) == Ahead::Stalls);
        if self.running.iter().any(stalls) {
            return self.nothing_ahead();
        }
        self.iteration += 1;
        let mut step = Step {
            iteration: self.iteration,
            budget: self.config.max_num_tokens,
            seqs: Vec::new(),
            preempted: Vec::new(),
            restarted: 0,
            swapped_out: 0,
            swaps: Vec::new(),
            host_pins: Vec::new(),
            offloaded: Vec::new(),
        };
        if let Some(continues) = continues {
            self.schedule_continuations(continues, &mut step);
        }
        self.make_room_for_urgent(&mut step);
        let made_room = step.preempted.len();
        self.schedule_running(&mut step);
        let evicted = step.preempted.len() - step.restarted > made_room || step.swapped_out > 0;
        if !evicted {
            self.resume_swapped(&mut step);
            if self.swapped.is_empty() {
                self.admit_waiting(&mut step);
            }
        }
        // Unpinned one by one in the order pinned (the tail of a chain first): that order
        // is the host tier's reclaim order.
        for &h in step.offloaded.iter().chain(&step.host_pins) {
            self.host_blocks.free(&[h]);
        }
        // A plan that preempted or restarted anything is kept, empty or not: the engines
        // must hear of it.
        let quiet = step.preempted.is_empty() && step.swapped_out == 0;
        if continues.is_some() && step.seqs.is_empty() && quiet {
            debug_assert!(step.swaps.is_empty(), "copies of a plan that is dropped");
            self.iteration -= 1;
            return self.nothing_ahead();
        }
        debug_assert_eq!(
            step.budget
                + step
                    .seqs
                    .iter()
                    .map(|c| c.tokens.len() + c.max_draft)
                    .sum::<usize>(),
            self.config.max_num_tokens,
            "token budget accounting"
        );
        self.last_stats = self.stats(&step);
        Batch {
            iteration: step.iteration,
            seqs: step.seqs,
            preempted: step.preempted,
            cancelled: std::mem::take(&mut self.cancelled),
            swaps: step.swaps,
        }
    }

    /// An empty plan ahead: no iteration is taken (cancels wait for the next batch).
    fn nothing_ahead(&self) -> Batch {
        Batch {
            iteration: self.iteration + 1,
            ..Batch::default()
        }
    }

    /// The one-token chunks of [`schedule_ahead`](Self::schedule_ahead), in admission order.
    fn schedule_continuations(&mut self, continues: &dyn Fn(u64) -> bool, step: &mut Step) {
        for idx in 0..self.running.len() {
            if step.seqs.len() >= self.config.max_batch_size || step.budget == 0 {
                break;
            }
            let seq = &self.running[idx];
            if ahead(seq, continues, self.config.long_rope_from) != Ahead::Continues {
                continue;
            }
            // Room for the pending token at position num_known.
            let needed = self.blocks.blocks_for(seq.num_known() + 1);
            let missing = needed.saturating_sub(seq.blocks.len());
            let Some(new) = self.allocate(missing, step) else {
                continue;
            };
            let seq = &mut self.running[idx];
            seq.blocks.extend(new);
            seq.ahead = Some(step.iteration);
            step.budget -= 1;
            step.seqs.push(ScheduledSeq {
                id: seq.id,
                start_pos: seq.num_known(),
                tokens: vec![PENDING_TOKEN],
                block_table: seq.blocks.clone(),
                sample: true,
                new: false,
                swapped_in: false,
                max_draft: 0,
                cached: Vec::new(),
                next: None,
                long_rope: seq.long_rope,
            });
        }
    }

    fn schedule_running(&mut self, step: &mut Step) {
        let mut order: Vec<(u64, bool, i32)> = self
            .running
            .iter()
            .filter(|s| s.in_flight.is_none() && s.num_uncomputed() > 0)
            .map(|s| (s.id, s.num_uncomputed() > 1, s.priority))
            .collect();
        // Stable: decodes first, then by priority, admission order kept within each.
        order.sort_by_key(|&(_, prefill, priority)| (prefill, priority));
        for (id, ..) in order {
            if step.seqs.len() >= self.config.max_batch_size {
                break;
            }
            // Gone if an earlier sequence preempted it for blocks.
            let Some(idx) = self.running.iter().position(|s| s.id == id) else {
                continue;
            };
            let seq = &self.running[idx];
            let Some(n) = self.chunk_len(seq.num_uncomputed(), step.budget) else {
                continue;
            };
            let draft = draft_after(seq, n, step.budget, self.config.long_rope_from);
            let end = seq.num_computed + n;
            if !seq.is_beam() && seq.crosses_long_rope(self.config.long_rope_from, end) {
                self.restart_long(idx, step);
                continue;
            }
            self.schedule_with_blocks(id, n, draft, step);
        }
    }

    /// Schedules `n` tokens (and room for `draft` draft tokens) of running sequence `id`,
    /// preempting the most recently admitted sequences until its blocks fit (possibly
    /// itself).
    fn schedule_with_blocks(&mut self, id: u64, n: usize, draft: usize, step: &mut Step) {
        loop {
            let Some(idx) = self.running.iter().position(|s| s.id == id) else {
                return;
            };
            if self.grow_blocks(idx, n + draft, step) {
                self.push_chunk(idx, n, draft, step);
                return;
            }
            debug_assert_eq!(
                self.config.policy,
                SchedulerPolicy::MaxUtilization,
                "GuaranteedNoEvict ran out of reserved blocks"
            );
            let Some(victim) = self.victim(step, i32::MIN) else {
                return;
            };
            self.preempt(victim, step);
        }
    }

    /// Under `max_utilization`, the first waiting sequence takes the blocks of running
    /// ones of a higher priority value when the free blocks cannot hold its first chunk:
    /// they are preempted by recompute (queued behind it; their blocks stay in the prefix
    /// cache, where they find them again unless evicted meanwhile), before anything else
    /// is scheduled in the step, so it is admitted in the same step. Only while nothing
    /// is swapped out (those resume first).
    fn make_room_for_urgent(&mut self, step: &mut Step) {
        if self.config.policy != SchedulerPolicy::MaxUtilization
            || !self.swapped.is_empty()
            || self.batch_full(step)
        {
            return;
        }
        // A search waits for room for all its beams: none is made for its first chunk.
        let Some(seq) = self.waiting.front().filter(|s| !s.is_beam()) else {
            return;
        };
        let Some(n) = self.chunk_len(seq.num_uncomputed(), step.budget) else {
            return;
        };
        let (needed, urgent) = (self.blocks.blocks_for(n), seq.priority);
        while self.blocks.num_free() < needed {
            let Some(victim) = self.victim(step, urgent) else {
                return;
            };
            self.preempt_to(victim, step, false);
        }
    }

    /// The running sequence to preempt for blocks: the one of the highest priority value
    /// above `above` (the least urgent), the most recently admitted among equals; only
    /// those not in flight in an earlier iteration can be, and never a beam (its search
    /// reserved its blocks).
    fn victim(&self, step: &Step, above: i32) -> Option<usize> {
        self.running
            .iter()
            .enumerate()
            .filter(|(_, s)| {
                s.in_flight.is_none_or(|it| it == step.iteration)
                    && s.priority > above
                    && !s.is_beam()
            })
            .max_by_key(|&(i, s)| (s.priority, i))
            .map(|(i, _)| i)
    }

    /// Gives running sequence `idx` blocks for `n` more computed tokens; false (and
    /// nothing taken) when the pool has too few.
    fn grow_blocks(&mut self, idx: usize, n: usize, step: &mut Step) -> bool {
        let seq = &self.running[idx];
        let needed = self.blocks.blocks_for(seq.num_computed + n);
        let missing = needed.saturating_sub(seq.blocks.len());
        match self.allocate(missing, step) {
            Some(new) => {
                self.running[idx].blocks.extend(new);
                true
            }
            None => false,
        }
    }

    /// Preempts running sequence `idx`: swaps it out when the host cache has room for its
    /// computed blocks, else by recompute. Either way its device blocks are freed and its
    /// chunk in this step, if it had one, withdrawn.
    fn preempt(&mut self, idx: usize, step: &mut Step) {
        self.preempt_to(idx, step, true);
    }

    /// [`Self::preempt`], by recompute only unless `may_swap`.
    fn preempt_to(&mut self, idx: usize, step: &mut Step, may_swap: bool) {
        let mut seq = self.running.remove(idx);
        if let Some(pos) = step.seqs.iter().position(|c| c.id == seq.id) {
            let chunk = step.seqs.remove(pos);
            step.budget += chunk.tokens.len() + chunk.max_draft;
        }
        seq.in_flight = None;
        seq.ahead = None;
        seq.registered = 0;
        let keep = self.blocks.blocks_for(seq.num_computed);
        // A table with blocks given back to a sliding window is computed again instead, as
        // is one whose next chunk takes the long RoPE factors.
        let long = self.config.long_rope_from;
        let may_swap = may_swap
            && !seq.blocks.contains(&DROPPED)
            && !seq.crosses_long_rope(long, seq.num_known());
        let host = (may_swap && keep > 0)
            .then(|| self.swap_space(keep, step))
            .flatten();
        self.blocks.free(&seq.blocks);
        match host {
            Some(host) => {
                step.swaps.extend(
                    seq.blocks[..keep]
                        .iter()
                        .zip(&host)
                        .map(|(&d, &h)| BlockCopy {
                            device: d,
                            host: h,
                            to_host: true,
                        }),
                );
                seq.blocks = host;
                step.swapped_out += 1;
                self.swap_outs += 1;
                self.blocks_swapped_out += keep as u64;
                // First of its level: the most recently swapped resumes first.
                let at = self.swapped.partition_point(|s| s.priority < seq.priority);
                self.swapped.insert(at, seq);
            }
            None => {
                seq.blocks.clear();
                self.preempted_tokens += seq.num_computed as u64;
                seq.num_computed = 0;
                step.preempted.push(seq.id);
                self.preemptions += 1;
                let at = self.waiting.partition_point(|s| s.priority < seq.priority);
                self.waiting.insert(at, seq);
            }
        }
    }

    /// Running sequence `idx`, whose next chunk reaches past LongRoPE's original context,
    /// computed again from its first token with the long factors, as transformers does at
    /// the crossing: its blocks are given back (those of the prefix cache stay there, for
    /// short sequences) and it goes first in the queue, admitted in this step if it fits.
    fn restart_long(&mut self, idx: usize, step: &mut Step) {
        let mut seq = self.running.remove(idx);
        debug_assert!(seq.in_flight.is_none() && !step.seqs.iter().any(|c| c.id == seq.id));
        self.blocks.free(&seq.blocks);
        seq.blocks.clear();
        seq.ahead = None;
        seq.registered = 0;
        seq.num_computed = 0;
        seq.take_long_rope();
        self.long_rope_restarts += 1;
        step.preempted.push(seq.id);
        step.restarted += 1;
        let at = self.waiting.partition_point(|s| s.priority < seq.priority);
        self.waiting.insert(at, seq);
    }

    /// Resumes swapped sequences, most recently swapped first, while their blocks and
    /// next chunk fit: their blocks are copied back into new device blocks.
    fn resume_swapped(&mut self, step: &mut Step) {
        while let Some(seq) = self.swapped.front() {
            if self.batch_full(step) {
                break;
            }
            let Some(n) = self.chunk_len(seq.num_uncomputed(), step.budget) else {
                break;
            };
            let draft = draft_after(seq, n, step.budget, self.config.long_rope_from);
            let needed = self.blocks.blocks_for(seq.num_computed + n + draft);
            let Some(device) = self.allocate(needed, step) else {
                break;
            };
            let mut seq = self.swapped.pop_front().expect("front exists");
            step.swaps
                .extend(seq.blocks.iter().zip(&device).map(|(&h, &d)| BlockCopy {
                    device: d,
                    host: h,
                    to_host: false,
                }));
            self.host_blocks.free(&seq.blocks);
            self.blocks_swapped_in += seq.blocks.len() as u64;
            seq.blocks = device;
            seq.registered = 0;
            self.running.push(seq);
            self.push_chunk(self.running.len() - 1, n, draft, step);
            if let Some(chunk) = step.seqs.last_mut() {
                chunk.swapped_in = true;
            }
        }
    }

    fn admit_waiting(&mut self, step: &mut Step) {
        // Blocks running sequences may still claim (GuaranteedNoEvict's reserve, and every
        // beam search's).
        let mut reserved = self.reserved_blocks();
        while !self.waiting.is_empty() {
            if self.batch_full(step) {
                break;
            }
            let next = &mut self.waiting[0];
            // Computed from its first token: with the long RoPE factors when it is longer
            // than the original context (a beam search when it may grow past it: its beams
            // are never computed again).
            let end = match next.is_beam() {
                true => next.max_kv_tokens(),
                false => next.num_known(),
            };
            if next.crosses_long_rope(self.config.long_rope_from, end) {
                next.take_long_rope();
            }
            let next = &self.waiting[0];
            // A search's beams all run: room for each of them in the running set.
            if next.is_beam() && self.running.len() + next.beam_width > self.config.max_batch_size {
                break;
            }
            // Blocks of its prefix another sequence computed: taken, not computed again.
            let found = self.cached_prefix_of_next();
            if self.next_prefix_in_flight(found.len()) {
                // A running sequence is computing its next prefix block: admitted after,
                // it finds that block instead of computing it again (FCFS: the queue waits).
                break;
            }
            let cached: Vec<u32> = found
                .iter()
                .filter_map(|f| match f {
                    Found::Device(b) => Some(*b),
                    Found::Host(_) => None,
                })
                .collect();
            let from_host: Vec<u32> = found
                .iter()
                .filter_map(|f| match f {
                    Found::Host(h) => Some(*h),
                    Found::Device(_) => None,
                })
                .collect();
            let skip = found.len() * self.config.block_size;
            let seq = &self.waiting[0];
            let Some(n) = self.chunk_len(seq.num_uncomputed() - skip, step.budget) else {
                break;
            };
            let held = self.blocks.blocks_for(skip + n);
            // New device blocks: those the host tier's blocks are copied into, and the rest.
            let first = held - cached.len();
            let whole = self.whole_reserve(seq);
            // Cached blocks no one references count as free: taking them uses that room.
            let unreferenced = self.blocks.num_unreferenced(&cached);
            let fits = match self.reserves(seq) {
                true => reserved + whole + unreferenced <= self.blocks.num_free() + cached.len(),
                // Under max_utilization `reserved` is the beam searches' alone.
                false => reserved + first + unreferenced <= self.blocks.num_free(),
            };
            if !fits {
                break;
            }
            self.blocks.take_cached(&cached);
            // The host blocks read here are not reclaimed by this step's evictions.
            self.host_blocks.take_cached(&from_host);
            let Some(new) = self.allocate(first, step) else {
                self.blocks.free(&cached);
                self.host_blocks.free(&from_host);
                break;
            };
            let mut seq = self.waiting.pop_front().expect("not empty");
            let mut new = new.into_iter();
            let mut table = Vec::with_capacity(held);
            for (j, f) in found.iter().enumerate() {
                match *f {
                    Found::Device(b) => table.push(b),
                    Found::Host(h) => {
                        let d = new.next().expect("a new block per host block");
                        step.swaps.push(BlockCopy {
                            device: d,
                            host: h,
                            to_host: false,
                        });
                        self.blocks.register(d, seq.hashes[j]);
                        table.push(d);
                    }
                }
            }
            table.extend(new);
            step.host_pins.extend(from_host.iter().rev());
            self.blocks_onloaded += from_host.len() as u64;
            self.prefix_queried += seq.num_known() as u64;
            self.prefix_hits += skip as u64;
            seq.registered = found.len();
            seq.blocks = table;
            seq.num_computed = skip;
            seq.admitted_len = seq.num_known();
            reserved += whole.saturating_sub(held);
            let prefix = seq.tokens[..skip].to_vec();
            self.running.push(seq);
            self.push_chunk(self.running.len() - 1, n, 0, step);
            if let Some(chunk) = step.seqs.last_mut() {
                chunk.cached = prefix;
            }
        }
    }

    /// Takes `n` device blocks (as [`BlockManager::allocate`](super::BlockManager::allocate)
    /// does), copying the cached blocks it reclaims to the host tier, if there is one.
    fn allocate(&mut self, n: usize, step: &mut Step) -> Option<Vec<u32>> {
        let blocks = self.blocks.allocate(n)?;
        for (device, hash) in self.blocks.take_evicted() {
            if self.host_blocks.touch(hash) {
                continue; // the host tier holds these tokens already
            }
            // Only room the swapped sequences leave: a reclaimed host block's copy is lost.
            let Some(host) = self.host_blocks.allocate(1) else {
                continue;
            };
            self.host_blocks.register(host[0], hash);
            step.swaps.push(BlockCopy {
                device,
                host: host[0],
                to_host: true,
            });
            step.offloaded.push(host[0]);
            self.blocks_offloaded += 1;
        }
        Some(blocks)
    }

    /// `n` host blocks for a sequence swapped out in this step. Swapped sequences come
    /// before the host tier: when the host cache is short, this step's copies to the tier
    /// give their blocks back (their copies are withdrawn; a preemption happens before any
    /// admission, so no copy of this step reads them yet).
    fn swap_space(&mut self, n: usize, step: &mut Step) -> Option<Vec<u32>> {
        if let Some(host) = self.host_blocks.allocate(n) {
            return Some(host);
        }
        if step.offloaded.is_empty() {
            return None;
        }
        debug_assert!(
            step.host_pins.is_empty(),
            "an admission before a preemption"
        );
        let taken: std::collections::HashSet<u32> = step.offloaded.drain(..).collect();
        step.swaps
            .retain(|c| !(c.to_host && taken.contains(&c.host)));
        for &h in &taken {
            self.host_blocks.forget(h);
            self.host_blocks.free(&[h]);
        }
        self.blocks_offloaded -= taken.len() as u64;
        self.host_blocks.allocate(n)
    }

    /// Whether the next waiting sequence's first uncached prefix block (after `cached`
    /// blocks, one it could reuse) is one a running sequence has yet to compute.
    fn next_prefix_in_flight(&self, cached: usize) -> bool {
        let Some(seq) = self.waiting.front() else {
            return false;
        };
        let usable = (seq.num_known() - 1) / self.config.block_size;
        if !self.config.enable_kv_cache_reuse || cached >= usable {
            return false;
        }
        let Some(h) = seq.hashes.get(cached) else {
            return false;
        };
        self.running.iter().any(|r| {
            r.hashes
                .get(r.registered..)
                .is_some_and(|hs| hs.contains(h))
        })
    }

    /// Where the blocks of the next waiting sequence's longest cached prefix are, on the
    /// device or in the host tier, leaving at least its last known token to compute (its
    /// logits are needed, and it is written into a block of its own: a cached block is
    /// never written).
    fn cached_prefix_of_next(&mut self) -> Vec<Found> {
        let bs = self.config.block_size;
        let Some(seq) = self.waiting.front_mut() else {
            return Vec::new();
        };
        if !self.config.enable_kv_cache_reuse {
            return Vec::new();
        }
        let usable = (seq.num_known() - 1) / bs;
        let hashes = seq.block_hashes(bs);
        let (blocks, host) = (&self.blocks, &self.host_blocks);
        hashes[..usable.min(hashes.len())]
            .iter()
            .map_while(|&h| {
                blocks
                    .lookup(h)
                    .map(Found::Device)
                    .or_else(|| host.lookup(h).map(Found::Host))
            })
            .collect()
    }

    /// No more sequences fit this iteration (or the running set).
    fn batch_full(&self, step: &Step) -> bool {
        self.running.len() >= self.config.max_batch_size
            || step.seqs.len() >= self.config.max_batch_size
    }

    /// Blocks a sequence holding `held` blocks may still claim under the policy.
    pub(super) fn reserve_of(&self, max_kv_tokens: usize, held: usize) -> usize {
        match self.config.policy {
            SchedulerPolicy::GuaranteedNoEvict => {
                self.blocks.blocks_for(max_kv_tokens).saturating_sub(held)
            }
            SchedulerPolicy::MaxUtilization => 0,
        }
    }

    /// Tokens to compute for a sequence with `uncomputed` known tokens left, or None
    /// when it must wait for a later iteration.
    fn chunk_len(&self, uncomputed: usize, budget: usize) -> Option<usize> {
        if uncomputed == 0 || budget == 0 {
            None
        } else if uncomputed <= budget {
            Some(uncomputed)
        } else if self.config.enable_chunked_context {
            Some(budget)
        } else {
            None
        }
    }

    fn push_chunk(&mut self, idx: usize, n: usize, draft: usize, step: &mut Step) {
        let seq = &mut self.running[idx];
        let start = seq.num_computed;
        let end = start + n;
        debug_assert!(end <= seq.num_known());
        debug_assert!(draft == 0 || end == seq.num_known());
        debug_assert!(seq.blocks.len() * self.config.block_size >= end + draft);
        seq.in_flight = Some(step.iteration);
        seq.flight_end = end;
        step.budget -= n + draft;
        // A forked beam's engines' state starts again from the tokens before its chunk.
        let cached = match std::mem::take(&mut seq.forked) {
            true => seq.tokens[..start].to_vec(),
            false => Vec::new(),
        };
        step.seqs.push(ScheduledSeq {
            id: seq.id,
            start_pos: start,
            tokens: seq.tokens[start..end].to_vec(),
            block_table: seq.blocks.clone(),
            sample: end == seq.num_known(),
            new: start == 0,
            swapped_in: false,
            max_draft: draft,
            cached,
            next: seq.tokens.get(end).copied(),
            long_rope: seq.long_rope,
        });
    }

    fn stats(&self, step: &Step) -> IterationStats {
        let mut stats = IterationStats {
            iteration: step.iteration,
            num_preempted: step.preempted.len() - step.restarted + step.swapped_out,
            ..Default::default()
        };
        for chunk in &step.seqs {
            let context = self
                .running
                .iter()
                .find(|s| s.id == chunk.id)
                .is_some_and(|s| chunk.start_pos < s.admitted_len);
            if context {
                stats.num_context_requests += 1;
                stats.num_context_tokens += chunk.tokens.len();
            } else {
                stats.num_generation_requests += 1;
                stats.num_generation_tokens += chunk.tokens.len();
            }
        }
        stats
    }
}

/// Room for draft tokens after a chunk of `n` tokens with `budget` tokens left: only a
/// chunk that reaches the last known token speculates.
/// Draft tokens after a chunk of `n` tokens of `seq` (those that reach its last known
/// token), within `budget`; a sequence still on LongRoPE's short factors drafts no further
/// than the original context `long_rope` (past it, its next decode restarts it: drafts
/// would otherwise take it there sooner than decoding token by token does).
fn draft_after(seq: &Sequence, n: usize, budget: usize, long_rope: Option<usize>) -> usize {
    if n != seq.num_uncomputed() {
        return 0;
    }
    let room = seq.draft_room().min(budget - n);
    match long_rope {
        Some(from) if !seq.long_rope => room.min(from.saturating_sub(seq.num_computed + n)),
        _ => room,
    }
}

/// What an iteration planned ahead does with a running sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ahead {
    /// Not in flight (or already continued): planned as `schedule` plans it.
    Free,
    /// Its in-flight chunk samples and it goes on with that token (`PENDING_TOKEN`).
    Continues,
    /// The token its in-flight chunk samples is its last by length.
    Ends,
    /// In flight and neither: a prefill chunk, a speculating sequence, one whose
    /// sampling needs the pending token (`continues` refuses it), or one whose pending
    /// token crosses LongRoPE's original context (it is computed again).
    Stalls,
}

fn ahead(seq: &Sequence, continues: &dyn Fn(u64) -> bool, long_rope: Option<usize>) -> Ahead {
    if seq.in_flight.is_none() || seq.ahead.is_some() {
        return Ahead::Free;
    }
    let samples = seq.flight_end == seq.num_known();
    // The pending token at position num_known: past LongRoPE's original context the
    // sequence is computed again, once its update lands.
    let crosses = seq.crosses_long_rope(long_rope, seq.num_known() + 1);
    if samples && seq.num_known() + 1 >= seq.max_len {
        Ahead::Ends
    } else if samples && seq.num_draft == 0 && !crosses && continues(seq.id) {
        Ahead::Continues
    } else {
        Ahead::Stalls
    }
}
