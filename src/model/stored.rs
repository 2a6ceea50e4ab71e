//! 16-bit weights left where a checkpoint's memory map holds them: a matrix's parts (q, k
//! and v; gate and up), each a run of rows in a safetensors shard, in the dtype stored
//! (bf16 or f16). Loading for the GPU engine reads nothing at load time: the uploader copies
//! the rows straight from the page cache into page-locked buffers and the device converts
//! them (`gpu::upload`). The CPU engine loads its own weights converted; a stored matrix
//! only reaches it through code that runs a GPU model's host copy, which converts rows as
//! it reads them.

use std::sync::Arc;

use memmap2::Mmap;

/// The 16-bit type a tensor is stored in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoredType {
    /// bfloat16.
    Bf16,
    /// IEEE half precision.
    F16,
}

impl StoredType {
    /// A stored value as f32.
    fn value(self, lo: u8, hi: u8) -> f32 {
        match self {
            StoredType::Bf16 => half::bf16::from_le_bytes([lo, hi]).to_f32(),
            StoredType::F16 => half::f16::from_le_bytes([lo, hi]).to_f32(),
        }
    }
}

/// One tensor's rows in a memory map: `rows` rows of `cols` 16-bit values from byte `start`.
#[derive(Clone)]
pub struct StoredPart {
    pub(crate) map: Arc<Mmap>,
    pub(crate) start: usize,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) dtype: StoredType,
}

impl StoredPart {
    /// Its bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map[self.start..self.start + self.rows * self.cols * 2]
    }
}

/// A matrix of stacked parts (rows of the first part, then the second's, ...), all of one
/// dtype and width.
#[derive(Clone)]
pub struct Stored {
    pub(crate) parts: Vec<StoredPart>,
    pub(crate) dtype: StoredType,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
}

impl Stored {
    /// The parts stacked, when they share a dtype and a width (None for none).
    pub fn stack(parts: Vec<StoredPart>) -> Option<Stored> {
        let first = parts.first()?;
        let (dtype, cols) = (first.dtype, first.cols);
        if parts.iter().any(|p| p.dtype != dtype || p.cols != cols) {
            return None;
        }
        let rows = parts.iter().map(|p| p.rows).sum();
        Some(Stored {
            parts,
            dtype,
            rows,
            cols,
        })
    }

    /// The type its values are stored in.
    pub fn dtype(&self) -> StoredType {
        self.dtype
    }

    /// Rows, all parts together.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Values per row.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The bytes of stacked row `r`.
    pub fn row_bytes(&self, mut r: usize) -> &[u8] {
        for p in &self.parts {
            if r < p.rows {
                let row = 2 * self.cols;
                return &p.bytes()[r * row..(r + 1) * row];
            }
            r -= p.rows;
        }
        panic!("row {r} past the matrix's {} rows", self.rows);
    }

    /// The bytes of stacked rows `r0..r1` that lie in one part, from `r0` on: a run of
    /// whole rows (at least one when `r0 < r1`).
    pub fn run_bytes(&self, r0: usize, r1: usize) -> &[u8] {
        let mut base = 0;
        for p in &self.parts {
            if r0 < base + p.rows {
                let row = 2 * self.cols;
                let end = r1.min(base + p.rows);
                return &p.bytes()[(r0 - base) * row..(end - base) * row];
            }
            base += p.rows;
        }
        &[]
    }

    /// Row `r` as f32.
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        for (o, b) in out.iter_mut().zip(self.row_bytes(r).chunks_exact(2)) {
            *o = self.dtype.value(b[0], b[1]);
        }
    }

    /// Every value as f32, row-major.
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        for (r, row) in out.chunks_mut(self.cols.max(1)).enumerate() {
            self.row_into(r, row);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapped(values: &[f32], dtype: StoredType) -> Arc<Mmap> {
        let mut bytes = vec![0u8; 6];
        for &v in values {
            bytes.extend(match dtype {
                StoredType::Bf16 => half::bf16::from_f32(v).to_le_bytes(),
                StoredType::F16 => half::f16::from_f32(v).to_le_bytes(),
            });
        }
        let mut map = memmap2::MmapMut::map_anon(bytes.len()).unwrap();
        map.copy_from_slice(&bytes);
        Arc::new(map.make_read_only().unwrap())
    }

    #[test]
    fn stacked_parts_read_as_one_matrix() {
        let a = mapped(&[1.0, 2.0, 3.0, 4.0], StoredType::Bf16);
        let b = mapped(&[5.0, 6.0], StoredType::Bf16);
        let part = |map: &Arc<Mmap>, rows| StoredPart {
            map: map.clone(),
            start: 6,
            rows,
            cols: 2,
            dtype: StoredType::Bf16,
        };
        let s = Stored::stack(vec![part(&a, 2), part(&b, 1)]).unwrap();
        assert_eq!((s.rows(), s.cols()), (3, 2));
        assert_eq!(s.to_f32(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        // A run stops at its part's end.
        assert_eq!(s.run_bytes(1, 3).len(), 4);
        assert_eq!(s.run_bytes(2, 3).len(), 4);
        let mut row = [0f32; 2];
        s.row_into(2, &mut row);
        assert_eq!(row, [5.0, 6.0]);
        // Parts of different types or widths do not stack.
        let f16 = StoredPart {
            dtype: StoredType::F16,
            ..part(&mapped(&[1.0, 2.0], StoredType::F16), 1)
        };
        assert!(Stored::stack(vec![part(&a, 2), f16]).is_none());
        assert!(Stored::stack(Vec::new()).is_none());
    }
}
