//! Sizing the state pool from the device's free memory and a user budget
//! (issue 11, memory): the pool may take
//! `min(user budget, free − weights still to load − headroom)` bytes, where
//! the headroom is what a step needs besides the pool ([`step_headroom`]).
//! [`PoolConfig::within`] fits the pages of `max_seqs` sequences into that
//! budget, or says how many bytes they need.
//!
//! Invariant: the arithmetic is on byte counts and saturates; a budget
//! that leaves nothing for the pool, or a pool that does not fit it, is a
//! typed [`Error::OutOfMemory`](crate::Error::OutOfMemory) naming the bytes
//! asked and available, before anything is allocated.

use super::PoolConfig;
use crate::device::Device;
use crate::error::Error as OpError;
use crate::model::config::ModelConfig;
use crate::model::error::Result;

/// Device memory a CUDA step needs besides its activations: the context's
/// own allocations, cuBLAS/cuBLASLt workspaces, the loaded kernel images
/// and the allocator's rounding. 1 GiB: the context and modules take a few
/// hundred MB on the H200, cuBLASLt's workspaces tens of MB per handle.
pub const CUDA_RESERVE_BYTES: usize = 1 << 30;

/// The memory a pool may be sized from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolMemory {
    /// Free memory of the device now (GPU: `cuMemGetInfo`; host:
    /// `MemAvailable`).
    pub free: usize,
    /// Weights not yet resident that will be loaded before the pool (0 when
    /// the model is loaded: its weights are already out of `free`).
    pub weights_to_load: usize,
    /// What a step needs besides the pool ([`step_headroom`]).
    pub headroom: usize,
    /// The user's cap on the pool (`pool_memory`, `--pool-memory-mib`).
    pub user_budget: Option<usize>,
}

/// The activation bytes one step of `tokens` tokens may hold at once, an
/// upper estimate stated per token: the fp32 logits (vocab × 4), plus twice
/// (for the allocator and the outputs that overlap their inputs) the
/// largest set alive in a layer — the 4-stream residual in and out (2 ×
/// 4 · D fp32), the query and the attention output (2 × H · hd BF16) and
/// the routed rows with the experts' intermediate (k · (D + 2 · I) BF16).
/// V4.1: 0.52 MB of logits + 0.82 MB ≈ 1.34 MB per token.
pub fn step_workspace_bytes(cfg: &ModelConfig, tokens: usize) -> usize {
    let (d, a, m) = (cfg.hidden_size, cfg.attention, cfg.moe);
    let layer = (2 * cfg.mhc.mult * d * 4)
        .saturating_add(2 * a.n_heads * a.head_dim * 2)
        .saturating_add(m.n_activated_experts * (d + 2 * m.inter_dim) * 2);
    let per_token = (cfg.vocab_size * 4).saturating_add(2 * layer);
    tokens.saturating_mul(per_token)
}

/// The headroom a pool on `device` leaves for steps of up to `tokens`
/// tokens: on a GPU [`CUDA_RESERVE_BYTES`] plus [`step_workspace_bytes`];
/// on the host none (its pool is compared with `MemAvailable`, and every
/// host activation is reserved fallibly, a typed error when it fails).
pub fn step_headroom(device: &Device, cfg: &ModelConfig, tokens: usize) -> usize {
    match device {
        Device::Cpu => 0,
        Device::Cuda(_) => CUDA_RESERVE_BYTES.saturating_add(step_workspace_bytes(cfg, tokens)),
    }
}

impl PoolMemory {
    /// The free memory of `device` now, with the rest as given. A device
    /// that cannot say (a host without `/proc/meminfo`) counts as unbounded
    /// free memory: the user budget, if any, is then the only cap.
    pub fn query(
        device: &Device,
        weights_to_load: usize,
        headroom: usize,
        user_budget: Option<usize>,
    ) -> Result<PoolMemory> {
        Ok(PoolMemory {
            free: device.available_memory()?.unwrap_or(usize::MAX),
            weights_to_load,
            headroom,
            user_budget,
        })
    }

    /// What the device leaves for the pool: free − weights to load −
    /// headroom (0 when those exceed it).
    pub fn device_share(&self) -> usize {
        self.free
            .saturating_sub(self.weights_to_load)
            .saturating_sub(self.headroom)
    }

    /// Bytes the pool may take: `min(user budget, device share)`; an
    /// [`OpError::OutOfMemory`] when that is 0.
    pub fn budget(&self) -> Result<usize> {
        match self.cap() {
            0 => Err(self.refusal(1, 0)),
            budget => Ok(budget),
        }
    }

    fn cap(&self) -> usize {
        let share = self.device_share();
        self.user_budget.map_or(share, |u| u.min(share))
    }

    /// The out-of-memory error of a pool of `bytes` against `budget`,
    /// naming which cap binds.
    fn refusal(&self, bytes: usize, budget: usize) -> crate::model::Error {
        let device = if self.user_budget.is_some_and(|u| u <= self.device_share()) {
            "the pool budget (pool_memory)".to_string()
        } else {
            format!(
                "free device memory ({} bytes free, less {} of weights still to load and \
                 {} of headroom for the step)",
                self.free, self.weights_to_load, self.headroom
            )
        };
        OpError::OutOfMemory {
            what: "the state pool",
            bytes,
            device,
            available: budget,
        }
        .into()
    }

    /// Whether a pool of `bytes` fits [`PoolMemory::budget`]: `Ok`, or the
    /// out-of-memory error naming the bytes, the budget and which cap binds.
    pub fn check(&self, bytes: usize) -> Result<()> {
        let budget = self.cap();
        if bytes > budget || budget == 0 {
            return Err(self.refusal(bytes.max(1), budget));
        }
        Ok(())
    }
}

impl PoolConfig {
    /// The pages of `max_seqs` sequences of `max_context` tokens fed in
    /// steps of at most `max_chunk` tokens ([`PoolConfig::fitting`]), if
    /// they fit [`PoolMemory::budget`]; otherwise an out-of-memory error
    /// with the bytes they need and the budget.
    pub fn within(
        cfg: &ModelConfig,
        memory: &PoolMemory,
        max_seqs: usize,
        max_context: usize,
        max_chunk: usize,
        page_rows: usize,
    ) -> Result<PoolConfig> {
        let pc = PoolConfig::fitting(cfg, max_seqs, max_context, max_chunk, page_rows)?;
        memory.check(pc.memory_bytes(cfg)?)?;
        Ok(pc)
    }
}
