//! The CUDA side of the runtime: context, streams, events, device memory and
//! the per-context cache of loaded kernel families. cudarc panics when
//! `libcuda` is missing, so every entry point probes for it first with
//! `libloading` and turns its absence into an error value.

use crate::device::fatbin;
use crate::error::{Error, Result};
use crate::kernels::{Family, KernelRef};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, sys,
};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, LazyLock, Mutex};

mod arena;
pub use arena::{ArenaReport, CaptureArena};

const LIBCUDA_NAMES: &[&str] = &["libcuda.so.1", "libcuda.so", "nvcuda.dll"];

/// Whether the CUDA driver library can be loaded on this machine (cached).
pub fn cuda_driver_present() -> bool {
    static PRESENT: LazyLock<bool> = LazyLock::new(|| {
        LIBCUDA_NAMES.iter().any(|name| {
            // SAFETY: loading libcuda runs only its ELF initialisers, which have
            // no preconditions; the handle is dropped (unloaded) at once.
            unsafe { libloading::Library::new(name) }.is_ok()
        })
    });
    *PRESENT
}

fn driver(during: impl Into<String>) -> impl FnOnce(cudarc::driver::DriverError) -> Error {
    let during = during.into();
    move |source| Error::Driver { during, source }
}

/// One CUDA device: its primary context, the stream ops are issued on, and
/// the loaded kernel modules. Cloning is cheap and shares all three.
///
/// Invariant: every buffer of a handle is used on that handle's stream
/// only. Ops, row copies, cuBLAS plans and the NCCL transport refuse
/// operands of another stream ([`CudaDevice::same_stream`]), downloads
/// synchronise the stream, and a buffer is freed (`cuMemFreeAsync`) on the
/// stream it was used on. Stream order alone therefore orders every use, so
/// cudarc's cross-stream event tracking (two events per allocation, an
/// event wait and record per pointer of every launch) is off: launches cost
/// the driver call only, and a capture needs no tracking paused.
#[derive(Clone)]
pub struct CudaDevice {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    modules: Arc<Mutex<HashMap<&'static str, Arc<CudaModule>>>>,
    /// Functions looked up once per (family, kernel), so a launch makes no
    /// `cuModuleGetFunction` call.
    functions: Arc<Mutex<HashMap<(&'static str, &'static str), CudaFunction>>>,
    /// The dynamic shared memory each of those functions is allowed, so the
    /// attribute is set once per function and size, not before every launch.
    smem_allowed: Arc<Mutex<HashMap<(&'static str, &'static str), u32>>>,
    /// Small read-only tables uploaded once, by content
    /// ([`CudaDevice::constant`]) and by name ([`CudaDevice::constant_named`]).
    constants: Arc<Mutex<HashMap<Vec<u8>, Arc<CudaBuffer>>>>,
    named_constants: Arc<Mutex<HashMap<&'static str, Arc<CudaBuffer>>>>,
    sms: usize,
    /// Whether the device allocates from a memory pool (`cuMemAllocAsync`).
    pools: bool,
    poison: bool,
    batch_invariant: bool,
    /// The device has programmatic dependent launch (compute capability
    /// 9.0 and later).
    pdl_capable: bool,
    /// Kernels that open with `DI_PDL_ENTRY()` launch as programmatic
    /// dependents (where capable; on by default).
    pdl: bool,
    /// The arena this device's allocations on its stream are carved from
    /// while a capture runs ([`CudaDevice::with_arena`]); shared by the
    /// handle's clones.
    arena: Arc<Mutex<Option<arena::ActiveArena>>>,
    /// Live and peak bytes of the device's own buffers
    /// ([`CudaDevice::track_peak`]).
    usage: Arc<arena::Usage>,
}

impl fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaDevice({})", self.ordinal)
    }
}

impl fmt::Display for CudaDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cuda:{}", self.ordinal)
    }
}

