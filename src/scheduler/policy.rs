//! Scheduler configuration, the two capacity policies, and the limits a request is
//! checked against when it is added (`AddError`). The per-iteration mechanics live in
//! `schedule.rs`; this file says what each policy promises.

use super::sequence::SeqSpec;

/// How admission treats the KV cache (TensorRT-LLM's `CapacitySchedulerPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SchedulerPolicy {
    /// Admit a sequence only if blocks for its whole life (prompt + max new tokens)
    /// are free after counting what running sequences are still guaranteed. Running
    /// sequences never run out of blocks and are never preempted (LongRoPE's restart at
    /// the original context gives a sequence's blocks back and queues it first to be
    /// computed again, admitted in the same step when nothing more urgent waits).
    #[default]
    GuaranteedNoEvict,
    /// Admit a sequence when blocks for what it computes now are free. When a running
    /// sequence needs a block and none is free, the most recently admitted running
    /// sequence is preempted: its computed blocks are swapped out to the host cache when
    /// that has room (and swapped back in when it resumes, before any new admission),
    /// else it is preempted by recompute.
    MaxUtilization,
}

/// Limits of one scheduler. Defaults follow TensorRT-LLM's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Sequences running at once (and so scheduled in one iteration).
    pub max_batch_size: usize,
    /// Tokens computed per iteration, prefill chunks and decodes together.
    pub max_num_tokens: usize,
    /// Sequences waiting for admission before `add` refuses with `QueueFull`.
    pub max_queue_size: usize,
    /// Known tokens of the waiting sequences before `add` refuses with `QueueFull` (0: no
    /// limit); a prompt longer than this alone can never be queued (`TooLong`).
    pub max_queued_tokens: usize,
    /// How admission treats the KV cache.
    pub policy: SchedulerPolicy,
    /// Split prompts longer than the iteration's remaining token budget.
    pub enable_chunked_context: bool,
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV blocks in the cache (the real value comes from the engine's memory budget).
    pub num_blocks: usize,
    /// KV blocks of the host cache that preempted sequences swap out to (0: preemption
    /// is by recompute only).
    pub num_host_blocks: usize,
    /// Longest sequence, prompt plus generated tokens.
    pub max_seq_len: usize,
    /// Reuse the KV blocks of prompt prefixes other sequences computed (prefix caching,
    /// TensorRT-LLM's `enable_kv_cache_reuse`).
    pub enable_kv_cache_reuse: bool,
    /// Plan each iteration while the one before it runs, where the engine samples on its
    /// device and no draft source stands in front of it (`scheduler::overlap`).
    pub overlap: bool,
    /// The sliding window every layer attends within (Mistral), where all do: a running
    /// sequence gives back each block wholly behind the window of its next query
    /// ([`block_manager::DROPPED`](super::block_manager::DROPPED) takes its place in the
    /// table). None: blocks are kept for the sequence's life.
    pub kv_window: Option<usize>,
    /// LongRoPE's original context (`ModelConfig::long_rope_from`): a sequence longer
    /// than this is computed with the long factors at every position
    /// ([`ScheduledSeq::long_rope`](super::ScheduledSeq::long_rope)), recomputed from its
    /// first token when a decode crosses it. None: every sequence is computed alike.
    pub long_rope_from: Option<usize>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            max_batch_size: 64,
            max_num_tokens: 8192,
            max_queue_size: 1024,
            max_queued_tokens: 0,
            policy: SchedulerPolicy::GuaranteedNoEvict,
            enable_chunked_context: false,
            block_size: 32,
            num_blocks: 4096,
            num_host_blocks: 0,
            max_seq_len: 8192,
            enable_kv_cache_reuse: true,
            overlap: true,
            kv_window: None,
            long_rope_from: None,
        }
    }
}

/// A configuration the scheduler cannot run with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A limit (named) is below its minimum (given).
    #[error("scheduler config: {0} must be at least {1}")]
    TooSmall(&'static str, usize),
    /// A cache has more blocks than u32 block ids can name.
    #[error("scheduler config: {0} blocks do not fit u32 block ids")]
    TooManyBlocks(usize),
}

