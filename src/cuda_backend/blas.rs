//! cuBLAS and cuBLASLt through cudarc (both loaded at run time).
//!
//! - [`bf16_linear`] serves the model's BF16 linears ([`crate::ops::bf16_linear`]):
//!   row-major `D[M, N] = A[M, K] · W[N, K]ᵀ` is the column-major product
//!   `Dᵀ (N × M, ld N) = Wᵀᵀ · Aᵀ`, i.e. `cublasGemmEx(op_A = T, op_B = N,
//!   m = N, n = M, k = K, A = W (ld K), B = A (ld K), C = D (ld N))`, with
//!   `CUBLAS_COMPUTE_32F` (no TF32, no reduced-precision split-K reductions)
//!   and a BF16 or F32 output. One cuBLAS handle per stream of a
//!   [`CudaDevice`], created on first use (outside a CUDA graph capture),
//!   bound to that stream, and kept (with the stream) for the life of the
//!   process; calls through one handle are serialised by a mutex. Each
//!   handle owns a workspace of [`LT_WORKSPACE_BYTES`] (`cublasSetWorkspace`):
//!   without one, cuBLAS 12.2+ takes its workspace from the stream-ordered
//!   pool at every call, which a capture records as an allocation and a free
//!   node around each GEMM (56 of each in a decode step's graph).
//! - [`grouped_bf16_linear`] serves `wo_a`'s block-diagonal linear: the same
//!   mapping per group, as one strided batched GEMM.
//! - [`Fp8TensorwisePlan`] (and [`cublaslt_fp8_tensorwise`]) is a
//!   **benchmark peer only**, the `cublaslt_fp8_tensorwise` baseline of the
//!   GEMM issue and of DeepGEMM's "× cuBLASLt": an FP8 e4m3 × e4m3 GEMM with
//!   one fp32 scale per tensor, same layout mapping as above (the TN form
//!   FP8 requires), FP32 compute, BF16 or F32 output. The model never uses
//!   it: V4.1's 32-element block scales cannot be expressed per tensor.
//!
//! cudarc panics when it cannot load a library, so the libraries are probed
//! first: by soname on the loader's path, then in `$CUDA_HOME/lib64`,
//! `$CUDA_PATH/lib64` and `/usr/local/cuda/lib64` (a library loaded there by
//! path satisfies the later load by soname). Their absence is an
//! [`Error::DeviceUnavailable`]; a failing call is an [`Error::Blas`].

use super::i32_param;
use super::{read_ptr, write_ptr};
use crate::device::{CudaBuffer, CudaDevice, Device};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use cudarc::cublas::{self, CudaBlas};
use cudarc::cublaslt::{result as lt, sys as lt_sys};
use std::collections::HashMap;
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock, Mutex};

/// Workspace handed to cuBLASLt and to each cuBLAS handle (NVIDIA's
/// recommendation for Hopper).
const LT_WORKSPACE_BYTES: usize = 32 << 20;

fn blas_error(during: &'static str) -> impl FnOnce(cublas::result::CublasError) -> Error {
    move |e| Error::Blas {
        during: during.into(),
        status: format!("{:?}", e.0),
    }
}

fn lt_error(during: &'static str) -> impl FnOnce(lt::CublasError) -> Error {
    move |e| Error::Blas {
        during: during.into(),
        status: format!("{:?}", e.0),
    }
}

/// Makes the CUDA context of `dev` current on this thread (cuBLAS runs on
/// the thread's current context).
fn bind(dev: &CudaDevice) -> Result<()> {
    dev.raw_stream()
        .context()
        .bind_to_thread()
        .map_err(|source| Error::Driver {
            during: "binding the CUDA context for cuBLAS".into(),
            source,
        })
}

/// Loads libcublasLt and libcublas once, or says why they are unavailable.
fn ensure_libraries() -> Result<()> {
    static LOADED: LazyLock<Result<(), String>> = LazyLock::new(load_libraries);
    LOADED.clone().map_err(|why| Error::DeviceUnavailable {
        device: "cuBLAS".into(),
        why,
    })
}

fn lt_present() -> bool {
    // SAFETY: loading libcublasLt runs only its ELF initialisers; the probe
    // unloads it again.
    unsafe { lt_sys::is_culib_present() }
}

fn blas_present() -> bool {
    // SAFETY: as above, for libcublas.
    unsafe { cublas::sys::is_culib_present() }
}

fn load_libraries() -> Result<(), String> {
    let dirs: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(std::env::var_os)
        .map(|d| PathBuf::from(d).join("lib64"))
        .chain([PathBuf::from("/usr/local/cuda/lib64")])
        .collect();
    // libcublas links against libcublasLt: load that first.
    type Probe = fn() -> bool;
    let libs: [(&str, Probe); 2] = [
        ("libcublasLt.so.13", lt_present),
        ("libcublas.so.13", blas_present),
    ];
    for (soname, present) in libs {
        if present() {
            continue;
        }
        for dir in &dirs {
            // SAFETY: as in `lt_present`; the library stays loaded for the
            // life of the process (cudarc resolves its symbols later).
            if let Ok(lib) = unsafe { libloading::Library::new(dir.join(soname)) } {
                std::mem::forget(lib);
                break;
            }
        }
        if !present() {
            return Err(format!(
                "{soname} is neither on the library path nor in {dirs:?} \
                 (set LD_LIBRARY_PATH or CUDA_HOME)"
            ));
        }
    }
    Ok(())
}

