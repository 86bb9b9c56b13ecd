//! One sublayer's single-pass mHC (`v41-flash.md` §6): the front half (the
//! collapse with the lagged pre, the mixes and their split, then the
//! sublayer norm) and the expand of the sublayer output into the streams.
//!
//! Invariant: `pre` carries the lagged pre from sublayer to sublayer (one
//! row per token, one-hot before the first sublayer). A sublayer's expand
//! waits in [`Streams`] until the streams are next needed: by the next
//! front half, which runs it fused when `Model::mhc_fusion` is on
//! ([`ops::mhc_expand_pre`], one pass over the streams on CUDA), or by
//! anything else ([`Streams::ready`]); with fusion off (the default: the
//! fused kernel is the slower one on the H200) it runs at once. Either way
//! the result is the expand's, bitwise.

use super::linear::Normed;
use crate::error::Result;
use crate::ops::{self, MhcParams, MhcWeights};
use crate::tensor::Tensor;

/// The mHC parameters of one sublayer and its norm.
#[derive(Clone, Debug)]
pub struct Hc {
    /// `[24, 4·D]` F32.
    pub func: Tensor,
    /// `[24]` F32.
    pub base: Tensor,
    /// `[3]` F32.
    pub scale: Tensor,
}

/// What the expand needs from the front half.
pub struct HcMix {
    pub post: Tensor,
    pub comb: Tensor,
}

/// The 4-stream residual between sublayers: the streams that entered the
/// last sublayer and, until it is run, that sublayer's expand (its output
/// and mix).
pub struct Streams {
    s: Tensor,
    pending: Option<(Tensor, HcMix)>,
    /// Whether an expand waits for the next front half (`Model::mhc_fusion`)
    /// or runs at once.
    fuse: bool,
}

impl Streams {
    /// Streams with nothing pending; `fuse`: whether expands wait to run
    /// fused with the next front half.
    pub fn new(s: Tensor, fuse: bool) -> Streams {
        Streams {
            s,
            pending: None,
            fuse,
        }
    }

    /// Replaces the streams by `f` of them (a pending expand run first).
    pub fn replace<E: From<crate::Error>>(
        &mut self,
        f: impl FnOnce(&Tensor) -> std::result::Result<Tensor, E>,
    ) -> std::result::Result<(), E> {
        self.s = f(self.ready()?)?;
        Ok(())
    }

    /// The streams, after running a pending expand.
    pub fn ready(&mut self) -> Result<&Tensor> {
        if let Some((f, mix)) = &self.pending {
            self.s = mix.expand(&self.s, f)?;
            self.pending = None;
        }
        Ok(&self.s)
    }

    /// Leaves the expand of the sublayer output `f` (BF16 `[T, D]`) with
    /// `mix` for the next front half or [`Streams::ready`] (without fusion,
    /// runs it now); a pending expand is run first.
    pub fn expand_later(&mut self, f: Tensor, mix: HcMix) -> Result<()> {
        self.ready()?;
        self.pending = Some((f, mix));
        if !self.fuse {
            self.ready()?;
        }
        Ok(())
    }
}

impl Hc {
    /// The weights as [`ops::mhc_pre`] and [`ops::mhc_expand_pre`] take them.
    fn weights(&self) -> MhcWeights<'_> {
        MhcWeights {
            func: &self.func,
            base: &self.base,
            scale: &self.scale,
        }
    }

    /// The sublayer input `norm(collapse(streams, pre))` (BF16 `[T, D]`,
    /// with its FP8 quantisation); `pre` becomes this sublayer's pre. A
    /// pending expand of `streams` runs fused with this front half.
    pub fn input(
        &self,
        streams: &mut Streams,
        pre: &mut Tensor,
        norm: &Tensor,
        params: MhcParams,
    ) -> Result<(Normed, HcMix)> {
        let w = self.weights();
        // A pending expand is dropped only once it ran (an error leaves the
        // streams as they were).
        let m = match &streams.pending {
            Some((f, mix)) => {
                let (s, m) =
                    ops::mhc_expand_pre(&streams.s, f, &mix.post, &mix.comb, w, pre, params)?;
                streams.s = s;
                streams.pending = None;
                m
            }
            None => ops::mhc_pre(&streams.s, w.func, w.base, w.scale, pre, params)?,
        };
        *pre = m.pre;
        let x = Normed::new(&m.u, norm, params.eps)?;
        Ok((
            x,
            HcMix {
                post: m.post,
                comb: m.comb,
            },
        ))
    }
}

impl HcMix {
    /// The new streams from the sublayer output `f` (BF16 `[T, D]`).
    pub fn expand(&self, streams: &Tensor, f: &Tensor) -> Result<Tensor> {
        ops::mhc_expand(streams, f, &self.post, &self.comb)
    }
}