impl SchedulerConfig {
    /// Checks the limits a scheduler needs: at least one sequence, token and block, room
    /// for two tokens per sequence, block counts that fit u32 ids.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let minimums = [
            ("max_batch_size", self.max_batch_size, 1),
            ("max_num_tokens", self.max_num_tokens, 1),
            ("block_size", self.block_size, 1),
            ("num_blocks", self.num_blocks, 1),
            // Room for one prompt token and one generated token.
            ("max_seq_len", self.max_seq_len, 2),
        ];
        for (name, value, min) in minimums {
            if value < min {
                return Err(ConfigError::TooSmall(name, min));
            }
        }
        for n in [self.num_blocks, self.num_host_blocks] {
            if u32::try_from(n).is_err() {
                return Err(ConfigError::TooManyBlocks(n));
            }
        }
        Ok(())
    }

    /// Checks a request against the limits that would keep it from ever running.
    ///
    /// Design decision: without chunked context a prompt longer than `max_num_tokens`
    /// is refused here (as TensorRT-LLM requires `max_num_tokens >= max_input_len`);
    /// under `MaxUtilization` so is one whose recompute after a preemption (prompt +
    /// generated tokens) could exceed it. A request whose KV needs exceed the whole
    /// cache is refused too, since it could never finish.
    pub(crate) fn check(&self, spec: &SeqSpec) -> Result<(), AddError> {
        let prompt = spec.prompt.len();
        if prompt == 0 {
            return Err(AddError::Empty);
        }
        let too_long = |tokens, max, limit| Err(AddError::TooLong { tokens, max, limit });
        if prompt >= self.max_seq_len {
            return too_long(prompt, self.max_seq_len - 1, Limit::MaxSeqLen);
        }
        let kv_tokens = kv_tokens_needed(prompt, spec.max_new_tokens, self.max_seq_len);
        if !self.enable_chunked_context {
            let mut recomputed = match self.policy {
                SchedulerPolicy::GuaranteedNoEvict => prompt,
                SchedulerPolicy::MaxUtilization => kv_tokens,
            };
            // A decode crossing LongRoPE's original context computes up to one token past
            // it again in one chunk.
            if let Some(from) = self
                .long_rope_from
                .filter(|&f| spec.beam_width <= 1 && prompt <= f && kv_tokens > f)
            {
                recomputed = recomputed.max(kv_tokens.min(from + 1));
            }
            if recomputed > self.max_num_tokens {
                return too_long(recomputed, self.max_num_tokens, Limit::MaxNumTokens);
            }
        }
        if self.max_queued_tokens > 0 && prompt > self.max_queued_tokens {
            return too_long(prompt, self.max_queued_tokens, Limit::QueuedTokens);
        }
        let capacity = self.num_blocks * self.block_size;
        if kv_tokens > capacity {
            return too_long(kv_tokens, capacity, Limit::KvCache);
        }
        // A beam search holds blocks for all its beams at once, runs them all in one batch,
        // and a forked beam computes up to a block's tokens again in one chunk.
        if spec.beam_width > 1 {
            let beams = spec.beam_width * kv_tokens.div_ceil(self.block_size) * self.block_size;
            if beams > capacity {
                return too_long(beams, capacity, Limit::KvCache);
            }
            if spec.beam_width > self.max_batch_size {
                return Err(AddError::TooManyBeams {
                    beams: spec.beam_width,
                    max: self.max_batch_size,
                });
            }
            if !self.enable_chunked_context && self.max_num_tokens < self.block_size {
                return too_long(self.block_size, self.max_num_tokens, Limit::MaxNumTokens);
            }
        }
        Ok(())
    }
}

/// Tokens a sequence ever holds in the KV cache: every known token but the last
/// generated one, which is sampled and never fed back; a sequence that generates nothing
/// (its prompt's hidden states are its answer) holds its whole prompt.
pub(crate) fn kv_tokens_needed(prompt: usize, max_new_tokens: usize, max_seq_len: usize) -> usize {
    if max_new_tokens == 0 {
        return prompt;
    }
    (prompt + max_new_tokens).min(max_seq_len) - 1
}

/// Which limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// The longest sequence the model serves (`max_seq_len`).
    MaxSeqLen,
    /// Tokens one iteration computes (`max_num_tokens`) without chunked context.
    MaxNumTokens,
    /// The whole KV cache.
    KvCache,
    /// Tokens the queue holds (`max_queued_tokens`).
    QueuedTokens,
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Limit::MaxSeqLen => "the maximum sequence length",
            Limit::MaxNumTokens => "the tokens one iteration can compute",
            Limit::KvCache => "the KV cache capacity",
            Limit::QueuedTokens => "the tokens the queue holds (max_queued_tokens)",
        })
    }
}

