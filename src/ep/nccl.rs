//! The NCCL transport: an all-to-all-v over CUDA tensors with NCCL's
//! grouped send/recv (cudarc's bindings, loaded at run time). Each call
//! first exchanges a fixed-size header per peer (dtype and shape), then the
//! payload bytes, both on the device's op stream, so the collectives order
//! with the kernels around them. Reading the headers waits for the device
//! (as DeepEP's normal mode waits for its counts), so this path is not
//! CUDA-graph capturable.
//!
//! Invariant: no NCCL call is made before the library was found (cudarc
//! panics when it is absent) and every device of the group exists; a world
//! that cannot form is a typed error before any rank blocks in
//! `ncclCommInitRank`.

use super::Transport;
use crate::device::{CudaDevice, Device};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use cudarc::nccl::result as nccl;
use cudarc::nccl::safe::{Comm, Id};
use std::sync::LazyLock;

/// Header words per peer: status (0, or 1 from a rank that failed on its
/// own), dtype, rank, and four dimensions.
const HEADER: usize = 7;
/// Most dimensions a tensor sent through NCCL may have.
const MAX_RANK: usize = HEADER - 3;

fn collective(during: impl Into<String>, why: impl Into<String>) -> Error {
    Error::Collective {
        during: during.into(),
        why: why.into(),
    }
}

fn nccl_error(during: &'static str) -> impl Fn(nccl::NcclError) -> Error {
    move |e| collective(during, format!("{e:?}"))
}

/// Whether libnccl can be loaded under one of the names cudarc itself
/// tries (cached): cudarc panics when none loads, so a `libnccl.so.2` alone
/// (without its `libnccl.so` link) counts as absent.
fn nccl_present() -> bool {
    // SAFETY: the probe loads the library's ELF initialisers only (no
    // preconditions) and drops the handle at once.
    static PRESENT: LazyLock<bool> =
        LazyLock::new(|| unsafe { cudarc::nccl::sys::is_culib_present() });
    *PRESENT
}

fn need_nccl() -> Result<()> {
    if !crate::device::cuda_driver_present() {
        return Err(Error::DeviceUnavailable {
            device: "cuda".into(),
            why: "the CUDA driver library (libcuda.so.1) is not installed on this machine".into(),
        });
    }
    if !nccl_present() {
        return Err(Error::DeviceUnavailable {
            device: "nccl".into(),
            why: "libnccl is not on the library path under a name cudarc loads \
                  (libnccl.so, or libnccl.so.<CUDA major>)"
                .into(),
        });
    }
    Ok(())
}

/// The unique id every rank of one NCCL group starts from (rank 0 makes it
/// and sends its bytes to the others out of band).
#[derive(Clone, Copy, Debug)]
pub struct NcclId(Id);

impl NcclId {
    /// A new id (needs libnccl).
    pub fn new() -> Result<NcclId> {
        need_nccl()?;
        Id::new().map(NcclId).map_err(nccl_error("ncclGetUniqueId"))
    }

    /// The id's 128 bytes.
    pub fn to_bytes(&self) -> [u8; 128] {
        self.0.internal().map(|c| c.to_ne_bytes()[0])
    }

    /// The id of 128 bytes from [`NcclId::to_bytes`].
    pub fn from_bytes(bytes: [u8; 128]) -> NcclId {
        NcclId(Id::uninit(
            bytes.map(|b| std::ffi::c_char::from_ne_bytes([b])),
        ))
    }
}

/// One rank of an NCCL group, on one CUDA device.
pub struct NcclTransport {
    comm: Comm,
    device: CudaDevice,
}

impl NcclTransport {
    /// Joins rank `rank` of a `world`-rank group on `device` (blocks until
    /// every rank has joined, NCCL's contract).
    pub fn from_rank(device: &CudaDevice, rank: usize, world: usize, id: NcclId) -> Result<Self> {
        need_nccl()?;
        if rank >= world || world > 1 << 16 {
            return Err(Error::Argument {
                op: "ep::NcclTransport::from_rank",
                arg: "rank",
                value: format!("{rank} of {world}"),
                why: "needs rank < world <= 65536",
            });
        }
        let comm = Comm::from_rank(device.raw_stream().clone(), rank, world, id.0)
            .map_err(nccl_error("ncclCommInitRank"))?;
        Ok(NcclTransport {
            comm,
            device: device.clone(),
        })
    }

