//! Expert parallelism in DeepEP's terms (`kernels.md` §3): [`dispatch`]
//! sends each token's row to the ranks that hold its experts and lays the
//! received rows out expert-major for the grouped FP4 GEMMs; [`combine`]
//! brings the expert outputs home and sums them. The ranks talk through a
//! [`Transport`]; which rank holds which expert is a [`Placement`], with
//! replicas of hot experts computed by [`balance`] from an [`ExpertLoad`].
//!
//! Two modes, as DeepEP's: [`Mode::Normal`] (prefill) gives the contiguous
//! layout (rows grouped by local expert, I32 offsets); [`Mode::LowLatency`]
//! (decode) gives the masked layout, a fixed capacity of rows per local
//! expert with I32 counts, the shapes fixed by the mode so a decode step can
//! keep its buffers. An entry past an expert's capacity is dropped and
//! counted in [`Dispatched::overflow`], never written over another. On a
//! one-rank group the mode's layout is computed on the device
//! ([`crate::ops::moe_masked_layout_into`]), and [`LowLatencyBuffer`] runs it
//! in buffers allocated once, with no host round trip: CUDA-graph
//! capturable.
//!
//! Payloads: BF16, or FP8 e4m3 with 1 × 32 E8M0 scales quantised once per
//! token before it is sent (`act_quant` is row-wise, so this equals
//! quantising the permuted rows, as the single-GPU MoE does, bit for bit).
//!
//! Invariant: route → dispatch → grouped GEMMs → combine equals the
//! single-rank MoE (`model::layers::moe`) bitwise, for every world size and
//! placement. The grouped GEMMs compute each row alone, so where a row is
//! computed does not change it; combine returns every entry's BF16 row
//! unreduced and sums a token's rows on its own rank in slot order
//! (ascending expert id) from 0.0 in fp32, the shared expert last, through
//! [`crate::ops::moe_combine`]. The price is top_k rows per token on the way
//! back where DeepEP sends one pre-reduced row per rank (pre-reducing would
//! change the fp32 summation order). Indices in this module are bounded by
//! the placement's table and the shapes `dispatch` validated.
#![allow(clippy::indexing_slicing)]

mod dispatch;
mod low_latency;
#[cfg(deepinfer_cuda)]
mod nccl;
mod placement;
mod transport;

pub use dispatch::{Dispatched, EpHandle, combine, dispatch};
pub use low_latency::LowLatencyBuffer;
#[cfg(deepinfer_cuda)]
pub use nccl::{NcclId, NcclTransport, nccl_world};
pub use placement::{EP_MAX_RANKS, EP_MAX_SLOTS, ExpertLoad, Placement, balance};
pub use transport::{Local, SimRank, SimWorld, Transport};

use crate::contract::MX_BLOCK;
use crate::error::{Error, Result};

/// What dispatch sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Payload {
    /// BF16 rows.
    Bf16,
    /// FP8 e4m3 rows with 1 × 32 E8M0 scales (hidden a multiple of 32).
    Fp8,
}

/// The received layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Prefill: rows grouped by local expert, `[N, D]` with offsets.
    Normal,
    /// Decode: `[local experts, capacity, D]` with counts. At most
    /// `max_tokens` tokens per rank per call; `capacity` rows per local
    /// expert ([`Mode::low_latency`] gives the capacity that never
    /// overflows).
    LowLatency { max_tokens: usize, capacity: usize },
}

impl Mode {
    /// The low-latency mode whose capacity holds every entry: a token picks
    /// a local expert at most once, so world · max_tokens.
    pub fn low_latency(max_tokens: usize, world: usize) -> Mode {
        Mode::LowLatency {
            max_tokens,
            capacity: max_tokens.saturating_mul(world),
        }
    }
}

/// An expert-parallel group's settings, checked once.
#[derive(Clone, Debug)]
pub struct EpConfig {
    placement: Placement,
    top_k: usize,
    hidden: usize,
    payload: Payload,
    mode: Mode,
}

fn bad(arg: &'static str, value: impl ToString, why: &'static str) -> Error {
    Error::Argument {
        op: "ep::EpConfig",
        arg,
        value: value.to_string(),
        why,
    }
}

/// Most rows one low-latency buffer holds (local experts · capacity): the
/// bound that keeps a decode buffer's size sane (2^24 rows of D 5120 BF16
/// are 160 GiB already).
pub const EP_MAX_LOW_LATENCY_ROWS: usize = 1 << 24;

impl EpConfig {
    /// Checks that top_k is 1..=n_experts, hidden ≥ 1 (a multiple of 32 for
    /// FP8), and, for the low-latency mode, max_tokens ≥ 1, capacity ≥ 1 and
    /// local experts · capacity ≤ [`EP_MAX_LOW_LATENCY_ROWS`].
    pub fn new(
        placement: Placement,
        top_k: usize,
        hidden: usize,
        payload: Payload,
        mode: Mode,
    ) -> Result<EpConfig> {
        if top_k == 0 || top_k > placement.n_experts() {
            return Err(bad("top_k", top_k, "needs 1 <= top_k <= the expert count"));
        }
        if hidden == 0 || payload == Payload::Fp8 && !hidden.is_multiple_of(MX_BLOCK) {
            return Err(bad(
                "hidden",
                hidden,
                "needs hidden >= 1, a multiple of 32 for the FP8 payload",
            ));
        }
        if let Mode::LowLatency {
            max_tokens,
            capacity,
        } = mode
        {
            let rows = placement.slots_per_rank().checked_mul(capacity);
            if max_tokens == 0 || capacity == 0 || rows.is_none_or(|r| r > EP_MAX_LOW_LATENCY_ROWS)
            {
                return Err(bad(
                    "mode",
                    format!("max_tokens {max_tokens}, capacity {capacity}"),
                    "needs max_tokens, capacity >= 1 and local experts * capacity <= 2^24",
                ));
            }
        }
        Ok(EpConfig {
            placement,
            top_k,
            hidden,
            payload,
            mode,
        })
    }

    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    pub fn top_k(&self) -> usize {
        self.top_k
    }

    pub fn hidden(&self) -> usize {
        self.hidden
    }

    pub fn payload(&self) -> Payload {
        self.payload
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }
}