/// A cuBLAS handle and the workspace it was given (dropped after it).
struct Blas {
    blas: CudaBlas,
    _workspace: CudaBuffer,
}

type SharedBlas = Arc<Mutex<Blas>>;

/// The cuBLAS handle bound to `dev`'s stream, created on first use. The key
/// is the stream's address, which cannot be reused while the cached handle
/// holds the stream.
fn blas_handle(dev: &CudaDevice) -> Result<SharedBlas> {
    static HANDLES: LazyLock<Mutex<HashMap<usize, SharedBlas>>> = LazyLock::new(Mutex::default);
    ensure_libraries()?;
    let stream = dev.raw_stream();
    let key = Arc::as_ptr(stream) as usize;
    let mut handles = HANDLES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(h) = handles.get(&key) {
        return Ok(h.clone());
    }
    // cublasCreate allocates, and the workspace must outlive every graph
    // that records it: neither may happen inside a capture.
    dev.refuse_in_capture("creating a cuBLAS handle")?;
    bind(dev)?;
    let blas = CudaBlas::new(stream.clone()).map_err(blas_error("cublasCreate"))?;
    let mut workspace = dev.alloc(LT_WORKSPACE_BYTES)?;
    // SAFETY: the handle is live (owned by `blas`); the mode is a valid enum
    // value (CUBLAS_DEFAULT_MATH = 0 with reduced-precision reductions off).
    unsafe {
        cublas::sys::cublasSetMathMode(
            *blas.handle(),
            cublas::sys::cublasMath_t::CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION,
        )
    }
    .result()
    .map_err(blas_error("cublasSetMathMode"))?;
    {
        let (wsp, _g) = write_ptr(&mut workspace, dev);
        // SAFETY: the handle is live; `wsp` addresses the workspace's
        // LT_WORKSPACE_BYTES (256-byte aligned, as cuBLAS requires), owned by
        // the entry beside the handle and so alive as long as the handle; it
        // is used only on the handle's stream, which the allocation is
        // ordered on.
        unsafe { cublas::sys::cublasSetWorkspace_v2(*blas.handle(), wsp, LT_WORKSPACE_BYTES) }
            .result()
            .map_err(blas_error("cublasSetWorkspace"))?;
    }
    let h = Arc::new(Mutex::new(Blas {
        blas,
        _workspace: workspace,
    }));
    handles.insert(key, h.clone());
    Ok(h)
}

