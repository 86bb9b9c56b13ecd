//! The low-latency mode of a one-rank group with its buffers allocated
//! once (DeepEP's low-latency `Buffer`): [`LowLatencyBuffer`].
//!
//! A dispatch is two launches and a combine one
//! ([`crate::ops::moe_masked_layout_into`], [`crate::ops::moe_masked_scatter_into`],
//! [`crate::ops::moe_masked_combine_into`]): the masked layout is computed on
//! the device (each entry's rank within its expert, no atomics), nothing is
//! allocated, nothing is copied to or from the host and nothing waits, so a
//! decode step can capture them in a CUDA graph and replay them with new
//! inputs in the same tensors. The overflow count stays on the device until
//! [`LowLatencyBuffer::overflow`] reads it.
//!
//! Results are those of [`super::dispatch`] and [`super::combine`] in the
//! low-latency mode, bitwise: the same rows (expert-major, ascending entry
//! within an expert, the first `capacity` entries kept), the same FP8
//! quantisation, the same fp32 summation order in combine.

use super::{EpConfig, Mode, Payload};
use crate::contract::MX_BLOCK;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops;
use crate::tensor::Tensor;

const OP: &str = "ep::LowLatencyBuffer";

/// The preallocated low-latency buffers of one rank of a one-rank group
/// (`L` local experts, capacity `C`, hidden `D`, at most `max_tokens`
/// tokens a call). Each [`LowLatencyBuffer::dispatch`] overwrites the
/// previous one's results.
#[derive(Debug)]
pub struct LowLatencyBuffer {
    cfg: EpConfig,
    max_tokens: usize,
    /// `[L, C, D]` BF16, or e4m3 with the FP8 payload; rows past an
    /// expert's count are stale (the masked GEMMs read none of them).
    pub(super) x: Tensor,
    /// The FP8 payload's E8M0 scales `[L, C, D/32]`.
    pub(super) scales: Option<Tensor>,
    /// F32 `[L, C]`, 0 past a count.
    pub(super) weights: Tensor,
    /// I32 `[L]`: rows filled per local expert.
    pub(super) counts: Tensor,
    /// I32 `[L + 1]`: entries dropped past each expert's capacity, then
    /// entries with an id outside `0..n_experts`.
    dropped: Tensor,
    /// I32 `[max_tokens, top_k]`: each entry's row in the `[L · C]` rows,
    /// −1 when dropped; the first `tokens` rows are the last dispatch's.
    pub(super) pos: Tensor,
    /// Tokens of the last dispatch.
    tokens: Option<usize>,
}

fn bad(arg: &'static str, value: impl ToString, why: &'static str) -> Error {
    Error::Argument {
        op: OP,
        arg,
        value: value.to_string(),
        why,
    }
}

fn shape(tensor: &'static str, t: &Tensor, expected: String) -> Error {
    Error::Shape {
        op: OP,
        tensor,
        got: t.shape().to_vec(),
        expected,
    }
}

impl LowLatencyBuffer {
    /// Allocates the buffers of `cfg` (a low-latency mode on a one-rank
    /// placement) on `device`, once.
    pub fn new(cfg: &EpConfig, device: &Device) -> Result<LowLatencyBuffer> {
        Self::sized(cfg, device, None)
    }

    /// [`LowLatencyBuffer::new`] with room for `tokens` tokens a call in
    /// place of the mode's max_tokens (`ep::dispatch`'s buffers of one call:
    /// memory for the tokens it has, not for the most the mode allows).
    pub(super) fn sized(
        cfg: &EpConfig,
        device: &Device,
        tokens: Option<usize>,
    ) -> Result<LowLatencyBuffer> {
        let Mode::LowLatency {
            max_tokens,
            capacity,
        } = cfg.mode()
        else {
            return Err(bad(
                "cfg",
                "normal mode",
                "the preallocated buffers are the low-latency mode's",
            ));
        };
        if cfg.placement().ranks() != 1 {
            return Err(Error::Unsupported {
                op: OP,
                device: device.to_string(),
                why: "the preallocated path serves a one-rank group; a wider group dispatches through ep::dispatch",
            });
        }
        let max_tokens = tokens.map_or(max_tokens, |t| t.clamp(1, max_tokens));
        let (l, d, k) = (cfg.placement().slots_per_rank(), cfg.hidden(), cfg.top_k());
        let (x, scales) = match cfg.payload() {
            Payload::Bf16 => (Tensor::empty(device, DType::BF16, &[l, capacity, d])?, None),
            Payload::Fp8 => (
                Tensor::empty(device, DType::F8E4M3, &[l, capacity, d])?,
                Some(Tensor::empty(
                    device,
                    DType::E8M0,
                    &[l, capacity, d / MX_BLOCK],
                )?),
            ),
        };
        Ok(LowLatencyBuffer {
            cfg: cfg.clone(),
            max_tokens,
            x,
            scales,
            weights: Tensor::empty(device, DType::F32, &[l, capacity])?,
            counts: Tensor::empty(device, DType::I32, &[l])?,
            dropped: Tensor::empty(device, DType::I32, &[l + 1])?,
            pos: Tensor::empty(device, DType::I32, &[max_tokens, k])?,
            tokens: None,
        })
    }

