//! [`TokenMask`]: the set of tokens a constraint allows next (one bit per token id), as
//! a grammar gives it; applied to a row of logits on the host (here) and on the device
//! (kernels/sample.cu reads the same words).

/// Allowed token ids as bits: bit `i % 32` of word `i / 32` set means id `i` may come
/// next. Ids at or past `bits` (a vocabulary padded beyond the tokenizer's) are never
/// allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenMask {
    words: Vec<u32>,
    bits: usize,
}

impl TokenMask {
    /// A mask over `bits` ids from its words (extra words are dropped, missing ones
    /// disallow their ids).
    pub fn from_words(mut words: Vec<u32>, bits: usize) -> Self {
        let n = bits.div_ceil(32);
        words.resize(n, 0);
        if !bits.is_multiple_of(32) {
            if let Some(last) = words.last_mut() {
                *last &= (1u32 << (bits % 32)) - 1;
            }
        }
        TokenMask { words, bits }
    }

    /// A mask over `bits` ids allowing none.
    pub fn none(bits: usize) -> Self {
        TokenMask::from_words(Vec::new(), bits)
    }

    /// Whether `token` is allowed.
    pub fn allows(&self, token: u32) -> bool {
        let t = token as usize;
        t < self.bits && self.words[t / 32] >> (t % 32) & 1 == 1
    }

    /// Allows `token` too (ignored past `bits`).
    pub fn allow(&mut self, token: u32) {
        let t = token as usize;
        if t < self.bits {
            self.words[t / 32] |= 1 << (t % 32);
        }
    }

    /// Disallows `token`.
    pub fn forbid(&mut self, token: u32) {
        let t = token as usize;
        if t < self.bits {
            self.words[t / 32] &= !(1 << (t % 32));
        }
    }

    /// How many ids are allowed.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The mask's words, as the device reads them.
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// Ids the mask covers.
    pub fn bits(&self) -> usize {
        self.bits
    }

    /// Sets every disallowed logit of `logits` to -inf.
    pub fn apply(&self, logits: &mut [f32]) {
        for (w, chunk) in logits.chunks_mut(32).enumerate() {
            let word = self.words.get(w).copied().unwrap_or(0);
            if word == u32::MAX {
                continue;
            }
            for (b, x) in chunk.iter_mut().enumerate() {
                if word >> b & 1 == 0 {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn applies_bans_everything_outside_the_mask_and_past_its_bits() {
        let mut m = TokenMask::none(40);
        m.allow(3);
        m.allow(33);
        m.allow(45); // past its bits: ignored
        assert_eq!(m.count(), 2);
        assert!(m.allows(3) && m.allows(33) && !m.allows(4) && !m.allows(45));
        let mut row = vec![1.0f32; 50];
        m.apply(&mut row);
        let kept: Vec<usize> = (0..50).filter(|&i| row[i].is_finite()).collect();
        assert_eq!(kept, vec![3, 33]);
        m.forbid(3);
        assert!(!m.allows(3));
    }

    #[test]
    fn from_words_clears_bits_past_the_end() {
        let m = TokenMask::from_words(vec![u32::MAX, u32::MAX], 36);
        assert_eq!(m.count(), 36);
        assert_eq!(m.words(), &[u32::MAX, 0xf]);
        let mut row = vec![0.0f32; 64];
        m.apply(&mut row);
        assert_eq!(row.iter().filter(|x| x.is_finite()).count(), 36);
    }
}
