//! One sublayer's single-pass mHC (`v41-flash.md` §6): the front half (the
//! collapse with the lagged pre, the mixes and their split, then the
//! sublayer norm) and the expand of the sublayer output into the streams.
//!
//! Invariant: `pre` carries the lagged pre from sublayer to sublayer (one
//! row per token, one-hot before the first sublayer).

use super::linear::Normed;
use crate::error::Result;
use crate::ops::{self, MhcParams};
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

impl Hc {
    /// The sublayer input `norm(collapse(streams, pre))` (BF16 `[T, D]`,
    /// with its FP8 quantisation); `pre` becomes this sublayer's pre.
    pub fn input(
        &self,
        streams: &Tensor,
        pre: &mut Tensor,
        norm: &Tensor,
        params: MhcParams,
    ) -> Result<(Normed, HcMix)> {
        let m = ops::mhc_pre(streams, &self.func, &self.base, &self.scale, pre, params)?;
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
