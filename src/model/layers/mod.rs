//! The layers of V4.1, each owning its parameters as tensors on the model's
//! device and computing only through the op API (`crate::ops`), so one
//! forward serves every device that implements the ops.
//!
//! Invariant: nothing here reads a backend directly; a layer's output for a
//! token depends only on that token's row and its own sequence's state.

pub mod attention;
pub mod engram;
pub mod linear;
pub mod mhc;
pub mod moe;

use crate::tensor::Tensor;

/// One backbone block or DSpark stage.
#[derive(Clone, Debug)]
pub struct Block {
    pub attn_norm: Tensor,
    pub ffn_norm: Tensor,
    pub hc_attn: mhc::Hc,
    pub hc_ffn: mhc::Hc,
    pub attn: attention::Attention,
    pub ffn: moe::Moe,
    pub engram: Option<engram::Engram>,
}
