//! The CUDA side of the runtime: context, streams, events, device memory and
//! the per-context cache of loaded kernel families. cudarc panics when
//! `libcuda` is missing, so every entry point probes for it first with
//! `libloading` and turns its absence into an error value.

use crate::device::fatbin;
use crate::error::{Error, Result};
use crate::kernels::{Family, KernelRef};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, sys};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, LazyLock, Mutex};

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
#[derive(Clone)]
pub struct CudaDevice {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    modules: Arc<Mutex<HashMap<&'static str, Arc<CudaModule>>>>,
    sms: usize,
    poison: bool,
    batch_invariant: bool,
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
        let stream = ctx.new_stream().map_err(driver("creating a stream"))?;
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver("reading the SM count"))?;
        Ok(CudaDevice {
            ordinal,
            ctx,
            stream,
            modules: Arc::default(),
            sms: sms.max(1) as usize,
            poison: false,
            batch_invariant: false,
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
    /// state pool is sized from (`model::pool::PoolMemory`).
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        self.ctx
            .bind_to_thread()
            .map_err(driver("binding the CUDA context"))?;
        cudarc::driver::result::mem_get_info().map_err(driver("cuMemGetInfo"))
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

    /// A handle to the same device whose ops go to a fresh stream.
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

    /// Allocates `bytes` of device memory, uninitialised unless this handle
    /// poisons allocations.
    pub fn alloc(&self, bytes: usize) -> Result<CudaBuffer> {
        if self.poison {
            return self.upload(&vec![0xFF; bytes]);
        }
        // SAFETY: the memory is uninitialised; every op that allocates an output
        // writes all of it before anyone reads it, and tests poison outputs to
        // prove it. A zero-byte request is served by cudarc without a driver call.
        let slice = unsafe { self.stream.alloc::<u8>(bytes) }
            .map_err(driver(format!("allocating {bytes} bytes")))?;
        Ok(CudaBuffer {
            device: self.clone(),
            slice,
        })
    }

    /// `bytes` of device memory set to zero by a memset on the stream: no
    /// host buffer, so it may run inside a CUDA graph capture.
    pub fn zeroed(&self, bytes: usize) -> Result<CudaBuffer> {
        // SAFETY: the memset below writes every byte, in stream order before
        // any use of the buffer.
        let mut slice = unsafe { self.stream.alloc::<u8>(bytes) }
            .map_err(driver(format!("allocating {bytes} bytes")))?;
        if bytes > 0 {
            self.stream
                .memset_zeros(&mut slice)
                .map_err(driver(format!("zeroing {bytes} bytes")))?;
        }
        Ok(CudaBuffer {
            device: self.clone(),
            slice,
        })
    }

    /// Refuses a host copy while this stream is being captured: a captured
    /// copy would not run now (a read-back would return stale bytes) and its
    /// replay would touch a host buffer long gone.
    fn refuse_in_capture(&self, what: &'static str) -> Result<()> {
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
            why: "a host copy inside a CUDA graph capture",
        })
    }

    /// Copies host bytes into new device memory (not inside a capture).
    pub fn upload(&self, bytes: &[u8]) -> Result<CudaBuffer> {
        self.refuse_in_capture("copying host bytes to the device")?;
        let slice = self.stream.clone_htod(bytes).map_err(driver(format!(
            "copying {} bytes to the device",
            bytes.len()
        )))?;
        Ok(CudaBuffer {
            device: self.clone(),
            slice,
        })
    }

    /// A loaded kernel function. The family's image is validated and loaded on
    /// first use and cached per device.
    pub fn function(&self, kernel: KernelRef) -> Result<CudaFunction> {
        // Names outside the registry never reach the driver (whose lookup error
        // would also show up in compute-sanitizer logs).
        kernel.family.kernel(kernel.name)?;
        let module = self.module(kernel.family)?;
        module
            .load_function(kernel.name)
            .map_err(|_| Error::KernelNotFound {
                family: kernel.family.name.into(),
                kernel: kernel.name.into(),
            })
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
    /// capture that succeeds proves `f` issued device work only. cudarc's
    /// cross-stream event tracking is paused for this context meanwhile: the
    /// capture refuses waits on events recorded before it.
    ///
    /// # Safety
    /// While `f` runs, no other stream of this context (a handle from
    /// [`CudaDevice::with_new_stream`] or a clone of one) may issue work on
    /// tensors this stream uses: their ordering is not tracked then. A replay
    /// reads and writes the addresses captured, so every tensor `f` touched
    /// must outlive the graph's launches.
    pub unsafe fn capture(&self, f: impl FnOnce() -> Result<()>) -> Result<Graph> {
        self.synchronize()?;
        // SAFETY: the caller guarantees no other stream of this context works
        // on these tensors during the capture, and the stream is idle (above),
        // so the waits cudarc would insert order nothing.
        unsafe { self.ctx.disable_event_tracking() };
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
        // SAFETY: slices created while tracking was off (none by this
        // function) keep no events; the others resume being tracked.
        unsafe { self.ctx.enable_event_tracking() };
        match ran? {
            Some(graph) => Ok(Graph(graph)),
            None => Err(Error::Unsupported {
                op: "CudaDevice::capture",
                device: self.to_string(),
                why: "the capture recorded no work",
            }),
        }
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

/// A captured CUDA graph ([`CudaDevice::capture`]), replayed on the stream
/// it was captured from.
pub struct Graph(cudarc::driver::CudaGraph);

impl fmt::Debug for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Graph")
    }
}

impl Graph {
    /// Replays the captured work (asynchronously, on the captured stream).
    pub fn launch(&self) -> Result<()> {
        self.0.launch().map_err(driver("cuGraphLaunch"))
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

/// Device memory owned by a tensor, with the device it lives on.
#[derive(Clone)]
pub struct CudaBuffer {
    device: CudaDevice,
    slice: CudaSlice<u8>,
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

impl CudaBuffer {
    pub fn device(&self) -> &CudaDevice {
        &self.device
    }

    pub fn len(&self) -> usize {
        self.slice.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slice.len() == 0
    }

    /// Copies `src` into the start of this buffer on this buffer's stream.
    pub fn copy_from(&mut self, src: &CudaBuffer) -> Result<()> {
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
            .memcpy_dtod(&src.slice, &mut self.slice)
            .map_err(driver("cuMemcpyDtoDAsync"))
    }

    /// Copies `len` bytes of `src` from byte `s0` to byte `d0` of this buffer
    /// on this buffer's stream (callers check the ranges).
    pub fn copy_range_from(
        &mut self,
        d0: usize,
        src: &CudaBuffer,
        s0: usize,
        len: usize,
    ) -> Result<()> {
        if d0 + len > self.len() || s0 + len > src.len() {
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
            .memcpy_dtoh(&self.slice, &mut out)
            .map_err(driver(format!("copying {n} bytes to the host")))?;
        Ok(out)
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