/// `out[M, N] = a[M, K] · w[N, K]ᵀ` for BF16 `a` and `w`, BF16 or F32 `out`,
/// through cuBLAS (see the module doc). The caller ([`crate::ops::bf16_linear_into`])
/// has validated dtypes, shapes (every dimension below 2^31, M, N, K ≥ 1)
/// and that all three tensors are on `dev`.
pub fn bf16_linear(
    dev: &CudaDevice,
    a: &Tensor,
    w: &Tensor,
    out: &mut Tensor,
    m: usize,
    n: usize,
    k: usize,
) -> Result<()> {
    use cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType_t};
    let out_type = match out.dtype() {
        DType::F32 => cudaDataType_t::CUDA_R_32F,
        _ => cudaDataType_t::CUDA_R_16BF,
    };
    let handle = blas_handle(dev)?;
    let guard = handle
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let blas = &guard.blas;
    bind(dev)?;
    let (ap, _ga) = read_ptr(a.cuda()?, dev);
    let (wp, _gw) = read_ptr(w.cuda()?, dev);
    let (op, _go) = write_ptr(out.cuda_mut()?, dev);
    let (alpha, beta) = (1.0f32, 0.0f32);
    // SAFETY: the handle is live and bound to `dev`'s stream, on which the
    // guards order these buffers. W is N × K and A is M × K BF16, row-major,
    // so column-major K × N (ld K) and K × M (ld K); D is M × N row-major,
    // column-major N × M (ld N), of `out_type`: the sizes the validated
    // shapes give the buffers. alpha and beta are host f32 (the default
    // pointer mode, FP32 compute), alive across the call; beta = 0 so D is
    // never read. No buffer aliases another (each tensor owns its storage).
    unsafe {
        cublas::result::gemm_ex(
            *blas.handle(),
            cublasOperation_t::CUBLAS_OP_T,
            cublasOperation_t::CUBLAS_OP_N,
            i32_param("n", n)?,
            i32_param("m", m)?,
            i32_param("k", k)?,
            (&alpha as *const f32).cast(),
            wp,
            cudaDataType_t::CUDA_R_16BF,
            i32_param("k", k)?,
            ap,
            cudaDataType_t::CUDA_R_16BF,
            i32_param("k", k)?,
            (&beta as *const f32).cast(),
            op,
            out_type,
            i32_param("n", n)?,
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(blas_error("cublasGemmEx (bf16_linear)"))
}

/// A leading dimension or batch stride (`None`: its product overflowed) as
/// the int64 cuBLAS and cuBLASLt take.
fn i64_dim(what: &'static str, v: Option<usize>) -> Result<i64> {
    v.and_then(|v| i64::try_from(v).ok())
        .ok_or_else(|| super::param_error(what, usize::MAX, "a cuBLAS stride or leading dimension"))
}

/// The grouped (block-diagonal) BF16 linear of `wo_a`
/// ([`crate::ops::grouped_bf16_linear`]): for each group g,
/// `out[:, g·N ..][T, N] = x[:, g·K ..][T, K] · w[g·N ..][N, K]ᵀ`, one strided
/// batched GEMM (`cublasGemmStridedBatchedEx`, the mapping of the module doc
/// per group: A = W_g (ld K, stride N·K), B = X_g (ld G·K, stride K),
/// C = D_g (ld G·N, stride N)), FP32 compute, BF16 output. The caller has
/// validated dtypes, shapes (T, N, K ≥ 1) and the device.
pub fn grouped_bf16_linear(
    dev: &CudaDevice,
    x: &Tensor,
    w: &Tensor,
    out: &mut Tensor,
    (t, groups, n, k): (usize, usize, usize, usize),
) -> Result<()> {
    use cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType_t};
    let (gk, gn) = (
        i32_param("groups × k", groups.saturating_mul(k))?,
        i32_param("groups × n", groups.saturating_mul(n))?,
    );
    let stride_w = i64_dim("n × k", n.checked_mul(k))?;
    let handle = blas_handle(dev)?;
    let guard = handle
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let blas = &guard.blas;
    bind(dev)?;
    let (xp, _gx) = read_ptr(x.cuda()?, dev);
    let (wp, _gw) = read_ptr(w.cuda()?, dev);
    let (op, _go) = write_ptr(out.cuda_mut()?, dev);
    let (alpha, beta) = (1.0f32, 0.0f32);
    // SAFETY: the handle is live and bound to `dev`'s stream, on which the
    // guards order these buffers. Group g reads W rows g·N .. (g+1)·N of
    // [G·N, K] (column-major K × N, ld K, offset g·N·K), X columns g·K ..
    // (g+1)·K of [T, G·K] (column-major K × T, ld G·K, offset g·K) and writes
    // D columns g·N .. (g+1)·N of [T, G·N] (column-major N × T, ld G·N,
    // offset g·N): all inside the validated shapes. The groups' outputs are
    // disjoint; alpha and beta are host f32 alive across the call; beta = 0.
    unsafe {
        cublas::result::gemm_strided_batched_ex(
            *blas.handle(),
            cublasOperation_t::CUBLAS_OP_T,
            cublasOperation_t::CUBLAS_OP_N,
            i32_param("n", n)?,
            i32_param("t", t)?,
            i32_param("k", k)?,
            (&alpha as *const f32).cast(),
            wp,
            cudaDataType_t::CUDA_R_16BF,
            i32_param("k", k)?,
            stride_w,
            xp,
            cudaDataType_t::CUDA_R_16BF,
            gk,
            i64_dim("k", Some(k))?,
            (&beta as *const f32).cast(),
            op,
            cudaDataType_t::CUDA_R_16BF,
            gn,
            i64_dim("n", Some(n))?,
            i32_param("groups", groups)?,
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(blas_error(
        "cublasGemmStridedBatchedEx (grouped_bf16_linear)",
    ))
}

const FP8_OP: &str = "cublaslt_fp8_tensorwise";

struct LtHandle(lt_sys::cublasLtHandle_t);

impl Drop for LtHandle {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtCreate and destroyed only here.
        let _ = unsafe { lt::destroy_handle(self.0) };
    }
}

struct LtDesc(lt_sys::cublasLtMatmulDesc_t);

impl Drop for LtDesc {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtMatmulDescCreate and destroyed only here.
        let _ = unsafe { lt::destroy_matmul_desc(self.0) };
    }
}

struct LtLayout(lt_sys::cublasLtMatrixLayout_t);

impl Drop for LtLayout {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtMatrixLayoutCreate, destroyed only here.
        let _ = unsafe { lt::destroy_matrix_layout(self.0) };
    }
}

struct LtPref(lt_sys::cublasLtMatmulPreference_t);

impl Drop for LtPref {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtMatmulPreferenceCreate, destroyed only here.
        let _ = unsafe { lt::destroy_matmul_pref(self.0) };
    }
}

/// Sets one cuBLASLt matmul descriptor attribute to `value`.
fn set_desc<T>(
    desc: &LtDesc,
    attr: lt_sys::cublasLtMatmulDescAttributes_t,
    value: &T,
) -> Result<()> {
    // SAFETY: the descriptor is live; `value` is a live `T` whose size is the
    // one passed, and `T` is the attribute's documented type (an int32 enum
    // for the transposes, a device pointer for the scale pointers).
    unsafe {
        lt::set_matmul_desc_attribute(
            desc.0,
            attr,
            (value as *const T).cast(),
            std::mem::size_of::<T>(),
        )
    }
    .map_err(lt_error("cublasLtMatmulDescSetAttribute"))
}

