//! The GPU self-check (`inflight gpu-check`, feature `cuda`): every CUDA kernel against its
//! CPU twin on fresh random inputs with NaN-poisoned outputs (`kernels`, and `sample` for
//! the sampling kernel), then whole-model
//! checks (`model`): SmolLM2 greedy on the GPU against the CPU engine, and a logits dump
//! that scripts/hf_compare.py checks against HF transformers. Prints one table.

mod attention;
pub mod families;
mod family_kernels;
pub mod kernels;
pub mod model;
pub mod profile;
mod quant_kernels;
pub use quant_kernels::rates as quant_rates;
mod sample;
mod timeline;

/// One line of the table.
pub struct Row {
    pub check: String,
    pub shape: String,
    /// Max |gpu - cpu| / max |cpu| (or the figure the note names).
    pub err: f64,
    pub tol: f64,
    /// Every output element was written (no poison left) and nothing else was.
    pub written: bool,
    pub note: String,
    /// Reported, not required (the note says why).
    pub info: bool,
}

impl Row {
    pub fn pass(&self) -> bool {
        self.written && self.err.is_finite() && self.err < self.tol
    }
}

/// Prints the rows as a Markdown table; returns whether every row passed.
pub fn print_table(rows: &[Row]) -> bool {
    println!("| check | shape | max rel err | tol | all written | result | note |");
    println!("|---|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {:.2e} | {:.0e} | {} | {} | {} |",
            r.check,
            r.shape,
            r.err,
            r.tol,
            if r.written { "yes" } else { "NO" },
            match (r.pass(), r.info) {
                (true, _) => "PASS",
                (false, true) => "info",
                (false, false) => "FAIL",
            },
            r.note
        );
    }
    let failed = rows.iter().filter(|r| !r.pass() && !r.info).count();
    println!("\n{} checks, {} failed", rows.len(), failed);
    failed == 0
}

/// `(max |a - b| / max |b|, no NaN in a)`: the normwise relative error of `a` against the
/// reference `b`, and whether `a` holds no poison.
pub fn rel_err(a: &[f32], b: &[f32]) -> (f64, bool) {
    let written = a.len() == b.len() && a.iter().all(|v| !v.is_nan());
    let scale = b
        .iter()
        .fold(0f64, |m, &v| m.max(v.abs() as f64))
        .max(1e-30);
    let diff = a
        .iter()
        .zip(b)
        .fold(0f64, |m, (&x, &y)| m.max((x as f64 - y as f64).abs()));
    (diff / scale, written)
}