    pub fn device(&self) -> &CudaDevice {
        &self.device
    }

    /// Runs one NCCL group of sends and receives; `f` issues them.
    fn group(&self, f: impl FnOnce() -> Result<()>) -> Result<()> {
        nccl::group_start().map_err(nccl_error("ncclGroupStart"))?;
        let issued = f();
        let ended = nccl::group_end().map_err(nccl_error("ncclGroupEnd"));
        issued.and(ended.map(|_| ()))
    }

    fn peer(p: usize) -> i32 {
        // world ≤ 65536 (from_rank), so every peer fits.
        i32::try_from(p).unwrap_or(i32::MAX)
    }
}

fn header(t: &Tensor) -> Result<[u64; HEADER]> {
    let code = DType::ALL.iter().position(|&d| d == t.dtype()).unwrap_or(0);
    if t.shape().len() > MAX_RANK {
        return Err(Error::Shape {
            op: "ep::NcclTransport::all_to_all_v",
            tensor: "send",
            got: t.shape().to_vec(),
            expected: format!("at most {MAX_RANK} dimensions"),
        });
    }
    let mut h = [0u64; HEADER];
    h[1] = code as u64;
    h[2] = t.shape().len() as u64;
    for (slot, &d) in h[3..].iter_mut().zip(t.shape()) {
        *slot = d as u64;
    }
    Ok(h)
}

/// A peer's header: `None` when that peer failed on its own.
fn from_header(h: &[u64]) -> Result<Option<(DType, Vec<usize>)>> {
    let bad = || {
        collective(
            "all_to_all_v",
            format!("a peer sent a malformed header {h:?}"),
        )
    };
    if h[0] != 0 {
        return Ok(None);
    }
    let dtype = usize::try_from(h[1])
        .ok()
        .and_then(|c| DType::ALL.get(c).copied())
        .ok_or_else(bad)?;
    let rank = usize::try_from(h[2])
        .ok()
        .filter(|&r| r <= MAX_RANK)
        .ok_or_else(bad)?;
    let shape = h[3..3 + rank]
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| bad()))
        .collect::<Result<Vec<_>>>()?;
    Ok(Some((dtype, shape)))
}

impl NcclTransport {
    /// The header round of a collective: this rank's `headers` (one row
    /// per peer) out, every peer's in.
    fn exchange_headers(&self, headers: &[u64]) -> Result<Vec<u64>> {
        let world = self.world();
        let device = Device::Cuda(self.device.clone());
        let h_send = Tensor::from_vec(
            headers.iter().map(|&w| w as i64).collect::<Vec<i64>>(),
            &[world, HEADER],
        )?
        .to_device(&device)?;
        let mut h_recv = Tensor::empty(&device, DType::I64, &[world, HEADER])?;
        let row = HEADER * 8;
        self.group(|| {
            let src = h_send.cuda()?.slice();
            let dst = h_recv.cuda_mut()?.slice_mut();
            for p in 0..world {
                let view = src.slice(p * row..(p + 1) * row);
                self.comm
                    .send(&view, Self::peer(p))
                    .map_err(nccl_error("ncclSend"))?;
            }
            for p in 0..world {
                let mut view = dst.slice_mut(p * row..(p + 1) * row);
                self.comm
                    .recv(&mut view, Self::peer(p))
                    .map_err(nccl_error("ncclRecv"))?;
            }
            Ok(())
        })?;
        Ok(h_recv
            .to_vec::<i64>()?
            .into_iter()
            .map(|w| w as u64)
            .collect())
    }
}

impl Transport for NcclTransport {
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn world(&self) -> usize {
        self.comm.world_size()
    }

