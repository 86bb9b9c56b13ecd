//! Moving data between our host slices and tch tensors, shared by the
//! `torch-ref` tests. BF16 travels as its bit pattern, so nothing is rounded.

use half::bf16;
use tch::{Kind, Tensor as TT};

/// A CPU BF16 tensor of `shape` holding exactly `v`.
pub fn bf16_to_torch(v: &[bf16], shape: &[i64]) -> TT {
    let bits: Vec<i16> = v.iter().map(|x| x.to_bits() as i16).collect();
    TT::from_slice(&bits)
        .view_dtype(Kind::BFloat16)
        .reshape(shape)
}

/// A CPU F32 tensor of `shape` holding `v`.
pub fn f32_to_torch(v: &[f32], shape: &[i64]) -> TT {
    TT::from_slice(v).reshape(shape)
}

/// The BF16 values of `t`, flattened.
pub fn from_torch_bf16(t: &TT) -> Vec<bf16> {
    let bits = t.contiguous().view_dtype(Kind::Int16).reshape([-1]);
    let n = bits.numel();
    let mut out = vec![0i16; n];
    bits.copy_data(&mut out, n);
    out.into_iter().map(|b| bf16::from_bits(b as u16)).collect()
}

/// The F32 values of `t`, flattened.
pub fn from_torch_f32(t: &TT) -> Vec<f32> {
    let t = t.contiguous().reshape([-1]);
    let n = t.numel();
    let mut out = vec![0f32; n];
    t.copy_data(&mut out, n);
    out
}

/// The raw bytes of `t` (any 1-byte dtype), flattened.
pub fn bytes(t: &TT) -> Vec<u8> {
    let t = t.contiguous().view_dtype(Kind::Uint8).reshape([-1]);
    let n = t.numel();
    let mut out = vec![0u8; n];
    t.copy_data_u8(&mut out, n);
    out
}