/// A cuBLASLt handle and the TN matmul descriptor every GEMM here uses
/// (FP32 compute and scale type; cuBLASLt's A = our W transposed, its B =
/// our activations), on `dev`'s context.
fn tn_handle_and_desc(dev: &CudaDevice) -> Result<(LtHandle, LtDesc)> {
    use lt_sys::cublasLtMatmulDescAttributes_t as Attr;
    ensure_libraries()?;
    bind(dev)?;
    let handle = LtHandle(lt::create_handle().map_err(lt_error("cublasLtCreate"))?);
    let desc = LtDesc(
        lt::create_matmul_desc(
            lt_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            lt_sys::cudaDataType_t::CUDA_R_32F,
        )
        .map_err(lt_error("cublasLtMatmulDescCreate"))?,
    );
    let (op_t, op_n) = (
        cublas::sys::cublasOperation_t::CUBLAS_OP_T as i32,
        cublas::sys::cublasOperation_t::CUBLAS_OP_N as i32,
    );
    set_desc(&desc, Attr::CUBLASLT_MATMUL_DESC_TRANSA, &op_t)?;
    set_desc(&desc, Attr::CUBLASLT_MATMUL_DESC_TRANSB, &op_n)?;
    Ok((handle, desc))
}

/// A heuristic preference allowing `ws_bytes` of workspace and, when
/// `no_reduction`, only algorithms without a split-K reduction
/// (`CUBLASLT_REDUCTION_SCHEME_NONE`).
fn preference(ws_bytes: usize, no_reduction: bool) -> Result<LtPref> {
    use lt_sys::cublasLtMatmulPreferenceAttributes_t as Pref;
    let pref =
        LtPref(lt::create_matmul_pref().map_err(lt_error("cublasLtMatmulPreferenceCreate"))?);
    let (max_ws, mask) = (ws_bytes as u64, 0u32);
    // SAFETY: the preference is live; MAX_WORKSPACE_BYTES is a uint64 and
    // REDUCTION_SCHEME_MASK a uint32 (0: only CUBLASLT_REDUCTION_SCHEME_NONE),
    // each passed by a pointer to a local of that type alive across the call.
    unsafe {
        lt::set_matmul_pref_attribute(
            pref.0,
            Pref::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            (&max_ws as *const u64).cast(),
            std::mem::size_of::<u64>(),
        )
        .map_err(lt_error("cublasLtMatmulPreferenceSetAttribute (workspace)"))?;
        if no_reduction {
            lt::set_matmul_pref_attribute(
                pref.0,
                Pref::CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                (&mask as *const u32).cast(),
                std::mem::size_of::<u32>(),
            )
            .map_err(lt_error("cublasLtMatmulPreferenceSetAttribute (reduction)"))?;
        }
    }
    Ok(pref)
}

/// `D = A · B` through cuBLASLt with α = 1 and β = 0 (C is D and is never
/// read), on `dev`'s stream.
///
/// # Safety
/// The handle, descriptor, algorithm and layouts are live; each pointer
/// addresses a device buffer holding what its layout describes; the
/// workspace holds its stated bytes (or is null with 0); every buffer is
/// ordered on `dev`'s stream.
unsafe fn lt_matmul(
    (handle, desc, algo): (&LtHandle, &LtDesc, &lt_sys::cublasLtMatmulAlgo_t),
    [(a, al), (b, bl)]: [(*const c_void, &LtLayout); 2],
    (d, dl): (*mut c_void, &LtLayout),
    (ws, ws_bytes): (*mut c_void, usize),
    dev: &CudaDevice,
) -> std::result::Result<(), lt::CublasError> {
    let (alpha, beta) = (1.0f32, 0.0f32);
    // SAFETY: the caller's contract; alpha and beta are host f32 alive across
    // the call (the default host pointer mode, FP32 scale type).
    unsafe {
        lt::matmul(
            handle.0,
            desc.0,
            (&alpha as *const f32).cast(),
            (&beta as *const f32).cast(),
            a,
            al.0,
            b,
            bl.0,
            d as *const c_void,
            dl.0,
            d,
            dl.0,
            algo,
            ws,
            ws_bytes,
            dev.raw_stream().cu_stream() as lt_sys::cudaStream_t,
        )
    }
}

/// A planned cuBLASLt FP8 per-tensor-scaled GEMM for one (M, N, K, output
/// dtype): `out[M, N] = (a_scale · w_scale) · a[M, K] · w[N, K]ᵀ`, e4m3
/// operands, fp32 scales on the device (`[1]` F32 tensors), FP32
/// accumulation (cuBLASLt's default, not fast accumulation), BF16 or F32
/// output. The handle, workspace, descriptors and the heuristic's algorithm
/// are made once here so [`Fp8TensorwisePlan::run`] costs only the launch.
/// Benchmark peer only (see the module doc).
pub struct Fp8TensorwisePlan {
    dev: CudaDevice,
    m: usize,
    n: usize,
    k: usize,
    out_dtype: DType,
    algo: lt_sys::cublasLtMatmulAlgo_t,
    layouts: [LtLayout; 3],
    desc: LtDesc,
    workspace: CudaBuffer,
    handle: LtHandle,
}

