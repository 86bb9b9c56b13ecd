//! The config of one rank of an expert-parallel (EP) deployment, for the
//! per-GPU bench: [`ModelConfig::ep_rank`].
//!
//! What it models: one of `ep` GPUs serving V4.1-Flash with the routed
//! experts split evenly over the ranks and everything else replicated, with
//! the communication left out. Every official dimension (hidden width,
//! heads, ranks, expert width, vocabulary, window, indexer, mHC) and the
//! 43-entry layer schedule (40 backbone layers with their roles, 3 DSpark
//! stages) are kept; each backbone layer holds `n_routed_experts / ep` routed
//! experts (48, 24 and 6 for EP 8, 16 and 64), and the router scores and
//! selects among those local experts only, with the official top-k. So a
//! token's MoE does the work of a rank whose dispatch delivered it k expert
//! rows, and a step reads the weights one rank holds.
//!
//! What it does not model:
//! - the dispatch and combine (no all-to-all; `docs/wide-ep.md` models it),
//!   and the load imbalance between ranks: here every token's k experts are
//!   local, while in a deployment a rank receives the rows routed to its
//!   experts from every rank (on average the same number of rows per rank
//!   when routing is balanced, k × tokens / ep per expert set);
//! - the router's distribution: selecting among 384 / ep local scores is not
//!   the official routing restricted to a rank;
//! - the Engram tables: 2 × 101 GB cannot live on one GPU. The hash space
//!   (`engram_vocab_size`) is divided by `ep`, so each table holds about
//!   1/ep of the official rows (the primes, and so the table sizes, are
//!   derived again from the smaller hash space, as the config requires),
//!   standing for a table sharded by rows over the EP group. The per-token
//!   work (lookups, gathered bytes, the `wkv` projection) is unchanged; the
//!   hashed row ids differ from the official model's;
//! - the DSpark drafter keeps its own 128 experts (replicated per rank: at
//!   EP 64 a 128 / 64 split would leave 2 experts for its top-3); the bench
//!   does not run it.
//!
//! Invariant: the returned config passed [`ModelConfig::validate`], and
//! differs from the input only in `moe.n_routed_experts`,
//! `engram.hash_space` and `engram.table_rows`.

use super::error::ConfigError;
use super::types::ModelConfig;

/// The official V4.1-Flash config (`models/deepseek-v4.1-flash/config.json`,
/// the Hugging Face form), embedded for the benches and tests that build
/// full-width models without a checkpoint.
pub const V41_FLASH_CONFIG: &str = include_str!("../../../models/deepseek-v4.1-flash/config.json");

impl ModelConfig {
    /// One rank of an EP-`ep` deployment of this model (module doc): the
    /// routed experts divided by `ep` in every backbone layer, routing
    /// among them with the same top-k, the Engram hash space divided by
    /// `ep`. `ep` must divide `n_routed_experts` and leave at least top-k
    /// experts per rank; `ep` = 1 returns the model unchanged.
    pub fn ep_rank(&self, ep: usize) -> Result<ModelConfig, ConfigError> {
        let experts = self.moe.n_routed_experts;
        if ep == 0 || !experts.is_multiple_of(ep) {
            return Err(ConfigError::EpDegree {
                ep,
                experts,
                why: "the routed experts must split evenly over the ranks",
            });
        }
        let local = experts / ep;
        let k = self.moe.n_activated_experts;
        if k > local {
            return Err(ConfigError::EpTopK { ep, local, k });
        }
        let mut cfg = self.clone();
        cfg.moe.n_routed_experts = local;
        if ep > 1 && !cfg.engram.layer_ids.is_empty() {
            let e = &mut cfg.engram;
            e.hash_space = (e.hash_space / ep as u64).max(1);
            e.table_rows = e
                .table_primes()?
                .iter()
                .map(|primes| primes.iter().fold(0u64, |s, &p| s.saturating_add(p)))
                .collect();
        }
        cfg.validate()?;
        Ok(cfg)
    }
}