impl CudaDevice {
    /// Opens device `ordinal`. Errors (never panics) when libcuda is absent,
    /// the driver fails to initialise, or the ordinal is out of range.
    pub fn new(ordinal: usize) -> Result<CudaDevice> {
        let name = format!("cuda:{ordinal}");
        let count = CudaDevice::count().map_err(|e| match e {
            Error::DeviceUnavailable { why, .. } => Error::DeviceUnavailable {
                device: name.clone(),
                why,
            },
            e => e,
        })?;
        if ordinal >= count {
            return Err(Error::DeviceUnavailable {
                device: name,
                why: format!("this machine has {count} CUDA device(s)"),
            });
        }
        let ctx = CudaContext::new(ordinal).map_err(driver("creating the CUDA context"))?;
        // SAFETY: turned off before this context's first stream or
        // allocation, so no slice of it carries events; the type's invariant
        // (one stream per buffer, refused mixing) orders every use and free.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(driver("creating a stream"))?;
        let pools = retain_freed_memory(&ctx)?;
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver("reading the SM count"))?;
        let major = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
            .map_err(driver("reading the compute capability"))?;
        Ok(CudaDevice {
            ordinal,
            ctx,
            stream,
            modules: Arc::default(),
            functions: Arc::default(),
            smem_allowed: Arc::default(),
            constants: Arc::default(),
            named_constants: Arc::default(),
            sms: sms.max(1) as usize,
            pools,
            poison: false,
            batch_invariant: false,
            pdl_capable: major >= 9,
            pdl: major >= 9,
            arena: Arc::default(),
            usage: Arc::default(),
        })
    }

    /// CUDA devices on this machine (a typed error without a driver).
    pub fn count() -> Result<usize> {
        if !cuda_driver_present() {
            return Err(Error::DeviceUnavailable {
                device: "cuda".into(),
                why: "the CUDA driver library (libcuda.so.1) is not installed on this machine"
                    .into(),
            });
        }
        let count = CudaContext::device_count().map_err(driver("cuDeviceGetCount"))?;
        Ok(usize::try_from(count).unwrap_or(0))
    }

    /// Free device memory in bytes (`cuMemGetInfo`).
    pub fn free_memory(&self) -> Result<usize> {
        Ok(self.memory_info()?.0)
    }

    /// (free, total) device memory in bytes (`cuMemGetInfo`): what the
    /// state pool is sized from (`model::pool::PoolMemory`). The memory
    /// pool's idle bytes ([`retain_freed_memory`] keeps freed memory there)
    /// count as free: an allocation reuses them. No sync, no trim.
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        self.ctx
            .bind_to_thread()
            .map_err(driver("binding the CUDA context"))?;
        let (free, total) =
            cudarc::driver::result::mem_get_info().map_err(driver("cuMemGetInfo"))?;
        let idle = match self.memory_pool_bytes()? {
            Some((reserved, used)) => reserved.saturating_sub(used),
            None => 0,
        };
        Ok((free.saturating_add(idle).min(total), total))
    }

    /// (reserved, used) bytes of the device's memory pool
    /// (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`, `_USED_MEM_CURRENT`);
    /// `None` on a device without memory pools.
    pub fn memory_pool_bytes(&self) -> Result<Option<(usize, usize)>> {
        use cudarc::driver::result::{device, mem_pool};
        use sys::CUmemPool_attribute as A;
        if !self.pools {
            return Ok(None);
        }
        self.ctx
            .bind_to_thread()
            .map_err(driver("binding the CUDA context"))?;
        let read = |attr| -> Result<usize> {
            let mut v: u64 = 0;
            // SAFETY: the device comes from a live context that has memory
            // pools; both attributes write a cuuint64_t through the pointer,
            // which outlives the call.
            unsafe {
                let pool = device::get_mem_pool(self.ctx.cu_device())
                    .map_err(driver("cuDeviceGetMemPool"))?;
                mem_pool::get_attribute(pool, attr, (&raw mut v).cast())
                    .map_err(driver("reading the memory pool's size"))?;
            }
            Ok(usize::try_from(v).unwrap_or(usize::MAX))
        };
        Ok(Some((
            read(A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
            read(A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
        )))
    }

    /// Waits for the stream, then trims the device's memory pool to the
    /// bytes in use (`cuMemPoolTrimTo`); nothing on a device without pools.
    fn release_idle_memory(&self) -> Result<()> {
        if !self.pools {
            return Ok(());
        }
        self.synchronize()?;
        self.ctx
            .bind_to_thread()
            .map_err(driver("binding the CUDA context"))?;
        // SAFETY: the device comes from a live context with memory pools;
        // trimming releases only memory no allocation holds.
        unsafe {
            let pool = cudarc::driver::result::device::get_mem_pool(self.ctx.cu_device())
                .map_err(driver("cuDeviceGetMemPool"))?;
            cudarc::driver::result::mem_pool::trim_to(pool, 0).map_err(driver("cuMemPoolTrimTo"))
        }
    }

    /// `bytes` of uninitialised stream-ordered memory. When the device is
    /// out of memory, the pool's idle bytes go back to the driver and the
    /// allocation is tried once more (outside a capture, which may not wait).
    fn alloc_slice(&self, bytes: usize) -> Result<CudaSlice<u8>> {
        // SAFETY (both calls): the memory is uninitialised; each caller
        // writes all of it before anyone reads it (see `alloc`, `zeroed`,
        // `upload`). A zero-byte request is served without a driver call.
        match unsafe { self.stream.alloc::<u8>(bytes) } {
            Err(e)
                if e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY
                    && self.refuse_in_capture("retrying an allocation").is_ok() =>
            {
                self.release_idle_memory()?;
                unsafe { self.stream.alloc::<u8>(bytes) }
            }
            r => r,
        }
        .map_err(driver(format!("allocating {bytes} bytes")))
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The device's marketing name, e.g. "NVIDIA H200".
    pub fn name(&self) -> Result<String> {
        self.ctx.name().map_err(driver("cuDeviceGetName"))
    }

    /// Streaming multiprocessors (at least 1), read once when the device is
    /// opened; launchers size persistent grids from it.
    pub fn sm_count(&self) -> usize {
        self.sms
    }

    /// (major, minor) compute capability.
    pub fn compute_capability(&self) -> Result<(i32, i32)> {
        self.ctx
            .compute_capability()
            .map_err(driver("cuDeviceGetAttribute"))
    }

    /// The stream every op of this device handle is issued on.
    pub fn stream(&self) -> Stream {
        Stream(self.stream.clone())
    }

    /// Whether buffers of `self` and `other` may meet in one op: the same
    /// stream (so the same GPU). Clones, including
    /// [`CudaDevice::with_poisoned_allocations`] and
    /// [`CudaDevice::with_batch_invariant_kernels`], share their stream; two
    /// [`CudaDevice::new`] handles, or one from
    /// [`CudaDevice::with_new_stream`], do not.
    pub fn same_stream(&self, other: &CudaDevice) -> bool {
        self.ordinal == other.ordinal && Arc::ptr_eq(&self.stream, &other.stream)
    }

    /// A handle to the same device whose ops go to a fresh stream. Its
    /// tensors meet this handle's only through [`crate::Tensor::to_device`].
    pub fn with_new_stream(&self) -> Result<CudaDevice> {
        let stream = self.ctx.new_stream().map_err(driver("creating a stream"))?;
        Ok(CudaDevice {
            stream,
            ..self.clone()
        })
    }

    /// Blocks until all work on this handle's stream is done.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(driver("cuStreamSynchronize"))
    }

    /// A handle to the same device whose allocations are filled with 0xFF
    /// bytes (NaN in f32, BF16 and e4m3), so tests can prove that a kernel
    /// wrote every element of its outputs.
    pub fn with_poisoned_allocations(&self) -> CudaDevice {
        CudaDevice {
            poison: true,
            ..self.clone()
        }
    }

    /// A handle to the same device whose ops pick only batch-invariant
    /// kernels (`DEEPINFER_BATCH_INVARIANT=1`, ARCHITECTURE.md "Batch
    /// invariance"): no kernel, tile or reduction order is chosen from the
    /// row count. Tensors allocated through it carry the choice to every op
    /// they reach.
    pub fn with_batch_invariant_kernels(&self) -> CudaDevice {
        CudaDevice {
            batch_invariant: true,
            ..self.clone()
        }
    }

    /// Whether ops on this handle pick only batch-invariant kernels.
    pub fn batch_invariant(&self) -> bool {
        self.batch_invariant
    }

    /// A handle to the same device whose launches use programmatic
    /// dependent launch (`enabled`, where the device has it: compute
    /// capability 9.0 and later) or never (`!enabled`): a kernel that opens
    /// with `DI_PDL_ENTRY()` (`kernels-cuda/include/deepinfer/pdl.cuh`) may
    /// then be scheduled while the kernel before it on the stream still
    /// runs, and waits at its entry for that kernel's completion, so
    /// results are the same either way; only launch latency changes. On by
    /// default. Tensors allocated through the handle carry the choice.
    pub fn with_pdl(&self, enabled: bool) -> CudaDevice {
        CudaDevice {
            pdl: enabled && self.pdl_capable,
            ..self.clone()
        }
    }

    /// Whether this handle launches PDL kernels as programmatic dependents.
    pub fn pdl(&self) -> bool {
        self.pdl
    }

    /// Allocates `bytes` of device memory, uninitialised unless this handle
    /// poisons allocations.
    pub fn alloc(&self, bytes: usize) -> Result<CudaBuffer> {
        if self.poison {
            // SAFETY: `ptr` addresses the `bytes` just allocated, alive
            // across the call; the memset is ordered on this handle's
            // stream (no host buffer: capturable).
            return self.filled("poisoning", bytes, 1, |ptr, stream| unsafe {
                sys::cuMemsetD8Async(ptr, 0xFF, bytes, stream)
            });
        }
        // Every op that allocates an output writes all of it before anyone
        // reads it; tests poison outputs to prove it.
        self.new_buffer(bytes)
    }

    /// `bytes` of uninitialised memory: carved from the active arena when
    /// this handle's stream has one with room, else from the stream-ordered
    /// pool.
    fn new_buffer(&self, bytes: usize) -> Result<CudaBuffer> {
        let len = arena::rounded(bytes);
        if let Some((slice, carved)) = self.carve(bytes, len) {
            return Ok(CudaBuffer {
                device: self.clone(),
                slice: std::mem::ManuallyDrop::new(slice),
                carved: Some(carved),
            });
        }
        Ok(self.owned(self.alloc_slice(bytes)?))
    }

    /// A buffer owning `slice` (a pool allocation of this handle's stream),
    /// counted live until its drop subtracts it again.
    fn owned(&self, slice: CudaSlice<u8>) -> CudaBuffer {
        self.usage.add(arena::rounded(slice.len()));
        CudaBuffer {
            device: self.clone(),
            slice: std::mem::ManuallyDrop::new(slice),
            carved: None,
        }
    }

    /// A read-only device copy of `bytes` (a small table such as a RoPE
    /// frequency table), uploaded the first time these bytes are asked for
    /// and shared by every later request on this device (the handle's
    /// clones included) until the handle goes: a launch inside a CUDA graph
    /// capture can read a table an earlier launch uploaded, while an upload
    /// there is refused.
    pub fn constant(&self, bytes: &[u8]) -> Result<Arc<CudaBuffer>> {
        self.cached(&self.constants, bytes, || bytes.to_vec(), || bytes.to_vec())
    }

    /// Like [`CudaDevice::constant`] for a table known by `name` (one fixed
    /// content per name, such as `numerics::sigmoid_bf16_table`): `make`
    /// runs only on this device's first request, and a later request costs
    /// a lookup by name instead of a hash of the table's bytes.
    pub fn constant_named(
        &self,
        name: &'static str,
        make: impl FnOnce() -> Vec<u8>,
    ) -> Result<Arc<CudaBuffer>> {
        self.cached(&self.named_constants, &name, || name, make)
    }

    /// The upload cached in `map` under `key`, made (`owned`, `make`) and
    /// inserted on the first request.
    fn cached<K, Q>(
        &self,
        map: &Mutex<HashMap<K, Arc<CudaBuffer>>>,
        key: &Q,
        owned: impl FnOnce() -> K,
        make: impl FnOnce() -> Vec<u8>,
    ) -> Result<Arc<CudaBuffer>>
    where
        K: std::borrow::Borrow<Q> + std::hash::Hash + Eq,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        let mut cache = map
            .lock()
            // A poisoned cache still holds only whole uploads.
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(b) = cache.get(key) {
            return Ok(b.clone());
        }
        let b = Arc::new(self.upload(&make())?);
        cache.insert(owned(), b.clone());
        Ok(b)
    }

    /// `bytes` of device memory set to zero by a memset on the stream: no
    /// host buffer, so it may run inside a CUDA graph capture.
    pub fn zeroed(&self, bytes: usize) -> Result<CudaBuffer> {
        // SAFETY: `ptr` addresses the `bytes` just allocated, alive across
        // the call; the memset is ordered on this handle's stream.
        self.filled("zeroing", bytes, 1, |ptr, stream| unsafe {
            sys::cuMemsetD8Async(ptr, 0, bytes, stream)
        })
    }

    /// `words` 32-bit words of device memory each set to `pattern` by a
    /// memset on the stream (`cuMemsetD32Async`): no host buffer, so it may
    /// run inside a CUDA graph capture.
    pub fn filled_u32(&self, words: usize, pattern: u32) -> Result<CudaBuffer> {
        // SAFETY: `ptr` addresses the `words` 4-byte words just allocated
        // (cuMemAllocAsync aligns to 256 bytes), alive across the call; the
        // memset is ordered on this handle's stream.
        self.filled("filling 32-bit words", words, 4, |ptr, stream| unsafe {
            sys::cuMemsetD32Async(ptr, pattern, words, stream)
        })
    }

    /// `words` 64-bit words of device memory each set to `pattern`: two
    /// strided 32-bit memsets (`cuMemsetD2D32Async`, pitch 8 bytes), the low
    /// halves then the high halves. No host buffer, so capturable.
    pub fn filled_u64(&self, words: usize, pattern: u64) -> Result<CudaBuffer> {
        let halves = [
            (0u64, crate::numerics::low_u32(pattern)),
            (4, crate::numerics::low_u32(pattern >> 32)),
        ];
        self.filled("filling 64-bit words", words, 8, |ptr, stream| {
            for (offset, half) in halves {
                // SAFETY: rows of one 4-byte word at pitch 8 from byte
                // `offset` < 8 cover `words` words inside the allocation
                // (alive across the call); ordered on this stream.
                let r = unsafe { sys::cuMemsetD2D32Async(ptr + offset, 8, half, 1, words, stream) };
                if r != sys::CUresult::CUDA_SUCCESS {
                    return r;
                }
            }
            sys::CUresult::CUDA_SUCCESS
        })
    }

    /// `words` words of `word_bytes` each, allocated on the stream and
    /// written whole by `set` (a memset on the stream, given the address and
    /// the stream), in stream order before any use.
    fn filled(
        &self,
        what: &'static str,
        words: usize,
        word_bytes: usize,
        set: impl FnOnce(sys::CUdeviceptr, sys::CUstream) -> sys::CUresult,
    ) -> Result<CudaBuffer> {
        let bytes = words.checked_mul(word_bytes).ok_or(Error::Argument {
            op: "CudaDevice::filled",
            arg: "words",
            value: format!("{words} of {word_bytes} bytes"),
            why: "more bytes than the address space holds",
        })?;
        let mut buffer = self.new_buffer(bytes)?;
        if words > 0 {
            let (ptr, _guard) = buffer.slice.device_ptr_mut(&self.stream);
            set(ptr, self.stream.cu_stream())
                .result()
                .map_err(driver(format!("{what}: {bytes} bytes")))?;
        }
        Ok(buffer)
    }

    /// Refuses work that must happen now while this stream is being
    /// captured: a captured host copy would not run now (a read-back would
    /// return stale bytes) and its replay would touch a host buffer long
    /// gone; a captured allocation would belong to the graph.
    pub(crate) fn refuse_in_capture(&self, what: &'static str) -> Result<()> {
        let status = self
            .stream
            .capture_status()
            .map_err(driver("cuStreamIsCapturing"))?;
        if status == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return Ok(());
        }
        Err(Error::Unsupported {
            op: what,
            device: self.to_string(),
            why: "a host copy or a lasting allocation inside a CUDA graph capture",
        })
    }

    /// Copies host bytes into new device memory (not inside a capture).
    pub fn upload(&self, bytes: &[u8]) -> Result<CudaBuffer> {
        self.refuse_in_capture("copying host bytes to the device")?;
        // The copy below writes every byte, in stream order.
        let mut buffer = self.new_buffer(bytes.len())?;
        self.stream
            .memcpy_htod(bytes, &mut *buffer.slice)
            .map_err(driver(format!(
                "copying {} bytes to the device",
                bytes.len()
            )))?;
        Ok(buffer)
    }

    /// A loaded kernel function. The family's image is validated and loaded on
    /// first use and cached per device, and so is the function's handle.
    pub fn function(&self, kernel: KernelRef) -> Result<CudaFunction> {
        let key = (kernel.family.name, kernel.name);
        let mut functions = self
            .functions
            .lock()
            // A poisoned cache still holds only functions that were found.
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(f) = functions.get(&key) {
            return Ok(f.clone());
        }
        // Names outside the registry never reach the driver (whose lookup error
        // would also show up in compute-sanitizer logs).
        kernel.family.kernel(kernel.name)?;
        let module = self.module(kernel.family)?;
        let f = module
            .load_function(kernel.name)
            .map_err(|_| Error::KernelNotFound {
                family: kernel.family.name.into(),
                kernel: kernel.name.into(),
            })?;
        functions.insert(key, f.clone());
        Ok(f)
    }

    /// Allows `kernel` `bytes` of dynamic shared memory per CTA
    /// (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`): one driver call
    /// the first time a function needs a size above what it was allowed.
    pub fn allow_dynamic_smem(&self, kernel: KernelRef, bytes: u32) -> Result<()> {
        let key = (kernel.family.name, kernel.name);
        let mut allowed = self
            .smem_allowed
            .lock()
            // A poisoned cache still holds only sizes the driver accepted.
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if allowed.get(&key).is_some_and(|&b| b >= bytes) {
            return Ok(());
        }
        self.function(kernel)?
            .set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                i32::try_from(bytes).unwrap_or(i32::MAX),
            )
            .map_err(|source| Error::Driver {
                during: format!(
                    "allowing {bytes} bytes of shared memory for {}::{}",
                    kernel.family.name, kernel.name
                ),
                source,
            })?;
        allowed.insert(key, bytes);
        Ok(())
    }

    /// Loads (once) the module of `family`, after checking its image.
    pub fn module(&self, family: &'static Family) -> Result<Arc<CudaModule>> {
        let mut modules = self
            .modules
            .lock()
            // A poisoned cache still holds only fully loaded modules.
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(m) = modules.get(family.name) {
            return Ok(m.clone());
        }
        let sum = fatbin::checksum(family.image);
        if sum != family.checksum {
            return Err(Error::BadKernelImage {
                family: family.name.into(),
                why: format!(
                    "checksum {sum:#018x} differs from the build's {:#018x}: the embedded image is corrupt",
                    family.checksum
                ),
            });
        }
        let module = self.load_image(family.name, family.image)?;
        modules.insert(family.name, module.clone());
        Ok(module)
    }

    /// Validates an image with [`fatbin::validate`] (framing and every cubin's
    /// ELF header and section table) and hands it to the driver. Corruption
    /// deeper inside a cubin is caught only for registry images, by their
    /// checksum in [`CudaDevice::module`].
    pub fn load_image(&self, family: &str, image: &[u8]) -> Result<Arc<CudaModule>> {
        fatbin::validate(image).map_err(|why| Error::BadKernelImage {
            family: family.into(),
            why,
        })?;
        self.ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(image.to_vec()))
            .map_err(|e| Error::BadKernelImage {
                family: family.into(),
                why: format!("the driver refused it: {e}"),
            })
    }

    #[cfg_attr(not(deepinfer_cuda), allow(dead_code))]
    pub(crate) fn raw_stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Records the work `f` issues on this handle's stream into a CUDA graph
    /// instead of running it (`cuStreamBeginCapture`, thread-local mode), and
    /// returns the graph to replay with [`Graph::launch`]. Waits for the
    /// stream first. Work that cannot be captured (a synchronisation, a copy
    /// to pageable host memory) fails the capture with a typed error, so a
    /// capture that succeeds proves `f` issued device work only.
    ///
    /// # Safety
    /// No other thread may issue work on this stream while `f` runs (it
    /// would join the capture). A replay reads and writes the addresses
    /// captured, so every tensor `f` touched must outlive the graph's
    /// launches.
    pub unsafe fn capture(&self, f: impl FnOnce() -> Result<()>) -> Result<Graph> {
        self.synchronize()?;
        let ran = self
            .stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(driver("cuStreamBeginCapture"))
            .and_then(|()| {
                let ran = f();
                // Ends the capture even when f failed, so the stream is usable.
                let graph = self
                    .stream
                    .end_capture(sys::CUgraphInstantiate_flags(0))
                    .map_err(driver("cuStreamEndCapture"));
                ran.and(graph)
            });
        match ran? {
            Some(graph) => Ok(Graph(graph)),
            None => Err(Error::Unsupported {
                op: "CudaDevice::capture",
                device: self.to_string(),
                why: "the capture recorded no work",
            }),
        }
    }

    /// Runs `f` as the profiled range (`cuProfilerStart` .. `cuProfilerStop`),
    /// waiting for the stream before and after: under `ncu
    /// --profile-from-start off` only the kernels `f` launches are
    /// profiled. Without a profiler attached the two calls do nothing.
    pub fn profiled<T>(&self, f: impl FnOnce() -> T) -> Result<T> {
        self.synchronize()?;
        self.ctx
            .bind_to_thread()
            .map_err(driver("binding the CUDA context"))?;
        // SAFETY: no arguments; the context is current on this thread.
        unsafe { sys::cuProfilerStart() }
            .result()
            .map_err(driver("cuProfilerStart"))?;
        let out = f();
        let synced = self.synchronize();
        // SAFETY: as above.
        unsafe { sys::cuProfilerStop() }
            .result()
            .map_err(driver("cuProfilerStop"))?;
        synced.map(|()| out)
    }

    /// Creates a timing event.
    pub fn event(&self) -> Result<Event> {
        let ev = self
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(driver("cuEventCreate"))?;
        Ok(Event(ev))
    }
}

