//! deepinfer: high-performance kernels and a thin model runner for
//! DeepSeek-V4.1-Flash.
//!
//! Layers, bottom up: the build system (`build.rs`) compiles the kernel
//! families of `kernels-cuda/` and `tilelang/` into the [`kernels`] registry;
//! [`device`] is the runtime (CPU, CUDA; Ascend later); [`cpu_backend`] holds
//! the reference implementation of every op and `cuda_backend` the launches;
//! [`ops`] is the safe API that validates its inputs and dispatches on the
//! tensors' device. [`numerics`] holds the bit-exact conversions. Above the
//! ops, [`ep`] spreads the routed experts over ranks (dispatch, combine,
//! placement), and [`model`] and [`engine`] are the runner.
//!
//! No panic is reachable from the public API through a value the caller
//! controls: library code has no `unwrap`, `expect`, `panic!`, unchecked
//! indexing or narrowing `as` casts (the lints below, run by `scripts/test`
//! with `-D warnings`). A module that indexes opens with the invariant that
//! bounds its indices (`cpu_backend`: slice lengths are the op layer's
//! validated shapes; `ops`: indices follow the shapes the op validated at its
//! entry), and a cast that cannot lose a value says why beside it.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing,
        clippy::cast_possible_truncation
    )
)]

pub mod contract;
pub mod cpu_backend;
#[cfg(deepinfer_cuda)]
pub mod cuda_backend;
pub mod device;
pub mod dtype;
pub mod engine;
pub mod ep;
pub mod error;
pub mod kernels;
pub mod kv_format;
pub mod model;
pub mod numerics;
pub mod numpy_rng;
pub mod ops;
pub mod parallel;
pub mod tensor;
#[cfg(test)]
mod testing;
pub mod weight_rng;

pub use device::Device;
pub use dtype::{DType, E4M3, E8M0, Fp4x2};
pub use error::{Error, Result};
pub use tensor::Tensor;

/// The accelerator this crate was built for (`cpu`, `nvidia` or `ascend`).
pub const ACCELERATOR: &str = kernels::ACCELERATOR;