impl Fp8TensorwisePlan {
    /// Plans the GEMM on `dev`. M, N, K ≥ 1 and below 2^31; K and N
    /// multiples of 16 (cuBLASLt's FP8 leading-dimension rule); `out_dtype`
    /// BF16 or F32. Errors when cuBLASLt has no algorithm for the shape.
    pub fn new(
        dev: &CudaDevice,
        m: usize,
        n: usize,
        k: usize,
        out_dtype: DType,
    ) -> Result<Fp8TensorwisePlan> {
        use lt_sys::cudaDataType_t as T;
        for (arg, v) in [("m", m), ("n", n), ("k", k)] {
            if v == 0 || i32::try_from(v).is_err() {
                return Err(Error::Argument {
                    op: FP8_OP,
                    arg,
                    value: v.to_string(),
                    why: "must be at least 1 and below 2^31",
                });
            }
        }
        for (arg, v) in [("n", n), ("k", k)] {
            if !v.is_multiple_of(16) {
                return Err(Error::Argument {
                    op: FP8_OP,
                    arg,
                    value: v.to_string(),
                    why: "cuBLASLt FP8 needs N and K to be multiples of 16",
                });
            }
        }
        let out_type = match out_dtype {
            DType::BF16 => T::CUDA_R_16BF,
            DType::F32 => T::CUDA_R_32F,
            d => {
                return Err(Error::Argument {
                    op: FP8_OP,
                    arg: "out_dtype",
                    value: format!("dtype {d}"),
                    why: "the output dtype must be BF16 or F32",
                });
            }
        };
        let (handle, desc) = tn_handle_and_desc(dev)?;
        let workspace = dev.alloc(LT_WORKSPACE_BYTES)?;
        let layout = |ty, rows: usize, cols: usize, ld: usize| -> Result<LtLayout> {
            Ok(LtLayout(
                lt::create_matrix_layout(ty, rows as u64, cols as u64, ld as i64)
                    .map_err(lt_error("cublasLtMatrixLayoutCreate"))?,
            ))
        };
        // Column-major views: W is K × N (ld K), A is K × M (ld K), D is N × M (ld N).
        let layouts = [
            layout(T::CUDA_R_8F_E4M3, k, n, k)?,
            layout(T::CUDA_R_8F_E4M3, k, m, k)?,
            layout(out_type, n, m, n)?,
        ];
        let pref = preference(LT_WORKSPACE_BYTES, false)?;
        // SAFETY: every descriptor is live and describes the layouts above.
        let heuristic = unsafe {
            lt::get_matmul_algo_heuristic(
                handle.0,
                desc.0,
                layouts[0].0,
                layouts[1].0,
                layouts[2].0,
                layouts[2].0,
                pref.0,
            )
        }
        .map_err(lt_error(
            "cublasLtMatmulAlgoGetHeuristic (FP8 e4m3, per-tensor scales)",
        ))?;
        Ok(Fp8TensorwisePlan {
            dev: dev.clone(),
            m,
            n,
            k,
            out_dtype,
            algo: heuristic.algo,
            layouts,
            desc,
            workspace,
            handle,
        })
    }

    /// Runs the planned GEMM: `a` `[M, K]` and `w` `[N, K]` e4m3, `a_scale`
    /// and `w_scale` F32 `[1]`, `out` `[M, N]` of the planned dtype, all on
    /// the plan's device.
    pub fn run(
        &mut self,
        a: &Tensor,
        a_scale: &Tensor,
        w: &Tensor,
        w_scale: &Tensor,
        out: &mut Tensor,
    ) -> Result<()> {
        use lt_sys::cublasLtMatmulDescAttributes_t as Attr;
        let (m, n, k) = (self.m, self.n, self.k);
        a.expect_output(FP8_OP, "a", DType::F8E4M3, &[m, k])?;
        w.expect_output(FP8_OP, "w", DType::F8E4M3, &[n, k])?;
        a_scale.expect_output(FP8_OP, "a_scale", DType::F32, &[1])?;
        w_scale.expect_output(FP8_OP, "w_scale", DType::F32, &[1])?;
        out.expect_output(FP8_OP, "out", self.out_dtype, &[m, n])?;
        let here = Device::Cuda(self.dev.clone());
        for (name, t) in [
            ("a", a),
            ("a_scale", a_scale),
            ("w", w),
            ("w_scale", w_scale),
            ("out", &*out),
        ] {
            if !t.device().same_as(&here) {
                let (got, expected) = Device::mismatch_names(&t.device(), &here);
                return Err(Error::DeviceMismatch {
                    op: FP8_OP,
                    tensor: name,
                    got,
                    expected,
                });
            }
        }
        let dev = &self.dev;
        bind(dev)?;
        let (ap, _ga) = read_ptr(a.cuda()?, dev);
        let (wp, _gw) = read_ptr(w.cuda()?, dev);
        let (asp, _gas) = read_ptr(a_scale.cuda()?, dev);
        let (wsp, _gws) = read_ptr(w_scale.cuda()?, dev);
        let (wsb, _gwb) = write_ptr(&mut self.workspace, dev);
        let (op, _go) = write_ptr(out.cuda_mut()?, dev);
        // cuBLASLt's A is our W and its B our A.
        set_desc(&self.desc, Attr::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &wsp)?;
        set_desc(&self.desc, Attr::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &asp)?;
        // SAFETY: handle, descriptor, layouts and algorithm are live and were
        // planned for exactly these (M, N, K, dtypes), which the checks above
        // confirm for every tensor, so each buffer holds what its layout
        // describes; the scale pointers address one f32 each. The workspace
        // is the plan's own LT_WORKSPACE_BYTES, the size the heuristic was
        // allowed. All work is ordered on the plan device's stream, which
        // the guards use too.
        unsafe {
            lt_matmul(
                (&self.handle, &self.desc, &self.algo),
                [(wp, &self.layouts[0]), (ap, &self.layouts[1])],
                (op, &self.layouts[2]),
                (wsb, LT_WORKSPACE_BYTES),
                dev,
            )
        }
        .map_err(lt_error("cublasLtMatmul (FP8 e4m3, per-tensor scales)"))
    }
}