/// Keeps memory freed by `cuMemFreeAsync` in the device's memory pool (a
/// release threshold of all of it) instead of handing it back to the driver
/// at every synchronisation, as the default threshold of 0 does: a step's
/// temporaries are then served from the pool in the next step, not mapped
/// anew. [`CudaDevice::memory_info`] counts the pool's idle bytes as free,
/// and an allocation that finds the device full trims the pool and tries
/// again. A device without memory pools (cudarc then allocates
/// synchronously) is left as it is. Returns whether the device has pools.
fn retain_freed_memory(ctx: &CudaContext) -> Result<bool> {
    use cudarc::driver::result::{device, mem_pool};
    // SAFETY: the device comes from a live context; the attribute reads a
    // cuuint64_t through the pointer, which outlives the call.
    unsafe {
        let pools = device::get_attribute(
            ctx.cu_device(),
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
        )
        .map_err(driver("reading the memory-pool support"))?;
        if pools == 0 {
            return Ok(false);
        }
        let pool = device::get_mem_pool(ctx.cu_device()).map_err(driver("cuDeviceGetMemPool"))?;
        let mut keep: u64 = u64::MAX;
        mem_pool::set_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&raw mut keep).cast(),
        )
        .map_err(driver("setting the memory pool's release threshold"))?;
    }
    Ok(true)
}

