//! Paged KV-cache block accounting: which block ids are free and how many sequences
//! reference each one. It owns no memory (the engines own the KV tensors); the
//! scheduler is its only caller and the only one that frees.
//!
//! Blocks are reference counted from the start so that prefix sharing and
//! copy-on-write forks (beam search, n > 1) need no change here: `fork` adds a
//! reference, `free` drops one, and a block returns to the free list when its count
//! reaches zero. Invariant: a block is on the free list exactly when its count is 0.

/// Reference-counted pool of fixed-size KV blocks.
#[derive(Debug, Clone)]
pub struct BlockManager {
    block_size: usize,
    /// Reference count per block id; 0 means free.
    refs: Vec<u32>,
    /// Free block ids; allocation pops from the end.
    free: Vec<u32>,
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
        }
    }

    /// Takes `n` free blocks, each with one reference. `None` means there is no room;
    /// nothing is taken then, so the caller can wait or preempt.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<u32>> {
        if n > self.free.len() {
            return None;
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
        for &b in blocks {
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
                self.free.push(b);
            }
        }
    }

    /// Adds one reference to each block (a second owner shares it). Forking a free or
    /// unknown block is a caller bug: `debug_assert`, otherwise ignored.
    pub fn fork(&mut self, blocks: &[u32]) {
        for &b in blocks {
            match self.refs.get_mut(b as usize) {
                Some(count) if *count > 0 => *count += 1,
                _ => debug_assert!(false, "fork of free or unknown block {b}"),
            }
        }
    }

    /// Blocks on the free list.
    pub fn num_free(&self) -> usize {
        self.free.len()
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

    /// Checks the free-list invariant; used by tests after every step.
    #[cfg(test)]
    pub(crate) fn check_consistent(&self) {
        let mut seen = vec![false; self.refs.len()];
        for &b in &self.free {
            assert!(!seen[b as usize], "block {b} twice on the free list");
            seen[b as usize] = true;
            assert_eq!(self.refs[b as usize], 0, "free block {b} has references");
        }
        let zero = self.refs.iter().filter(|&&r| r == 0).count();
        assert_eq!(
            zero,
            self.free.len(),
            "a block with no references is not free"
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
