//! Paged KV-cache block accounting: which block ids are free and how many sequences
//! reference each one. It owns no memory (the engines own the KV tensors); the
//! scheduler is its only caller and the only one that frees.
//!
//! Blocks are reference counted so that sequences can share them: `fork` adds a
//! reference, `free` drops one. Prefix caching keeps what a block holds: a full block
//! whose tokens are computed is registered under the hash of its tokens and every token
//! before them (`register`); a new sequence takes the registered blocks of its longest
//! cached prefix (`cached_prefix`, `take_cached`). A registered block whose count reaches
//! zero is not free but cached: it stays findable until `allocate` needs its memory and
//! reclaims it, least recently freed first. A manager that logs evictions
//! ([`with_eviction_log`](BlockManager::with_eviction_log)) records each reclaimed block
//! and its hash, for a lower tier (the host cache) to keep a copy.
//!
//! Invariant: a block with no references is either on the free list (and registered
//! under no hash) or cached (registered, in the LRU order), never both; a registered
//! block is never written again (its tokens are computed and it is full).

use std::collections::{BTreeMap, HashMap};

/// A block table entry whose block its sequence gave back: every position in it is behind
/// the sliding window of every layer (`SchedulerConfig::kv_window`), so no kernel reads it.
/// Freeing or forking it does nothing.
pub const DROPPED: u32 = u32::MAX;

/// Reference-counted pool of fixed-size KV blocks, with the prefix cache's index.
#[derive(Debug, Clone)]
pub struct BlockManager {
    block_size: usize,
    /// Reference count per block id; 0 means free or cached.
    refs: Vec<u32>,
    /// Free block ids; allocation pops from the end.
    free: Vec<u32>,
    /// The hash each registered block is found under, and the block of each hash.
    hash_of: HashMap<u32, u64>,
    by_hash: HashMap<u64, u32>,
    /// Registered blocks with no references, by the tick they were freed at: the first
    /// is reclaimed first.
    lru: BTreeMap<u64, u32>,
    lru_tick: HashMap<u32, u64>,
    tick: u64,
    /// Cached blocks reclaimed since the last `take_evicted`, with their hashes, when
    /// evictions are logged.
    evicted: Option<Vec<(u32, u64)>>,
}

