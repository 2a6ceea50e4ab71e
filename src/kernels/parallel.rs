//! Splitting a matrix product's output columns across threads: each job owns a disjoint
//! range of weight rows, so it writes a disjoint set of output elements.

use rayon::prelude::*;

/// A raw pointer handed to parallel jobs that each write a disjoint set of elements.
#[derive(Clone, Copy)]
pub struct SendPtr(*mut f32);

// SAFETY: jobs write disjoint elements (distinct weight rows → distinct output columns).
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

impl SendPtr {
    pub fn new(y: &mut [f32]) -> Self {
        SendPtr(y.as_mut_ptr())
    }

    /// Taken through a method so closures capture the whole (Send) wrapper.
    pub fn get(self) -> *mut f32 {
        self.0
    }
}

/// Runs `job(o0, o1)` over `0..m` in ranges of `rows_per_job`, on the thread pool unless
/// the product (`flops` multiply-adds) is too small to pay for it.
pub fn for_row_ranges(
    m: usize,
    rows_per_job: usize,
    flops: usize,
    job: impl Fn(usize, usize) + Sync + Send,
) {
    let jobs = m.div_ceil(rows_per_job);
    let run = |j: usize| job(j * rows_per_job, ((j + 1) * rows_per_job).min(m));
    if flops < 1 << 16 {
        (0..jobs).for_each(run);
    } else {
        (0..jobs).into_par_iter().for_each(run);
    }
}

/// `y[t] += bias` for every row `t` of `y` (`[n, bias.len()]`).
pub fn add_bias(y: &mut [f32], bias: Option<&[f32]>) {
    if let Some(b) = bias {
        for row in y.chunks_exact_mut(b.len()) {
            for (v, bb) in row.iter_mut().zip(b) {
                *v += bb;
            }
        }
    }
}