/// A captured CUDA graph ([`CudaDevice::capture`]), replayed on the stream
/// it was captured from.
pub struct Graph(cudarc::driver::CudaGraph);

impl fmt::Debug for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Graph")
    }
}

/// What a captured graph holds: its nodes by type,
/// its kernel-to-kernel edges, and how many of its
/// edges are programmatic (a PDL launch captured: the dependent may start
/// before the kernel it follows completes). Kernel edges that are not
/// programmatic are where a replay still pays a full launch gap.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphNodes {
    pub kernels: usize,
    /// Memset and copy nodes (zero-fills, device slots, row copies).
    pub memsets: usize,
    pub copies: usize,
    /// Allocation and free nodes: buffers a captured step allocates from
    /// the stream-ordered pool.
    pub allocs: usize,
    pub frees: usize,
    /// Nodes of any other type (event records and waits, host nodes).
    pub other: usize,
    pub kernel_edges: usize,
    pub programmatic_edges: usize,
}

impl Graph {
    /// Replays the captured work (asynchronously, on the captured stream).
    pub fn launch(&self) -> Result<()> {
        self.0.launch().map_err(driver("cuGraphLaunch"))
    }

    /// Counts the graph's nodes by type (host-side, no device work).
    pub fn nodes(&self) -> Result<GraphNodes> {
        let graph = self.0.cu_graph();
        let mut n: usize = 0;
        // SAFETY: `graph` is this live graph; a null node array asks only
        // for the count, written through `n`.
        unsafe { sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &raw mut n) }
            .result()
            .map_err(driver("cuGraphGetNodes"))?;
        let mut nodes: Vec<sys::CUgraphNode> = vec![std::ptr::null_mut(); n];
        // SAFETY: `nodes` holds `n` slots, the count passed in.
        unsafe { sys::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &raw mut n) }
            .result()
            .map_err(driver("cuGraphGetNodes"))?;
        let mut out = GraphNodes::default();
        let mut kernels = std::collections::HashSet::new();
        for &node in nodes.iter().take(n) {
            // Read as the enum's u32 representation: a node type these
            // bindings do not know stays a number (counted as other).
            let mut kind: u32 = u32::MAX;
            // SAFETY: `node` is one of this graph's nodes, listed above; the
            // driver writes one CUgraphNodeType, a repr(u32) enum, through
            // the pointer to `kind`.
            unsafe { sys::cuGraphNodeGetType(node, (&raw mut kind).cast()) }
                .result()
                .map_err(driver("cuGraphNodeGetType"))?;
            use sys::CUgraphNodeType as T;
            match kind {
                k if k == T::CU_GRAPH_NODE_TYPE_KERNEL as u32 => {
                    out.kernels += 1;
                    kernels.insert(node);
                }
                k if k == T::CU_GRAPH_NODE_TYPE_MEMSET as u32 => out.memsets += 1,
                k if k == T::CU_GRAPH_NODE_TYPE_MEMCPY as u32 => out.copies += 1,
                k if k == T::CU_GRAPH_NODE_TYPE_MEM_ALLOC as u32 => out.allocs += 1,
                k if k == T::CU_GRAPH_NODE_TYPE_MEM_FREE as u32 => out.frees += 1,
                _ => out.other += 1,
            }
        }
        let mut e: usize = 0;
        // SAFETY: null arrays ask only for the edge count, written via `e`.
        unsafe {
            sys::cuGraphGetEdges_v2(
                graph,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &raw mut e,
            )
        }
        .result()
        .map_err(driver("cuGraphGetEdges_v2"))?;
        let mut from: Vec<sys::CUgraphNode> = vec![std::ptr::null_mut(); e];
        let mut to: Vec<sys::CUgraphNode> = vec![std::ptr::null_mut(); e];
        let blank = sys::CUgraphEdgeData {
            from_port: 0,
            to_port: 0,
            type_: 0,
            reserved: [0; 5],
        };
        let mut data = vec![blank; e];
        // SAFETY: the three arrays hold `e` slots each, the count passed in.
        unsafe {
            sys::cuGraphGetEdges_v2(
                graph,
                from.as_mut_ptr(),
                to.as_mut_ptr(),
                data.as_mut_ptr(),
                &raw mut e,
            )
        }
        .result()
        .map_err(driver("cuGraphGetEdges_v2"))?;
        let programmatic = sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8;
        out.programmatic_edges = data
            .iter()
            .take(e)
            .filter(|d| d.type_ == programmatic)
            .count();
        out.kernel_edges = from
            .iter()
            .zip(&to)
            .take(e)
            .filter(|(f, t)| kernels.contains(*f) && kernels.contains(*t))
            .count();
        Ok(out)
    }
}

