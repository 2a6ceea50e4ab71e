//! [`GuideState`]: one sequence's place in its grammar (an llguidance matcher) and the
//! mask of the tokens it allows next, computed once per token: ahead of the step that
//! needs it where the caller prepares it (while the forward pass runs), else on demand.

use std::sync::Arc;

use llguidance::Matcher;

use super::{Compiled, GrammarMask};
use crate::sampling::TokenMask;

/// The grammar's next-token mask from `m`: its allowed tokens with the end tokens taken
/// out, and whether it may end (it accepts, or has nothing more to match). `trie_eos`:
/// the vocabulary trie's end tokens (the model's, see `vocab`).
pub(super) fn grammar_mask(
    m: &mut Matcher,
    bits: usize,
    trie_eos: &[u32],
) -> Result<GrammarMask, String> {
    if m.is_stopped() {
        return match m.get_error() {
            Some(e) => Err(e),
            None => Ok(GrammarMask {
                allowed: TokenMask::none(bits),
                may_end: true,
            }),
        };
    }
    let vob = m.compute_mask().map_err(|e| e.to_string())?;
    let mut allowed = TokenMask::from_words(vob.as_slice().to_vec(), bits);
    let mut may_end = false;
    for &t in trie_eos {
        may_end |= allowed.allows(t);
        allowed.forbid(t);
    }
    Ok(GrammarMask { allowed, may_end })
}

/// One sequence's grammar state.
#[derive(Clone)]
pub struct GuideState {
    matcher: Matcher,
    trie_eos: Arc<[u32]>,
    /// The request's end tokens (none with `ignore_eos`): allowed where the grammar may end.
    end_ids: Vec<u32>,
    bits: usize,
    /// The mask of the next token, once computed.
    next: Option<Arc<TokenMask>>,
    /// A token the grammar refused (sampled outside the mask: only a forced end does
    /// that): from then on only end tokens are allowed.
    broken: bool,
}

impl std::fmt::Debug for GuideState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuideState")
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}

impl GuideState {
    /// A sequence at the start of `compiled`'s grammar; `end_ids` end it where the
    /// grammar may end.
    pub fn new(compiled: &Compiled, end_ids: Vec<u32>) -> Self {
        let bits = compiled.first.allowed.bits();
        let mut s = GuideState {
            matcher: (*compiled.start).clone(),
            trie_eos: compiled.trie_eos.clone(),
            end_ids,
            bits,
            next: None,
            broken: false,
        };
        s.next = Some(Arc::new(s.finish(compiled.first.as_ref().clone())));
        s
    }

    fn finish(&self, g: GrammarMask) -> TokenMask {
        let mut mask = g.allowed;
        if g.may_end {
            for &t in &self.end_ids {
                mask.allow(t);
            }
        }
        mask
    }

    fn compute(&mut self) -> TokenMask {
        if self.broken {
            return self.finish(GrammarMask {
                allowed: TokenMask::none(self.bits),
                may_end: true,
            });
        }
        match grammar_mask(&mut self.matcher, self.bits, &self.trie_eos) {
            Ok(g) => self.finish(g),
            Err(e) => {
                tracing::warn!("grammar failed, ending the sequence: {e}");
                self.broken = true;
                self.compute()
            }
        }
    }

    /// Computes the next token's mask now if it is not known yet.
    pub fn prepare(&mut self) {
        if self.next.is_none() {
            self.next = Some(Arc::new(self.compute()));
        }
    }

    /// Whether the next token's mask is known.
    pub fn is_prepared(&self) -> bool {
        self.next.is_some()
    }

    /// The tokens allowed next.
    pub fn mask(&mut self) -> Arc<TokenMask> {
        self.prepare();
        self.next
            .clone()
            .unwrap_or_else(|| Arc::new(TokenMask::none(self.bits)))
    }

    /// Moves past `token` (an end token ends the grammar and changes nothing).
    pub fn advance(&mut self, token: u32) {
        self.next = None;
        if self.broken || self.end_ids.contains(&token) {
            return;
        }
        if self.matcher.consume_token(token).is_err() {
            self.broken = true;
        }
    }

    /// The masks of the token after each prefix of `drafts` (`drafts.len() + 1` of
    /// them), as if those tokens had been chosen: for a device that verifies a draft in
    /// one step. After a draft token the grammar refuses, every later row gets the mask
    /// of the refusal's row (its draft is rejected there, so later rows go unused).
    pub fn masks_after(&mut self, drafts: &[u32]) -> Vec<Arc<TokenMask>> {
        let mut out = vec![self.mask()];
        let mut consumed = 0;
        for &t in drafts {
            let last = out[out.len() - 1].clone();
            let ok = !self.broken
                && last.allows(t)
                && !self.end_ids.contains(&t)
                && self.matcher.consume_token(t).is_ok();
            if !ok {
                out.resize(drafts.len() + 1, last);
                break;
            }
            consumed += 1;
            out.push(Arc::new(self.compute()));
        }
        if consumed > 0 && self.matcher.rollback(consumed).is_err() {
            self.broken = true;
        }
        out
    }
}
