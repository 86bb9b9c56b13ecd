//! The CPU reference backend: plain, single-threaded Rust that states each
//! op's numerics as directly as possible. It is the oracle every GPU kernel
//! is tested against, so clarity beats speed here.

mod act_quant;
pub mod compressor;
pub mod engram;
pub mod indexer;
pub mod kv_format;
pub mod mhc;
pub mod moe;
pub mod numpy_rng;
mod rms_norm;
pub mod sparse_attention;

pub use act_quant::act_quant_fp8;
pub use rms_norm::rms_norm;