/// A CUDA stream handle.
#[derive(Clone, Debug)]
pub struct Stream(Arc<CudaStream>);

impl Stream {
    pub fn synchronize(&self) -> Result<()> {
        self.0.synchronize().map_err(driver("cuStreamSynchronize"))
    }
}

/// A CUDA event with timing enabled.
pub struct Event(cudarc::driver::CudaEvent);

impl Event {
    /// Records the stream's current work.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        self.0.record(&stream.0).map_err(driver("cuEventRecord"))
    }

    /// Milliseconds from `self` to `end` (waits for both).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        self.0
            .elapsed_ms(&end.0)
            .map_err(driver("cuEventElapsedTime"))
    }
}

/// Device memory owned by a tensor, with the device it lives on: its own
/// allocation (freed on drop, in stream order), or bytes carved from a
/// [`CaptureArena`] (which it keeps alive; nothing is freed on drop).
pub struct CudaBuffer {
    device: CudaDevice,
    slice: std::mem::ManuallyDrop<CudaSlice<u8>>,
    /// Where the bytes lie when carved from a [`CaptureArena`].
    carved: Option<arena::Carved>,
}

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        // SAFETY: `slice` is taken or dropped exactly once, here.
        let slice = unsafe { std::mem::ManuallyDrop::take(&mut self.slice) };
        match &self.carved {
            Some(c) => {
                // Carved bytes belong to the arena's block: forget the
                // view, give the range back.
                let _ = slice.leak();
                self.device.give_back(c);
            }
            None => {
                self.device.usage.sub(arena::rounded(slice.len()));
                drop(slice);
            }
        }
    }
}