impl BlockManager {
    /// A pool of `num_blocks` blocks of `block_size` tokens each, all free.
    ///
    /// # Panics
    /// If `block_size` is 0 or `num_blocks` does not fit a `u32` block id.
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        assert!(block_size > 0, "block_size must be positive");
        assert!(
            u32::try_from(num_blocks).is_ok(),
            "num_blocks {num_blocks} does not fit u32 block ids"
        );
        // Reversed so that a fresh pool hands out 0, 1, 2, ...: easier to read in tests.
        let free = (0..num_blocks as u32).rev().collect();
        BlockManager {
            block_size,
            refs: vec![0; num_blocks],
            free,
            hash_of: HashMap::new(),
            by_hash: HashMap::new(),
            lru: BTreeMap::new(),
            lru_tick: HashMap::new(),
            tick: 0,
            evicted: None,
        }
    }

    /// The same pool, recording every cached block `allocate` reclaims (see
    /// [`take_evicted`](Self::take_evicted)).
    pub fn with_eviction_log(mut self) -> Self {
        self.evicted = Some(Vec::new());
        self
    }

    /// The cached blocks reclaimed since the last call, in reclaim order, each with the
    /// hash it was registered under: their contents are still there until the caller lets
    /// anything write them.
    pub fn take_evicted(&mut self) -> Vec<(u32, u64)> {
        self.evicted
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Takes `n` free blocks, each with one reference, reclaiming cached blocks (least
    /// recently freed first) when the free list is short. `None` means there is no room;
    /// nothing is taken then, so the caller can wait or preempt.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<u32>> {
        if n > self.num_free() {
            return None;
        }
        while self.free.len() < n {
            let Some((_, b)) = self.lru.pop_first() else {
                break;
            };
            self.lru_tick.remove(&b);
            if let (Some(log), Some(&h)) = (self.evicted.as_mut(), self.hash_of.get(&b)) {
                log.push((b, h));
            }
            self.unregister(b);
            self.free.push(b);
        }
        let mut blocks = self.free.split_off(self.free.len() - n);
        blocks.reverse(); // in pop order
        for &b in &blocks {
            debug_assert_eq!(self.refs[b as usize], 0, "block {b} on free list is in use");
            self.refs[b as usize] = 1;
        }
        Some(blocks)
    }

    /// Drops one reference from each block; a block whose count reaches 0 is free
    /// again. Freeing a free (or unknown) block is a caller bug: it trips a
    /// `debug_assert` and is otherwise ignored, so the free list is never corrupted.
    pub fn free(&mut self, blocks: &[u32]) {
        // Cached blocks become reclaimable last block first: a table's tail goes before its
        // head, so a chain is cut from its end and what is left of it is still found.
        let mut cached = Vec::new();
        for &b in blocks.iter().filter(|&&b| b != DROPPED) {
            let Some(count) = self.refs.get_mut(b as usize) else {
                debug_assert!(false, "free of unknown block {b}");
                continue;
            };
            if *count == 0 {
                debug_assert!(false, "double free of block {b}");
                continue;
            }
            *count -= 1;
            if *count == 0 {
                if self.hash_of.contains_key(&b) {
                    cached.push(b);
                } else {
                    self.free.push(b);
                }
            }
        }
        for b in cached.into_iter().rev() {
            self.tick += 1;
            self.lru.insert(self.tick, b);
            self.lru_tick.insert(b, self.tick);
        }
    }

    /// Registers `block` (referenced, full, its tokens computed) under `hash`, the hash of
    /// its tokens and every token before them. False when another block already holds
    /// that hash (the same tokens computed twice: the first stays the one found) or the
    /// block is already registered.
    pub fn register(&mut self, block: u32, hash: u64) -> bool {
        if self.ref_count(block) == 0
            || self.by_hash.contains_key(&hash)
            || self.hash_of.contains_key(&block)
        {
            return false;
        }
        self.by_hash.insert(hash, block);
        self.hash_of.insert(block, hash);
        true
    }

    /// The registered blocks of the longest prefix of `hashes` (a sequence's block hashes
    /// in order), without taking them. (Admission walks both tiers block by block with
    /// [`lookup`](Self::lookup) instead.)
    #[cfg(test)]
    pub(crate) fn cached_prefix(&self, hashes: &[u64]) -> Vec<u32> {
        hashes
            .iter()
            .map_while(|h| self.by_hash.get(h).copied())
            .collect()
    }

    /// The block registered under `hash`, if any.
    pub fn lookup(&self, hash: u64) -> Option<u32> {
        self.by_hash.get(&hash).copied()
    }

    /// Makes the unreferenced cached block under `hash` the most recently freed (the last
    /// to be reclaimed). False when no block holds `hash`.
    pub fn touch(&mut self, hash: u64) -> bool {
        let Some(&b) = self.by_hash.get(&hash) else {
            return false;
        };
        if let Some(t) = self.lru_tick.remove(&b) {
            self.lru.remove(&t);
            self.tick += 1;
            self.lru.insert(self.tick, b);
            self.lru_tick.insert(b, self.tick);
        }
        true
    }

    /// How many of `blocks` (cached ones) no sequence references now: taking them uses up
    /// that many of [`num_free`](Self::num_free).
    pub fn num_unreferenced(&self, blocks: &[u32]) -> usize {
        blocks.iter().filter(|&&b| self.ref_count(b) == 0).count()
    }

    /// Adds one reference to each of `blocks` (from [`cached_prefix`](Self::cached_prefix)),
    /// taking those no sequence referenced out of the cache's reclaim order.
    pub fn take_cached(&mut self, blocks: &[u32]) {
        for &b in blocks {
            debug_assert!(self.hash_of.contains_key(&b), "block {b} is not cached");
            if self.ref_count(b) == 0 {
                if let Some(t) = self.lru_tick.remove(&b) {
                    self.lru.remove(&t);
                }
            }
            if let Some(count) = self.refs.get_mut(b as usize) {
                *count += 1;
            }
        }
    }

    /// Forgets every cached block (their contents are gone: a new engine's cache):
    /// unreferenced ones become free.
    pub fn clear_cache(&mut self) {
        self.hash_of.clear();
        self.by_hash.clear();
        self.lru_tick.clear();
        let lru = std::mem::take(&mut self.lru);
        self.free.extend(lru.into_values());
    }

    /// Blocks registered in the prefix cache (referenced or not).
    pub fn num_cached(&self) -> usize {
        self.hash_of.len()
    }

    /// Unregisters a referenced `block` (its contents will not be what its hash says):
    /// when its last reference goes it is free, not cached.
    pub fn forget(&mut self, block: u32) {
        debug_assert!(
            self.ref_count(block) > 0,
            "forget of unreferenced block {block}"
        );
        self.unregister(block);
    }

    fn unregister(&mut self, block: u32) {
        if let Some(h) = self.hash_of.remove(&block) {
            self.by_hash.remove(&h);
        }
    }

    /// Adds one reference to each block (a second owner shares it). Forking a free or
    /// unknown block is a caller bug: `debug_assert`, otherwise ignored.
    pub fn fork(&mut self, blocks: &[u32]) {
        for &b in blocks.iter().filter(|&&b| b != DROPPED) {
            match self.refs.get_mut(b as usize) {
                Some(count) if *count > 0 => *count += 1,
                _ => debug_assert!(false, "fork of free or unknown block {b}"),
            }
        }
    }

    /// Blocks an allocation may take: the free list and the unreferenced cached blocks.
    pub fn num_free(&self) -> usize {
        self.free.len() + self.lru.len()
    }

    /// Blocks in the pool.
    pub fn num_total(&self) -> usize {
        self.refs.len()
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Current reference count of `block` (0 when free or unknown).
    pub fn ref_count(&self, block: u32) -> u32 {
        self.refs.get(block as usize).copied().unwrap_or(0)
    }

    /// Whether `block` is registered in the prefix cache.
    #[cfg(test)]
    pub(crate) fn is_cached(&self, block: u32) -> bool {
        self.hash_of.contains_key(&block)
    }

    /// Checks the free-list invariant; used by tests after every step.
    #[cfg(test)]
    pub(crate) fn check_consistent(&self) {
        let mut seen = vec![false; self.refs.len()];
        for &b in &self.free {
            assert!(!seen[b as usize], "block {b} twice on the free list");
            seen[b as usize] = true;
            assert_eq!(self.refs[b as usize], 0, "free block {b} has references");
        }
        for (&t, &b) in &self.lru {
            assert!(!seen[b as usize], "block {b} both free and cached");
            seen[b as usize] = true;
            assert_eq!(
                self.refs[b as usize], 0,
                "cached block {b} in the reclaim order has references"
            );
            assert_eq!(self.lru_tick.get(&b), Some(&t));
            assert!(
                self.hash_of.contains_key(&b),
                "block {b} in the reclaim order is not registered"
            );
        }
        assert_eq!(self.lru.len(), self.lru_tick.len());
        for &b in &self.free {
            assert!(
                !self.hash_of.contains_key(&b),
                "free block {b} is registered"
            );
        }
        assert_eq!(self.hash_of.len(), self.by_hash.len());
        for (&b, &h) in &self.hash_of {
            assert_eq!(self.by_hash.get(&h), Some(&b));
        }
        let zero = self.refs.iter().filter(|&&r| r == 0).count();
        assert_eq!(
            zero,
            self.free.len() + self.lru.len(),
            "a block with no references is neither free nor cached"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_until_full_then_none_takes_nothing() {
        let mut bm = BlockManager::new(4, 16);
        assert_eq!(bm.allocate(3), Some(vec![0, 1, 2]));
        assert_eq!(bm.num_free(), 1);
        assert_eq!(bm.allocate(2), None);
        assert_eq!(bm.num_free(), 1, "a refused allocation takes nothing");
        assert_eq!(bm.allocate(0), Some(vec![]));
        assert_eq!(bm.allocate(1), Some(vec![3]));
        assert_eq!(bm.num_free(), 0);
        bm.check_consistent();
    }

    #[test]
    fn free_returns_blocks_and_they_are_reused() {
        let mut bm = BlockManager::new(4, 16);
        let a = bm.allocate(2).unwrap();
        let b = bm.allocate(2).unwrap();
        bm.free(&a);
        assert_eq!(bm.num_free(), 2);
        let c = bm.allocate(2).unwrap();
        let mut c_sorted = c.clone();
        c_sorted.sort();
        assert_eq!(c_sorted, a);
        assert!(c.iter().all(|x| !b.contains(x)));
        bm.check_consistent();
    }

    #[test]
    fn forked_block_is_free_only_after_last_owner_frees() {
        let mut bm = BlockManager::new(3, 8);
        let a = bm.allocate(2).unwrap();
        bm.fork(&a[..1]);
        assert_eq!(bm.ref_count(a[0]), 2);
        bm.free(&a);
        assert_eq!(bm.num_free(), 2, "the shared block is still owned");
        assert_eq!(bm.ref_count(a[0]), 1);
        bm.free(&a[..1]);
        assert_eq!(bm.num_free(), 3);
        bm.check_consistent();
    }

    #[test]
    fn cached_blocks_are_found_shared_and_reclaimed_last_freed_last() {
        let mut bm = BlockManager::new(4, 8);
        let a = bm.allocate(3).unwrap();
        assert!(bm.register(a[0], 10) && bm.register(a[1], 11));
        assert!(!bm.register(a[2], 10), "a hash maps to one block");
        assert!(!bm.register(a[0], 12), "a block has one hash");
        assert_eq!(bm.cached_prefix(&[10, 11, 99]), vec![a[0], a[1]]);
        assert_eq!(bm.cached_prefix(&[11]), vec![a[1]]);
        // Shared while referenced.
        bm.take_cached(&[a[0]]);
        assert_eq!(bm.ref_count(a[0]), 2);
        bm.free(&a);
        bm.check_consistent();
        // a[1] is cached and unreferenced, a[2] free, a[0] still held once.
        assert_eq!((bm.num_free(), bm.num_cached()), (3, 2));
        assert_eq!(bm.num_unreferenced(&[a[0], a[1]]), 1);
        bm.take_cached(&[a[1]]);
        assert_eq!(bm.ref_count(a[1]), 1);
        bm.free(&[a[0]]);
        bm.free(&[a[1]]);
        bm.check_consistent();
        // Four blocks: the free ones first, then the cached ones, least recently freed
        // first (a[1] was freed after a[0]); a reclaimed block is found no more.
        let got = bm.allocate(3).unwrap();
        assert!(got.contains(&a[0]) && !got.contains(&a[1]));
        assert_eq!(bm.cached_prefix(&[10, 11]), Vec::<u32>::new());
        assert_eq!(bm.cached_prefix(&[11]), vec![a[1]]);
        bm.check_consistent();
        bm.clear_cache();
        assert_eq!((bm.num_cached(), bm.num_free()), (0, 1));
        bm.check_consistent();
    }

    #[test]
    fn a_freed_chain_is_reclaimed_from_its_end() {
        let mut bm = BlockManager::new(3, 8);
        let a = bm.allocate(3).unwrap();
        for (i, &b) in a.iter().enumerate() {
            assert!(bm.register(b, 10 + i as u64));
        }
        bm.free(&a);
        bm.allocate(1).unwrap();
        // The chain's last block went; its first two are still found.
        assert_eq!(bm.cached_prefix(&[10, 11, 12]), vec![a[0], a[1]]);
        bm.check_consistent();
    }

    #[test]
    fn a_logging_pool_reports_what_it_reclaims_and_touch_defers_reclaim() {
        let mut bm = BlockManager::new(3, 8).with_eviction_log();
        let a = bm.allocate(3).unwrap();
        for (i, &b) in a.iter().enumerate() {
            assert!(bm.register(b, 10 + i as u64));
        }
        bm.free(&a);
        assert_eq!(bm.lookup(11), Some(a[1]));
        // The tail would go first; touching it makes a[1] the oldest.
        assert!(bm.touch(12) && !bm.touch(99));
        assert!(bm.take_evicted().is_empty());
        let got = bm.allocate(2).unwrap();
        assert_eq!(bm.take_evicted(), vec![(a[1], 11), (a[0], 10)]);
        assert!(bm.take_evicted().is_empty(), "taken once");
        assert_eq!(got.len(), 2);
        assert_eq!(bm.lookup(10), None);
        assert_eq!(bm.cached_prefix(&[12]), vec![a[2]]);
        bm.check_consistent();
        // A pool without the log records nothing.
        let mut plain = BlockManager::new(1, 8);
        let b = plain.allocate(1).unwrap();
        plain.register(b[0], 1);
        plain.free(&b);
        plain.allocate(1).unwrap();
        assert!(plain.take_evicted().is_empty());
    }

    #[test]
    fn blocks_for_rounds_up() {
        let bm = BlockManager::new(1, 32);
        assert_eq!(bm.blocks_for(0), 0);
        assert_eq!(bm.blocks_for(1), 1);
        assert_eq!(bm.blocks_for(32), 1);
        assert_eq!(bm.blocks_for(33), 2);
        assert_eq!(bm.block_size(), 32);
        assert_eq!(bm.num_total(), 1);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "double free")]
    fn double_free_is_caught_in_debug() {
        let mut bm = BlockManager::new(2, 8);
        let a = bm.allocate(1).unwrap();
        bm.free(&a);
        bm.free(&a);
    }

    #[test]
    fn double_free_never_corrupts_the_free_list() {
        let mut bm = BlockManager::new(2, 8);
        let a = bm.allocate(1).unwrap();
        bm.free(&a);
        // A panic (debug) or a no-op (release); the free list must be intact either way.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| bm.free(&a)));
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| bm.free(&[7])));
        bm.check_consistent();
        assert_eq!(bm.num_free(), 2);
        let both = bm.allocate(2).unwrap();
        assert_ne!(both[0], both[1]);
    }
}
