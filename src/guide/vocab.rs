//! The model's vocabulary as llguidance sees it: every token's bytes in a token trie
//! (control tokens marked, so grammars never produce them), the model's end tokens as
//! the trie's end tokens, and one parser factory built from it.

use std::sync::Arc;

use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::ParserFactory;

use crate::tokenizer::Tokenizer;

/// The parser factory of `tokenizer`'s vocabulary.
pub(super) fn factory(tokenizer: &Tokenizer) -> Result<ParserFactory, String> {
    let n = tokenizer.vocab_size();
    let words: Vec<Vec<u8>> = (0..n as u32)
        .map(|id| {
            let bytes = tokenizer.token_bytes(id).unwrap_or_default();
            if tokenizer.is_special(id) || tokenizer.eos_token_ids().contains(&id) {
                // llguidance's marker for tokens that are not text.
                let mut w = Vec::with_capacity(bytes.len() + 1);
                w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                w.extend_from_slice(&bytes);
                w
            } else {
                bytes
            }
        })
        .collect();
    let eos = tokenizer.eos_token_ids();
    let mut info = TokRxInfo::new(n as u32, eos.first().copied().unwrap_or(0));
    info.tok_bos = tokenizer.bos_token_id();
    let trie = TokTrie::from(&info, &words).with_eos_tokens(eos);
    let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
    let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
    factory.quiet();
    Ok(factory)
}