impl fmt::Debug for CudaBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CudaBuffer({} bytes on {})",
            self.slice.len(),
            self.device
        )
    }
}

impl Clone for CudaBuffer {
    /// A device copy into new memory, in stream order: carved when an arena
    /// is active on the stream (a captured step clones tensors, and a pool
    /// allocation there would be a graph node). Should that allocation or
    /// copy fail, cudarc's own slice clone is the fallback (which panics on
    /// failure, as every clone did before arenas: `Tensor`'s derived
    /// `Clone` has no error path).
    fn clone(&self) -> CudaBuffer {
        let copied = self.device.new_buffer(self.len()).and_then(|mut b| {
            b.copy_from(self)?;
            Ok(b)
        });
        copied.unwrap_or_else(|_| self.device.owned((*self.slice).clone()))
    }
}

impl CudaBuffer {
    pub fn device(&self) -> &CudaDevice {
        &self.device
    }

    /// Refuses a copy from a buffer of another stream (see [`CudaDevice`]).
    fn expect_same_stream(&self, op: &'static str, src: &CudaBuffer) -> Result<()> {
        if self.device.same_stream(&src.device) {
            return Ok(());
        }
        let (got, expected) = crate::device::Device::mismatch_names(
            &crate::device::Device::Cuda(src.device.clone()),
            &crate::device::Device::Cuda(self.device.clone()),
        );
        Err(Error::DeviceMismatch {
            op,
            tensor: "src",
            got,
            expected,
        })
    }