/// One-shot [`Fp8TensorwisePlan`]: plans for the shapes of `a` `[M, K]`,
/// `w` `[N, K]` and `out`'s dtype on `dev`, then runs. Benchmark peer only.
pub fn cublaslt_fp8_tensorwise(
    dev: &CudaDevice,
    a: &Tensor,
    a_scale: &Tensor,
    w: &Tensor,
    w_scale: &Tensor,
    out: &mut Tensor,
) -> Result<()> {
    let (&[m, k], &[n, _]) = (a.shape(), w.shape()) else {
        let (name, t) = if a.shape().len() != 2 {
            ("a", a)
        } else {
            ("w", w)
        };
        return Err(Error::Shape {
            op: FP8_OP,
            tensor: name,
            got: t.shape().to_vec(),
            expected: "rank 2 ([M, K] for a, [N, K] for w)".into(),
        });
    };
    Fp8TensorwisePlan::new(dev, m, n, k, out.dtype())?.run(a, a_scale, w, w_scale, out)
}

/// The row count the pinned algorithm of [`pinned_bf16_linear`] is chosen
/// for (a decode batch of a few hundred tokens); it then runs for every M.
const PINNED_REF_ROWS: usize = 256;

/// How many of the heuristic's algorithms [`PinnedPlan::new`] considers.
const PINNED_CANDIDATES: i32 = 16;

/// One (stream, N, K, groups, output type)'s pinned cuBLASLt algorithm, and
/// the workspace it was chosen with (none when a workspace-free algorithm
/// exists).
struct PinnedPlan {
    algo: lt_sys::cublasLtMatmulAlgo_t,
    workspace: Option<CudaBuffer>,
    desc: LtDesc,
    handle: LtHandle,
    /// Keeps the stream, whose address keys the plan cache, alive: no other
    /// stream can take that address while the plan is cached.
    _stream: Arc<cudarc::driver::CudaStream>,
}

// SAFETY: a cuBLASLt handle, matmul descriptor and algorithm are plain host
// objects that cuBLASLt allows on any thread; every use of a plan goes
// through the cache's per-plan mutex, so no two threads touch one at once.
unsafe impl Send for PinnedPlan {}

type SharedPlan = Arc<Mutex<PinnedPlan>>;

/// The three column-major layouts of `groups` GEMMs `D_g[N × M] = W_gᵀ ·
/// X_g` (W `[G·N, K]`, X `[M, G·K]`, D `[M, G·N]` row-major, BF16 inputs,
/// `out_type` output): group g at offsets g·N·K, g·K and g·N.
fn grouped_layouts(
    (m, groups, n, k): (usize, usize, usize, usize),
    out_type: lt_sys::cudaDataType_t,
) -> Result<[LtLayout; 3]> {
    use lt_sys::cublasLtMatrixLayoutAttribute_t as A;
    let layout = |ty, rows: usize, cols: usize, ld: i64, stride: i64| -> Result<LtLayout> {
        let l = LtLayout(
            lt::create_matrix_layout(ty, rows as u64, cols as u64, ld)
                .map_err(lt_error("cublasLtMatrixLayoutCreate"))?,
        );
        if groups > 1 {
            let count = i32_param("groups", groups)?;
            // SAFETY: the layout is live; BATCH_COUNT is an int32 and
            // STRIDED_BATCH_OFFSET an int64, each passed by a pointer to a
            // local of that type alive across the call.
            unsafe {
                lt::set_matrix_layout_attribute(
                    l.0,
                    A::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                    (&count as *const i32).cast(),
                    std::mem::size_of::<i32>(),
                )
                .map_err(lt_error("cublasLtMatrixLayoutSetAttribute (batch count)"))?;
                lt::set_matrix_layout_attribute(
                    l.0,
                    A::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                    (&stride as *const i64).cast(),
                    std::mem::size_of::<i64>(),
                )
                .map_err(lt_error("cublasLtMatrixLayoutSetAttribute (batch stride)"))?;
            }
        }
        Ok(l)
    };
    let bf16 = lt_sys::cudaDataType_t::CUDA_R_16BF;
    let (ldk, ldn) = (
        i64_dim("groups × k", groups.checked_mul(k))?,
        i64_dim("groups × n", groups.checked_mul(n))?,
    );
    Ok([
        layout(
            bf16,
            k,
            n,
            i64_dim("k", Some(k))?,
            i64_dim("n × k", n.checked_mul(k))?,
        )?,
        layout(bf16, k, m, ldk, i64_dim("k", Some(k))?)?,
        layout(out_type, n, m, ldn, i64_dim("n", Some(n))?)?,
    ])
}