    /// Takes part in the next collective's header round with status 1, so
    /// every peer fails it (if that round fails too, there is nothing more
    /// to tell).
    fn abort(&self, _why: &str) {
        let mut h = vec![0u64; self.world() * HEADER];
        for row in h.chunks_exact_mut(HEADER) {
            row[0] = 1;
        }
        let _ = self.exchange_headers(&h);
    }

    fn all_to_all_v(&self, send: Vec<Tensor>) -> Result<Vec<Tensor>> {
        const OP: &str = "ep::NcclTransport::all_to_all_v";
        let world = self.world();
        let device = Device::Cuda(self.device.clone());
        // 1. Headers. A bad send fails this rank, and through the header
        // round (status 1) every peer, rather than leaving them waiting.
        let local = || -> Result<Vec<u64>> {
            if send.len() != world {
                return Err(Error::Argument {
                    op: OP,
                    arg: "send",
                    value: format!("{} tensors", send.len()),
                    why: "needs one tensor per rank",
                });
            }
            let mut h = Vec::with_capacity(world * HEADER);
            for t in &send {
                if !t.device().same_as(&device) {
                    let (got, expected) = Device::mismatch_names(&t.device(), &device);
                    return Err(Error::DeviceMismatch {
                        op: OP,
                        tensor: "send",
                        got,
                        expected,
                    });
                }
                h.extend(header(t)?);
            }
            Ok(h)
        };
        let h = match local() {
            Ok(h) => h,
            Err(e) => {
                self.abort(&e.to_string());
                return Err(e);
            }
        };
        let words = self.exchange_headers(&h)?;
        // 2. Payloads.
        let mut recv = Vec::with_capacity(world);
        for (p, hd) in words.chunks_exact(HEADER).enumerate() {
            let Some((dtype, shape)) = from_header(hd)? else {
                return Err(collective(
                    "all_to_all_v",
                    format!("rank {p} failed on its own"),
                ));
            };
            recv.push(Tensor::empty(&device, dtype, &shape)?);
        }
        self.group(|| {
            for (p, t) in send.iter().enumerate() {
                if t.storage_bytes() > 0 {
                    self.comm
                        .send(t.cuda()?.slice(), Self::peer(p))
                        .map_err(nccl_error("ncclSend"))?;
                }
            }
            for (p, t) in recv.iter_mut().enumerate() {
                if t.storage_bytes() > 0 {
                    self.comm
                        .recv(t.cuda_mut()?.slice_mut(), Self::peer(p))
                        .map_err(nccl_error("ncclRecv"))?;
                }
            }
            Ok(())
        })?;
        Ok(recv)
    }
}

/// Runs `f` on one NCCL rank per CUDA device of `ordinals` (distinct, each
/// present), each on its own thread, and returns the ranks' results in rank
/// order. A world this machine cannot form (no driver, no libnccl, fewer
/// devices than ranks) is a typed error before any rank starts.
pub fn nccl_world<T, F>(ordinals: &[usize], f: F) -> Result<Vec<T>>
where
    T: Send,
    F: Fn(&NcclTransport) -> Result<T> + Sync,
{
    need_nccl()?;
    let count = CudaDevice::count()?;
    let mut seen = ordinals.to_vec();
    seen.sort_unstable();
    seen.dedup();
    if ordinals.is_empty()
        || seen.len() != ordinals.len()
        || seen.last().is_some_and(|&o| o >= count)
    {
        return Err(Error::DeviceUnavailable {
            device: format!("cuda {ordinals:?}"),
            why: format!(
                "an NCCL world of {} ranks needs as many distinct devices; this machine has {count}",
                ordinals.len()
            ),
        });
    }
    let devices = ordinals
        .iter()
        .map(|&o| CudaDevice::new(o))
        .collect::<Result<Vec<_>>>()?;
    let id = NcclId::new()?;
    let world = ordinals.len();
    std::thread::scope(|s| {
        let handles: Vec<_> = devices
            .iter()
            .enumerate()
            .map(|(rank, dev)| {
                let f = &f;
                s.spawn(move || f(&NcclTransport::from_rank(dev, rank, world, id)?))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(collective("nccl_world", "a rank's thread panicked")))
            })
            .collect()
    })
}