    pub fn len(&self) -> usize {
        self.slice.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slice.len() == 0
    }

    /// Copies `src` (of this buffer's stream) into the start of this buffer.
    pub fn copy_from(&mut self, src: &CudaBuffer) -> Result<()> {
        self.expect_same_stream("CudaBuffer::copy_from", src)?;
        if src.len() > self.len() {
            return Err(Error::Argument {
                op: "CudaBuffer::copy_from",
                arg: "src",
                value: format!("{} bytes", src.len()),
                why: "longer than the destination",
            });
        }
        let stream = self.device.stream.clone();
        stream
            .memcpy_dtod(&*src.slice, &mut *self.slice)
            .map_err(driver("cuMemcpyDtoDAsync"))
    }

    /// Copies `len` bytes of `src` (of this buffer's stream) from byte `s0`
    /// to byte `d0` of this buffer.
    pub fn copy_range_from(
        &mut self,
        d0: usize,
        src: &CudaBuffer,
        s0: usize,
        len: usize,
    ) -> Result<()> {
        self.expect_same_stream("CudaBuffer::copy_range_from", src)?;
        if d0.checked_add(len).is_none_or(|e| e > self.len())
            || s0.checked_add(len).is_none_or(|e| e > src.len())
        {
            return Err(Error::Argument {
                op: "CudaBuffer::copy_range_from",
                arg: "len",
                value: format!("{len} bytes at {s0} -> {d0}"),
                why: "the range lies outside a buffer",
            });
        }
        let stream = self.device.stream.clone();
        let view = src.slice.slice(s0..s0 + len);
        let mut dst = self.slice.slice_mut(d0..d0 + len);
        stream
            .memcpy_dtod(&view, &mut dst)
            .map_err(driver("cuMemcpyDtoDAsync"))
    }

