//! The CPU reference backend: plain, single-threaded Rust that states each
//! op's numerics as directly as possible. It is the oracle every GPU kernel
//! is tested against, so clarity beats speed here.
//!
//! Its functions are slice-level kernels with the preconditions their docs
//! state (slice lengths equal to the dims given, ids in range, counts below
//! 2^31 for int32 outputs), like `slice::copy_from_slice`: a violated
//! precondition panics. The op layer (`ops`) is the checked API: it
//! validates every shape, dtype and id before it calls in here, so no value
//! a caller of `ops` controls reaches an index or a narrowing cast
//! unchecked. Hence the crate's no-panic lints are lifted for this module.
#![allow(
    clippy::indexing_slicing,
    clippy::panic,
    clippy::cast_possible_truncation
)]

mod act_quant;
pub mod compressor;
pub mod engram;
mod gemm;
pub mod indexer;
pub mod kv_rows;
pub mod mhc;
pub mod moe;
pub mod moe_layout;
pub mod moe_masked;
pub mod paged;
mod rms_norm;
mod rope;
pub mod sparse_attention;
mod swiglu;

pub use act_quant::act_quant_fp8;
pub use gemm::{
    bf16_gemm, f32_gemm, fp4_gemm, fp4_gemm_f32, fp4_grouped_contiguous,
    fp4_grouped_contiguous_f32, fp4_grouped_masked, fp4_grouped_masked_f32, fp8_gemm, fp8_gemm_f32,
    mxfp8_dequantize,
};
pub use rms_norm::{rms_norm, rms_norm_act_quant_fp8};
pub use rope::{RopeParams, Yarn, inverse_rope, rope, rope_freqs, yarn_band};
pub use swiglu::swiglu_act_quant_fp8;