/// Why one heuristic candidate was not taken (for the error that says no
/// algorithm could be pinned).
fn rejected(why: &str, cand: usize, detail: impl std::fmt::Display) -> String {
    format!("#{cand} {why} {detail}")
}

impl PinnedPlan {
    /// Picks, among the heuristic's algorithms for [`PINNED_REF_ROWS`] rows
    /// with no split-K reduction, the first whose split-K count is 1 and
    /// which cuBLASLt accepts for one row too: first with no workspace, then
    /// (where no such algorithm exists, as for the 129,280-row head) with a
    /// plan-owned workspace of [`LT_WORKSPACE_BYTES`]. Neither choice looks
    /// at M again, so every M runs this one kernel configuration.
    fn new(
        dev: &CudaDevice,
        dims: (usize, usize, usize),
        out_type: lt_sys::cudaDataType_t,
    ) -> Result<PinnedPlan> {
        let (groups, n, k) = dims;
        let (handle, desc) = tn_handle_and_desc(dev)?;
        let at_ref = grouped_layouts((PINNED_REF_ROWS, groups, n, k), out_type)?;
        let at_one = grouped_layouts((1, groups, n, k), out_type)?;
        let mut why = Vec::new();
        for ws_bytes in [0, LT_WORKSPACE_BYTES] {
            if let Some(algo) = pick(&handle, &desc, &at_ref, &at_one, ws_bytes, &mut why)? {
                let workspace = match ws_bytes {
                    0 => None,
                    b => Some(dev.alloc(b)?),
                };
                return Ok(PinnedPlan {
                    algo,
                    workspace,
                    desc,
                    handle,
                    _stream: dev.raw_stream().clone(),
                });
            }
        }
        Err(Error::Blas {
            during: format!(
                "choosing a pinned cuBLASLt algorithm for BF16 [M, {k}] x [{n}, {k}]^T ({groups} groups)"
            ),
            status: format!(
                "no candidate runs with no split-K and one row: {}",
                why.join("; ")
            ),
        })
    }
}