    /// Overwrites the whole buffer with host bytes, in stream order, keeping
    /// its device address (what a captured CUDA graph reads at replay; not
    /// inside a capture).
    pub fn write_all(&mut self, bytes: &[u8]) -> Result<()> {
        if bytes.len() != self.len() {
            return Err(Error::Argument {
                op: "CudaBuffer::write_all",
                arg: "bytes",
                value: bytes.len().to_string(),
                why: "not the buffer's length",
            });
        }
        self.write_range(0, bytes)
    }

    /// Overwrites bytes `d0 .. d0 + bytes.len()` of the buffer with host
    /// bytes, in stream order, keeping its device address (not inside a
    /// capture).
    pub fn write_range(&mut self, d0: usize, bytes: &[u8]) -> Result<()> {
        self.device
            .refuse_in_capture("copying host bytes to the device")?;
        let end = d0
            .checked_add(bytes.len())
            .filter(|&e| e <= self.len())
            .ok_or_else(|| Error::Argument {
                op: "CudaBuffer::write_range",
                arg: "bytes",
                value: format!("{} bytes at {d0}", bytes.len()),
                why: "the range runs past the buffer",
            })?;
        if bytes.is_empty() {
            return Ok(());
        }
        let stream = self.device.stream.clone();
        let mut dst = self.slice.slice_mut(d0..end);
        stream.memcpy_htod(bytes, &mut dst).map_err(driver(format!(
            "copying {} bytes to the device",
            bytes.len()
        )))
    }

    /// Copies the whole buffer back to the host (synchronises the stream;
    /// not inside a capture).
    pub fn download(&self) -> Result<Vec<u8>> {
        self.device
            .refuse_in_capture("copying a device buffer to the host")?;
        let n = self.slice.len();
        // The host buffer is reserved fallibly before the copy: a buffer the
        // host cannot hold is a typed error, not an abort.
        let mut out = super::host_alloc("copying a device buffer to the host", n, || {
            let mut v = Vec::new();
            v.try_reserve_exact(n).ok()?;
            v.resize(n, 0u8);
            Some(v)
        })?;
        // Into pageable host memory the copy returns once it is complete.
        self.device
            .stream
            .memcpy_dtoh(&*self.slice, &mut out)
            .map_err(driver(format!("copying {n} bytes to the host")))?;
        Ok(out)
    }

    /// The buffer's device address (what a kernel launch or a captured
    /// graph reads).
    pub fn address(&self) -> u64 {
        use cudarc::driver::DevicePtr;
        let (p, _guard) = self.slice.device_ptr(&self.device.stream);
        p
    }

    #[cfg_attr(not(deepinfer_cuda), allow(dead_code))]
    pub(crate) fn slice(&self) -> &CudaSlice<u8> {
        &self.slice
    }

    #[cfg_attr(not(deepinfer_cuda), allow(dead_code))]
    pub(crate) fn slice_mut(&mut self) -> &mut CudaSlice<u8> {
        &mut self.slice
    }
}
