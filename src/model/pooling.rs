//! Embeddings from a decoder: how a prompt's final hidden states (after the final norm)
//! become one vector. [`Pooling`] says which rows count (the last token's, or the mean of
//! every token's), [`PoolSum`] gathers them over a prompt computed in several chunks, and
//! the result is L2-normalized, as sentence-embedding models' outputs are compared by
//! cosine.

use serde::{Deserialize, Serialize};

/// Which of a prompt's final hidden states make its embedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pooling {
    /// The last token's: the only one that has seen the whole prompt in a causal decoder
    /// (what decoder embedding models such as e5-mistral or Qwen3-Embedding use).
    #[default]
    Last,
    /// The mean of every token's.
    Mean,
}

impl Pooling {
    /// Hidden-state rows a chunk of `tokens` new tokens contributes: the mean reads every
    /// row; the last token reads the final chunk's last row (`sample`: the chunk reaches
    /// the prompt's end).
    pub fn rows(self, tokens: usize, sample: bool) -> usize {
        match self {
            Pooling::Mean => tokens,
            Pooling::Last => usize::from(sample).min(tokens),
        }
    }
}

/// The pooled rows of one prompt so far, across its chunks.
#[derive(Debug, Clone, Default)]
pub struct PoolSum {
    sum: Vec<f64>,
    rows: usize,
}

impl PoolSum {
    /// Adds row-major rows `[n, width]` of final hidden states.
    pub fn add(&mut self, rows: &[f32], width: usize) {
        if width == 0 {
            return;
        }
        if self.sum.is_empty() {
            self.sum = vec![0.0; width];
        }
        for row in rows.chunks_exact(width) {
            for (s, &v) in self.sum.iter_mut().zip(row) {
                *s += f64::from(v);
            }
            self.rows += 1;
        }
    }

    /// Rows added so far.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The mean of the rows added, L2-normalized (empty when none was).
    pub fn finish(self) -> Vec<f32> {
        let n = self.rows.max(1) as f64;
        let mean: Vec<f32> = self.sum.iter().map(|&s| (s / n) as f32).collect();
        normalized(mean)
    }
}

/// `v` scaled to unit L2 norm (a zero vector stays zero).
pub fn normalized(mut v: Vec<f32>) -> Vec<f32> {
    let norm = v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    if norm > 0.0 {
        v.iter_mut()
            .for_each(|x| *x = (f64::from(*x) / norm) as f32);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_read_per_chunk() {
        assert_eq!(Pooling::Last.rows(5, false), 0);
        assert_eq!(Pooling::Last.rows(5, true), 1);
        assert_eq!(Pooling::Mean.rows(5, false), 5);
        assert_eq!(Pooling::Mean.rows(5, true), 5);
    }

    #[test]
    fn mean_over_chunks_is_normalized() {
        let mut p = PoolSum::default();
        p.add(&[1.0, 0.0, 3.0, 0.0], 2);
        p.add(&[2.0, 6.0], 2);
        assert_eq!(p.rows(), 3);
        // The mean is (2, 2): unit norm along the diagonal.
        let v = p.finish();
        let h = std::f32::consts::FRAC_1_SQRT_2;
        assert!((v[0] - h).abs() < 1e-6 && (v[1] - h).abs() < 1e-6, "{v:?}");
        assert_eq!(normalized(vec![0.0, 0.0]), vec![0.0, 0.0]);
        assert!(PoolSum::default().finish().is_empty());
    }

    #[test]
    fn config_spelling() {
        #[derive(Deserialize)]
        struct C {
            pooling: Pooling,
        }
        let c: C = toml::from_str("pooling = \"mean\"").unwrap();
        assert_eq!(c.pooling, Pooling::Mean);
        assert!(toml::from_str::<C>("pooling = \"max\"").is_err());
        assert_eq!(Pooling::default(), Pooling::Last);
    }
}