/// Why `add` refused a request; the messages are meant for the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddError {
    /// `max_queue_size` sequences are waiting already.
    #[error("the request queue is full ({max} waiting requests); retry later")]
    QueueFull {
        /// The queue's size.
        max: usize,
    },
    /// The waiting sequences hold so many tokens that this prompt would pass
    /// `max_queued_tokens`.
    #[error("the request queue is full ({queued} of {max} queued tokens); retry later")]
    QueueTokensFull {
        /// Tokens waiting now.
        queued: usize,
        /// The limit.
        max: usize,
    },
    /// The request needs more tokens than a limit allows.
    #[error("the request needs {tokens} tokens, more than {limit} ({max} tokens)")]
    TooLong {
        /// Tokens it needs under that limit.
        tokens: usize,
        /// Tokens the limit allows.
        max: usize,
        /// The limit.
        limit: Limit,
    },
    /// A beam search of more beams than a batch holds.
    #[error("beam_width {beams} is more than max_batch_size ({max}): a search runs all its beams in one batch")]
    TooManyBeams {
        /// The search's beams.
        beams: usize,
        /// The batch's size.
        max: usize,
    },
    /// The prompt has no tokens.
    #[error("the prompt is empty")]
    Empty,
    /// A waiting or running sequence has this id.
    #[error("a request with this id is already in progress")]
    DuplicateId,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(prompt: usize, max_new: usize) -> SeqSpec {
        SeqSpec {
            id: 1,
            prompt: vec![1; prompt],
            max_new_tokens: max_new,
            num_draft_tokens: 0,
            cache_salt: 0,
            priority: 0,
            beam_width: 1,
        }
    }

    #[test]
    fn default_is_valid_and_trtllm_like() {
        let c = SchedulerConfig::default();
        assert_eq!(c.validate(), Ok(()));
        assert_eq!((c.max_batch_size, c.max_num_tokens), (64, 8192));
        assert_eq!(c.max_queue_size, 1024);
        assert_eq!(c.policy, SchedulerPolicy::GuaranteedNoEvict);
        assert!(!c.enable_chunked_context);
        assert_eq!(c.block_size, 32);
    }

    #[test]
    fn zero_limits_are_refused() {
        let c = SchedulerConfig {
            max_num_tokens: 0,
            ..Default::default()
        };
        assert_eq!(
            c.validate(),
            Err(ConfigError::TooSmall("max_num_tokens", 1))
        );
        let c = SchedulerConfig {
            max_seq_len: 1,
            ..Default::default()
        };
        assert!(c.validate().is_err());
    }

    #[test]
    fn request_limits() {
        let c = SchedulerConfig {
            max_num_tokens: 100,
            max_seq_len: 200,
            num_blocks: 20,
            block_size: 16,
            ..Default::default()
        };
        assert_eq!(c.check(&spec(0, 5)), Err(AddError::Empty));
        assert_eq!(
            c.check(&spec(5, 0)),
            Ok(()),
            "a prompt alone (an embedding)"
        );
        assert_eq!(
            kv_tokens_needed(5, 0, 200),
            5,
            "every prompt token's KV is written"
        );
        assert_eq!(kv_tokens_needed(5, 1, 200), 5);
        assert!(matches!(
            c.check(&spec(200, 5)),
            Err(AddError::TooLong {
                limit: Limit::MaxSeqLen,
                max: 199,
                ..
            })
        ));
        assert!(matches!(
            c.check(&spec(101, 5)),
            Err(AddError::TooLong {
                limit: Limit::MaxNumTokens,
                ..
            })
        ));
        assert_eq!(c.check(&spec(100, 500)), Ok(()), "generation is clamped");
        let chunked = SchedulerConfig {
            enable_chunked_context: true,
            ..c.clone()
        };
        assert_eq!(chunked.check(&spec(150, 5)), Ok(()));
        let small_cache = SchedulerConfig {
            num_blocks: 2,
            ..chunked
        };
        let err = small_cache.check(&spec(30, 10)).unwrap_err();
        assert_eq!(
            err,
            AddError::TooLong {
                tokens: 39,
                max: 32,
                limit: Limit::KvCache
            }
        );
        assert_eq!(
            err.to_string(),
            "the request needs 39 tokens, more than the KV cache capacity (32 tokens)"
        );
        let max_util = SchedulerConfig {
            policy: SchedulerPolicy::MaxUtilization,
            ..c
        };
        assert!(matches!(
            max_util.check(&spec(90, 20)),
            Err(AddError::TooLong {
                tokens: 109,
                limit: Limit::MaxNumTokens,
                ..
            })
        ));
    }
}
