//! Devices: the CPU reference backend, CUDA (through cudarc, loaded at run
//! time) and, later, Ascend. Asking for a device that this machine or this
//! build cannot provide returns [`Error::DeviceUnavailable`]; nothing panics.

mod cuda;
pub mod fatbin;

pub use cuda::{
    ArenaReport, CaptureArena, CudaBuffer, CudaDevice, Event, Graph, GraphNodes, Stream,
    cuda_driver_present,
};

use crate::error::{Error, Result};
use std::fmt;
use std::str::FromStr;

/// Where a tensor lives and an op runs.
#[derive(Clone, Debug)]
pub enum Device {
    Cpu,
    Cuda(CudaDevice),
}

/// Host allocations from which the size is first compared with the host's
/// available memory (smaller ones are only reserved fallibly).
const HOST_CHECK_BYTES: usize = 1 << 30;

/// `bytes` of host memory taken by `reserve` (a fallible allocation, `None`
/// when it fails), for `what`: compared with the host's `MemAvailable`
/// first from 1 GiB, so a size the host cannot hold is a typed
/// [`Error::OutOfMemory`], never an abort.
pub(crate) fn host_alloc<T>(
    what: &'static str,
    bytes: usize,
    reserve: impl FnOnce() -> Option<T>,
) -> Result<T> {
    let oom = |available| Error::OutOfMemory {
        what,
        bytes,
        device: Device::Cpu.to_string(),
        available,
    };
    if bytes >= HOST_CHECK_BYTES
        && let Some(available) = Device::Cpu.available_memory()?
        && bytes > available
    {
        return Err(oom(available));
    }
    reserve().ok_or_else(|| oom(0))
}

impl Device {
    /// The CUDA device `ordinal`, or an error when there is no driver or GPU.
    pub fn cuda(ordinal: usize) -> Result<Device> {
        Ok(Device::Cuda(CudaDevice::new(ordinal)?))
    }

    /// Ascend NPUs: the kernels under `kernels-ascend/` build with CANN, but no
    /// runtime binding exists yet, so this always returns an error naming why.
    pub fn ascend(ordinal: usize) -> Result<Device> {
        Err(Error::DeviceUnavailable {
            device: format!("ascend:{ordinal}"),
            why: "no Ascend runtime binding in this crate yet (kernels-ascend/README.md)".into(),
        })
    }

    /// Memory an allocation on this device can still take, in bytes: the
    /// host's `MemAvailable` (Linux; `None` where it cannot be read) or the
    /// GPU's free memory.
    pub fn available_memory(&self) -> Result<Option<usize>> {
        match self {
            Device::Cpu => Ok(std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
                m.lines()
                    .find_map(|l| l.strip_prefix("MemAvailable:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
                    .map(|kb| kb.saturating_mul(1024))
            })),
            Device::Cuda(d) => d.free_memory().map(Some),
        }
    }

    /// This device with ops restricted to batch-invariant kernels
    /// ([`CudaDevice::with_batch_invariant_kernels`]); the CPU reference is
    /// invariant by construction and is returned as it is.
    pub fn with_batch_invariant_kernels(&self) -> Device {
        match self {
            Device::Cpu => Device::Cpu,
            Device::Cuda(d) => Device::Cuda(d.with_batch_invariant_kernels()),
        }
    }

    /// This device with programmatic dependent launch on or off
    /// ([`CudaDevice::with_pdl`]); the CPU is returned as it is.
    pub fn with_pdl(&self, enabled: bool) -> Device {
        match self {
            Device::Cpu => Device::Cpu,
            Device::Cuda(d) => Device::Cuda(d.with_pdl(enabled)),
        }
    }

    /// Whether kernels of this device launch as programmatic dependents
    /// (never on the CPU).
    pub fn pdl(&self) -> bool {
        match self {
            Device::Cpu => false,
            Device::Cuda(d) => d.pdl(),
        }
    }

    /// Whether every op on this device computes a row independently of the
    /// row count (always on the CPU).
    pub fn batch_invariant(&self) -> bool {
        match self {
            Device::Cpu => true,
            Device::Cuda(d) => d.batch_invariant(),
        }
    }

    /// Whether tensors of `self` and `other` may meet in one op: the CPU,
    /// or one CUDA stream (handles made by one [`CudaDevice::new`], and
    /// their clones). Two handles of one GPU have two streams, which nothing
    /// orders against each other ([`CudaDevice::same_stream`]).
    pub fn same_as(&self, other: &Device) -> bool {
        match (self, other) {
            (Device::Cpu, Device::Cpu) => true,
            (Device::Cuda(a), Device::Cuda(b)) => a.same_stream(b),
            _ => false,
        }
    }

    /// `got` and `expected` of a [`crate::Error::DeviceMismatch`] between
    /// tensors of `got` and an op on `expected`: their names, and which
    /// handle when both name one GPU.
    pub fn mismatch_names(got: &Device, expected: &Device) -> (String, String) {
        let (g, e) = (got.to_string(), expected.to_string());
        if g == e {
            (
                format!("{g} (another handle's stream: move it with to_device)"),
                e,
            )
        } else {
            (g, e)
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(d) => write!(f, "{d}"),
        }
    }
}

/// Parses `cpu`, `cuda`, `cuda:N`, `ascend:N`, opening the device.
impl FromStr for Device {
    type Err = Error;
    fn from_str(s: &str) -> Result<Device> {
        let (kind, ordinal) = match s.split_once(':') {
            Some((k, n)) => (
                k,
                n.parse::<usize>().map_err(|_| Error::Argument {
                    op: "Device::from_str",
                    arg: "device",
                    value: s.into(),
                    why: "the ordinal after ':' must be a non-negative integer",
                })?,
            ),
            None => (s, 0),
        };
        match kind {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Device::cuda(ordinal),
            "ascend" => Device::ascend(ordinal),
            _ => Err(Error::Argument {
                op: "Device::from_str",
                arg: "device",
                value: s.into(),
                why: "expected cpu, cuda[:N] or ascend[:N]",
            }),
        }
    }
}
