//! Incremental detokenization that never splits a UTF-8 character: token bytes go in,
//! only complete characters come out; bytes that can never become valid UTF-8 come out
//! as U+FFFD so a stream never stalls. The bytes are `Tokenizer::token_bytes`: a
//! byte-level token's bytes, or a SentencePiece byte-fallback token's one byte (`<0xE4>`),
//! so a character spelled in several byte tokens comes out whole once its last arrives.

/// Per-sequence detokenizer state: the bytes of an unfinished character.
#[derive(Default, Debug)]
pub struct Detokenizer {
    pending: Vec<u8>,
}

impl Detokenizer {
    /// A detokenizer with nothing pending.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one token's bytes; returns the text that is now complete.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[..good]).expect("valid prefix"));
                    match e.error_len() {
                        // An incomplete character at the end: wait for more bytes.
                        None => {
                            self.pending.drain(..good);
                            return out;
                        }
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..good + bad);
                        }
                    }
                }
            }
        }
    }

    /// Ends the sequence: whatever is left is flushed (lossily).
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }

    /// True when bytes of an unfinished character are held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multibyte_characters_split_across_tokens() {
        let text = "héllo 世界 🦀!";
        let bytes = text.as_bytes();
        // Feed one byte at a time: every emitted piece is whole characters.
        let mut d = Detokenizer::new();
        let mut out = String::new();
        for b in bytes {
            out.push_str(&d.push(&[*b]));
        }
        out.push_str(&d.finish());
        assert_eq!(out, text);
        let mut d = Detokenizer::new();
        assert_eq!(d.push(&bytes[..8]), "héllo ");
        assert!(d.has_pending());
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        let mut d = Detokenizer::new();
        assert_eq!(d.push(&[b'a', 0xff, b'b']), "a\u{fffd}b");
        assert_eq!(d.push(&[0xe4, 0xb8]), "");
        assert_eq!(d.finish(), "\u{fffd}");
    }
}
