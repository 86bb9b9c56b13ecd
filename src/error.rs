//! The crate's one error type. Every fallible public function returns
//! [`Result`]; bad input never panics. Each variant names the offending
//! tensor, shape, dtype, kernel or device so the message alone locates it.

use crate::dtype::DType;

/// Errors returned by every public deepinfer API.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tensor had the wrong dtype for the op.
    #[error("{op}: tensor `{tensor}` has dtype {got}, expected {expected}")]
    DType {
        op: &'static str,
        tensor: &'static str,
        got: DType,
        expected: DType,
    },
    /// A tensor had the wrong shape for the op.
    #[error("{op}: tensor `{tensor}` has shape {got:?}, expected {expected}")]
    Shape {
        op: &'static str,
        tensor: &'static str,
        got: Vec<usize>,
        expected: String,
    },
    /// Element count and data length disagree when building a tensor.
    #[error("tensor of dtype {dtype} and shape {shape:?} needs {expected} elements, got {got}")]
    DataLength {
        dtype: DType,
        shape: Vec<usize>,
        expected: usize,
        got: usize,
    },
    /// Operands of one op live on different devices.
    #[error("{op}: tensor `{tensor}` is on {got}, the op runs on {expected}")]
    DeviceMismatch {
        op: &'static str,
        tensor: &'static str,
        got: String,
        expected: String,
    },
    /// A scalar argument is outside its valid range.
    #[error("{op}: argument `{arg}` = {value} is invalid: {why}")]
    Argument {
        op: &'static str,
        arg: &'static str,
        value: String,
        why: &'static str,
    },
    /// The requested backend is not usable on this machine or in this build.
    #[error("device {device} unavailable: {why}")]
    DeviceUnavailable { device: String, why: String },
    /// The op exists but has no implementation on this device yet.
    #[error("{op} is not implemented on {device} yet ({why})")]
    Unsupported {
        op: &'static str,
        device: String,
        why: &'static str,
    },
    /// An allocation would take more memory than the device has available.
    #[error("{what}: needs {bytes} bytes, {device} has {available} available")]
    OutOfMemory {
        what: &'static str,
        bytes: usize,
        device: String,
        available: usize,
    },
    /// A paged cache has no free page left for a sequence.
    #[error("{cache}: out of pages (sequence {seq} needs {needed} more, {free} free of {total})")]
    OutOfPages {
        cache: &'static str,
        seq: u64,
        needed: usize,
        free: usize,
        total: usize,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver error during {during}: {source}")]
    Driver {
        during: String,
        #[source]
        source: cudarc::driver::DriverError,
    },
    /// A cuBLAS or cuBLASLt call failed (the status names the reason).
    #[error("cuBLAS error during {during}: {status}")]
    Blas { during: String, status: String },
    /// A collective (NCCL, or a simulated expert-parallel world) failed.
    #[error("collective error during {during}: {why}")]
    Collective { during: String, why: String },
    /// An embedded kernel image failed validation before it reached the driver.
    #[error("kernel image of family `{family}` is invalid: {why}")]
    BadKernelImage { family: String, why: String },
    /// A kernel name is absent from its family's module.
    #[error("kernel `{kernel}` not found in family `{family}`")]
    KernelNotFound { family: String, kernel: String },
}

/// Shorthand used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