/// The first heuristic candidate for `at_ref` (workspace at most
/// `ws_bytes`, no split-K reduction) with split-K 1 that cuBLASLt also
/// accepts for `at_one` within the workspace; reasons for the others are
/// appended to `why`.
fn pick(
    handle: &LtHandle,
    desc: &LtDesc,
    at_ref: &[LtLayout; 3],
    at_one: &[LtLayout; 3],
    ws_bytes: usize,
    why: &mut Vec<String>,
) -> Result<Option<lt_sys::cublasLtMatmulAlgo_t>> {
    use lt_sys::cublasLtMatmulAlgoConfigAttributes_t as Cfg;
    use lt_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS as OK;
    let pref = preference(ws_bytes, true)?;
    // SAFETY: an all-zero heuristic result is a valid value of this plain C
    // struct (cuBLASLt overwrites the entries it returns).
    let mut found: Vec<lt_sys::cublasLtMatmulHeuristicResult_t> =
        vec![unsafe { std::mem::zeroed() }; PINNED_CANDIDATES as usize];
    let mut count = 0i32;
    // SAFETY: handle, descriptor, layouts and preference are live; the
    // result array holds PINNED_CANDIDATES entries, the count asked for.
    let status = unsafe {
        lt_sys::cublasLtMatmulAlgoGetHeuristic(
            handle.0,
            desc.0,
            at_ref[0].0,
            at_ref[1].0,
            at_ref[2].0,
            at_ref[2].0,
            pref.0,
            PINNED_CANDIDATES,
            found.as_mut_ptr(),
            &mut count,
        )
    };
    if status != OK {
        why.push(format!("workspace {ws_bytes}: heuristic {status:?}"));
        return Ok(None);
    }
    let count = usize::try_from(count.clamp(0, PINNED_CANDIDATES)).unwrap_or(0);
    why.push(format!("workspace {ws_bytes}: {count} candidates"));
    for (i, cand) in found.iter().take(count).enumerate() {
        if cand.state != OK {
            why.push(rejected("state", i, format!("{:?}", cand.state)));
            continue;
        }
        if cand.workspaceSize > ws_bytes {
            why.push(rejected("workspace", i, cand.workspaceSize));
            continue;
        }
        // Split-K 1 and no reduction scheme: each output element is one
        // tile's K loop, whatever the number of M tiles.
        let config = |attr: Cfg| -> Option<u32> {
            let (mut v, mut written) = (0u32, 0usize);
            // SAFETY: the algorithm is a live value returned above; both
            // attributes are uint32, written into `v` (its size passed).
            let read = unsafe {
                lt_sys::cublasLtMatmulAlgoConfigGetAttribute(
                    &cand.algo,
                    attr,
                    (&mut v as *mut u32).cast(),
                    std::mem::size_of::<u32>(),
                    &mut written,
                )
            };
            (read == OK).then_some(v)
        };
        match (
            config(Cfg::CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
            config(Cfg::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
        ) {
            (Some(0 | 1), Some(0)) => {}
            (Some(splits), Some(scheme)) => {
                why.push(rejected(
                    "split-K / reduction",
                    i,
                    format!("{splits} / {scheme}"),
                ));
                continue;
            }
            _ => {
                why.push(rejected("unreadable split-K or reduction", i, ""));
                continue;
            }
        }
        // SAFETY: an all-zero heuristic result is a valid value of this
        // plain C struct, which the check below overwrites.
        let mut check: lt_sys::cublasLtMatmulHeuristicResult_t = unsafe { std::mem::zeroed() };
        // SAFETY: handle, descriptor, the one-row layouts and the algorithm
        // are live; `check` is a valid struct cuBLASLt writes its result to.
        let ok = unsafe {
            lt_sys::cublasLtMatmulAlgoCheck(
                handle.0,
                desc.0,
                at_one[0].0,
                at_one[1].0,
                at_one[2].0,
                at_one[2].0,
                &cand.algo,
                &mut check,
            )
        };
        if ok != OK {
            why.push(rejected("one-row check", i, format!("{ok:?}")));
            continue;
        }
        if check.workspaceSize > ws_bytes {
            why.push(rejected("one-row workspace", i, check.workspaceSize));
            continue;
        }
        return Ok(Some(cand.algo));
    }
    Ok(None)
}

/// The pinned plan for (`dev`'s stream, dims, output type), made on first use.
fn pinned_plan(
    dev: &CudaDevice,
    dims: (usize, usize, usize),
    out_type: lt_sys::cudaDataType_t,
) -> Result<SharedPlan> {
    type Key = (usize, usize, usize, usize, u32);
    static PLANS: LazyLock<Mutex<HashMap<Key, SharedPlan>>> = LazyLock::new(Mutex::default);
    let key = (
        Arc::as_ptr(dev.raw_stream()) as usize,
        dims.0,
        dims.1,
        dims.2,
        out_type as u32,
    );
    let mut plans = PLANS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(p) = plans.get(&key) {
        return Ok(p.clone());
    }
    let plan = Arc::new(Mutex::new(PinnedPlan::new(dev, dims, out_type)?));
    plans.insert(key, plan.clone());
    Ok(plan)
}

/// The batch-invariant BF16 linear of a batch-invariant device
/// ([`CudaDevice::batch_invariant`]), for [`crate::ops::bf16_linear_into`]
/// (`groups` 1) and [`crate::ops::grouped_bf16_linear`]: for each group g,
/// `out[:, g·N ..][M, N] = x[:, g·K ..][M, K] · w[g·N ..][N, K]ᵀ` with FP32
/// compute and a BF16 or F32 `out`, through one cuBLASLt algorithm pinned
/// per (stream, N, K, G, output type) by [`PinnedPlan::new`]: no split-K
/// (and no workspace where cuBLASLt has such an algorithm), so every output
/// element is one tile's K loop, the same for every M
/// (`tests/cuda_batch_invariance.rs` checks it row by row). The caller has validated dtypes, shapes (M, N, K ≥ 1, every
/// size below 2^31) and the device.
pub fn pinned_bf16_linear(
    dev: &CudaDevice,
    x: &Tensor,
    w: &Tensor,
    out: &mut Tensor,
    (m, groups, n, k): (usize, usize, usize, usize),
) -> Result<()> {
    let out_type = match out.dtype() {
        DType::F32 => lt_sys::cudaDataType_t::CUDA_R_32F,
        _ => lt_sys::cudaDataType_t::CUDA_R_16BF,
    };
    let plan = pinned_plan(dev, (groups, n, k), out_type)?;
    let mut plan = plan
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let plan = &mut *plan;
    let layouts = grouped_layouts((m, groups, n, k), out_type)?;
    bind(dev)?;
    let (xp, _gx) = read_ptr(x.cuda()?, dev);
    let (wp, _gw) = read_ptr(w.cuda()?, dev);
    let (op, _go) = write_ptr(out.cuda_mut()?, dev);
    let (wsp, _gws, ws_bytes) = match plan.workspace.as_mut() {
        Some(ws) => {
            let (p, g) = write_ptr(ws, dev);
            (p, Some(g), LT_WORKSPACE_BYTES)
        }
        None => (std::ptr::null_mut(), None, 0),
    };
    // SAFETY: handle, descriptor and algorithm are live (the plan's) and the
    // layouts describe exactly the validated buffers: W [G·N, K], X [M, G·K]
    // and D [M, G·N] row-major, group g at offsets g·N·K, g·K and g·N (see
    // `grouped_layouts`). The workspace is the plan's own buffer of the size
    // the algorithm was chosen under (none when it was chosen with none).
    // The guards order the buffers on `dev`'s stream, which the call runs on.
    unsafe {
        lt_matmul(
            (&plan.handle, &plan.desc, &plan.algo),
            [(wp, &layouts[0]), (xp, &layouts[1])],
            (op, &layouts[2]),
            (wsp, ws_bytes),
            dev,
        )
    }
    .map_err(lt_error("cublasLtMatmul (pinned BF16)"))
}