    /// Lays this rank's tokens out expert-major in the buffers: `x` BF16
    /// `[T, D]`, `ids` I32 `[T, top_k]` logical expert ids (as
    /// [`ops::moe_route`] returns them) and `weights` F32 `[T, top_k]`, T ≤
    /// max_tokens, on the buffers' device. Issues device work only: no
    /// allocation, no copy to the host, no wait. An expert's entries past its
    /// capacity, and entries whose id is out of range, are dropped and
    /// counted for [`LowLatencyBuffer::overflow`].
    pub fn dispatch(&mut self, x: &Tensor, ids: &Tensor, weights: &Tensor) -> Result<()> {
        let (k, d) = (self.cfg.top_k(), self.cfg.hidden());
        x.expect_dtype(OP, "x", DType::BF16)?;
        ids.expect_dtype(OP, "ids", DType::I32)?;
        weights.expect_dtype(OP, "weights", DType::F32)?;
        let &[t, xd] = x.shape() else {
            return Err(shape("x", x, format!("[T, {d}]")));
        };
        if xd != d {
            return Err(shape("x", x, format!("[T, {d}]")));
        }
        if t > self.max_tokens {
            return Err(bad(
                "x",
                format!("{t} tokens"),
                "more tokens than the low-latency mode's max_tokens",
            ));
        }
        if ids.shape() != [t, k] {
            return Err(shape("ids", ids, format!("[{t}, {k}]")));
        }
        if weights.shape() != [t, k] {
            return Err(shape("weights", weights, format!("[{t}, {k}]")));
        }
        // Before anything is written, so a refused call leaves the last
        // dispatch's results whole.
        ops::common_device(
            OP,
            &[
                ("buffers", &self.x),
                ("x", x),
                ("ids", ids),
                ("weights", weights),
            ],
        )?;
        self.tokens = None;
        ops::moe_masked_layout_into(
            ids,
            weights,
            &mut self.pos,
            &mut self.counts,
            &mut self.weights,
            &mut self.dropped,
        )?;
        ops::moe_masked_scatter_into(x, &self.pos, &mut self.x, self.scales.as_mut())?;
        self.tokens = Some(t);
        Ok(())
    }

    /// The received rows `[L, C, D]` (BF16, or e4m3 with the FP8 payload).
    pub fn x(&self) -> &Tensor {
        &self.x
    }

    /// The FP8 payload's E8M0 scales `[L, C, D/32]`.
    pub fn scales(&self) -> Option<&Tensor> {
        self.scales.as_ref()
    }

    /// Each row's F32 routing weight `[L, C]`, 0 past a count.
    pub fn weights(&self) -> &Tensor {
        &self.weights
    }

    /// I32 `[L]`: rows filled per local expert (the masked GEMMs' counts).
    pub fn counts(&self) -> &Tensor {
        &self.counts
    }

    /// Tokens of the last dispatch (`None` before the first, or after a
    /// dispatch that failed).
    pub fn tokens(&self) -> Option<usize> {
        self.tokens
    }

    /// Entries the last dispatch dropped past an expert's capacity (their
    /// tokens' combine lacks them). Reads the count back, so it waits for
    /// the dispatch; an error naming `ids` when some expert id was outside
    /// `0..n_experts` (those entries were dropped too).
    pub fn overflow(&self) -> Result<usize> {
        if self.tokens.is_none() {
            return Ok(0);
        }
        let v = self.dropped.to_vec::<i32>()?;
        let (&bad_ids, per_expert) = v.split_last().unwrap_or((&0, &[]));
        if bad_ids != 0 {
            return Err(bad(
                "ids",
                format!("{bad_ids} entries"),
                "an expert id outside 0..n_experts (the entries were dropped)",
            ));
        }
        Ok(per_expert
            .iter()
            .map(|&c| usize::try_from(c).unwrap_or(0))
            .sum())
    }

    /// Sums the expert outputs of the last dispatch into `out` (BF16
    /// `[T, D]`): `expert_out` BF16 `[L, C, D]` in the dispatch's layout
    /// (rows past the counts ignored), `shared` BF16 `[T, D]` (this rank's
    /// shared-expert output). Bitwise [`super::combine`]; device work only,
    /// like the dispatch.
    pub fn combine_into(
        &self,
        expert_out: &Tensor,
        shared: &Tensor,
        out: &mut Tensor,
    ) -> Result<()> {
        let Some(t) = self.tokens else {
            return Err(bad(
                "self",
                "no dispatch",
                "combine follows a successful dispatch",
            ));
        };
        let d = self.cfg.hidden();
        expert_out.expect_dtype(OP, "expert_out", DType::BF16)?;
        let want = [self.weights.shape(), &[d]].concat();
        if expert_out.shape() != want.as_slice() {
            return Err(shape("expert_out", expert_out, format!("{want:?}")));
        }
        if shared.shape() != [t, d] {
            return Err(shape("shared", shared, format!("[{t}, {d}]")));
        }
        ops::moe_masked_combine_into(expert_out, &self.pos, shared, out)
    }
}
