//! The shared vocabulary of the op API and the backends: parameter structs,
//! constants and conventions that `ops`, `cpu_backend`, `cuda_backend` and
//! the model all name. It sits below all of them and imports none of them.
//!
//! Invariant: nothing here computes a kernel's numerics; it only states
//! shapes, constants and the parameters a kernel is called with.

use crate::tensor::Tensor;

/// YaRN parameters (V4.1 ratio > 0 layers: factor 16, original length
/// 65,536, β_fast 32, β_slow 1). There is no mscale term.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    pub factor: f64,
    /// YaRN is active only when this is > 0.
    pub original_seq_len: u64,
    pub beta_fast: f64,
    pub beta_slow: f64,
}

/// The RoPE of one layer: θ (`rope_theta` 10000 for ratio-0 layers and the
/// DSpark stages, `compress_rope_theta` 160000 for ratio > 0 layers) and
/// YaRN where the layer uses it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    pub theta: f64,
    pub yarn: Option<Yarn>,
}

/// Number of residual streams (`hc_mult`).
pub const HC_STREAMS: usize = 4;
/// Mixes per sublayer: 4 pre, 4 post, 16 comb.
pub const HC_MIXES: usize = 24;

/// Sinkhorn iterations of one mHC split at most (`hc_sinkhorn_iters`;
/// V4.1 uses 20): the config and `ops::mhc_pre` share the bound, so an
/// absurd count is an error, not a hang.
pub const MHC_MAX_SINKHORN_ITERS: usize = 1000;

/// Routed experts of a layer at most (`n_routed_experts`; V4.1 uses 384):
/// the config and `ops::moe_layout` share the bound, which keeps the
/// layout's per-expert outputs small.
pub const MOE_MAX_EXPERTS: usize = 1 << 14;

/// The one-hot pre (1, 0, 0, 0) used by layer 0's attention and by each
/// DSpark block's first sublayer.
pub const ONE_HOT_PRE: [f32; HC_STREAMS] = [1.0, 0.0, 0.0, 0.0];

/// The four compressed ids hashed at one position, newest first: the id at
/// p, p−1, p−2, p−3. A look-back before the sequence start or across a dead
/// (image) token, and everything older, uses `pad`; a dead current token
/// makes all four `pad`. `history` holds the compressed ids of positions
/// 0..=p (None for dead tokens), newest last.
pub fn ngram_ids(history: &[Option<i64>], pad: i64) -> [i64; 4] {
    let mut ids = [pad; 4];
    for (shift, slot) in ids.iter_mut().enumerate() {
        match history
            .len()
            .checked_sub(1 + shift)
            .and_then(|i| history.get(i))
        {
            Some(&Some(id)) => *slot = id,
            _ => break,
        }
    }
    ids
}

/// Elements sharing one E8M0 scale in V4.1's MX formats: the FP8 activation
/// block (1 × 32), the FP8 weight block (32 × 32), the FP4 expert weight and
/// index-key groups (one scale per 32 along a row), the FP8 window-KV row.
pub const MX_BLOCK: usize = 32;

/// Values sharing one E4M3 scale in the FP4 compressed-KV row.
pub const FP4_KV_GROUP: usize = 16;

/// Which CUDA implementation runs the quantiser (the CPU has one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActQuantImpl {
    /// The hand-written kernels in `kernels-cuda/quant/`.
    Cuda,
    /// The TileLang program `tilelang/act_quant_fp8.py` (k % 32 == 0 only).
    TileLang,
}

/// Which CUDA kernel computes the index scores; both are bitwise equal to
/// the CPU reference (`kernels-cuda/indexer/README.md` gives the tensor-core
/// kernel's proof and its exact fallback). Ignored on the CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScoreKernel {
    /// The tensor-core kernel where it applies (dim 128, heads ≤ 32, keys
    /// 4-byte aligned), else the exact SIMT kernel.
    Auto,
    /// The exact SIMT kernel (any shape; ≈ 3 % of copy bandwidth).
    Exact,
    /// The integer tensor-core kernel; another shape is a typed error.
    Tensor,
}

/// Shape of a validated index-score call.
#[derive(Clone, Copy, Debug)]
pub struct ScoreShape {
    pub batch: usize,
    pub heads: usize,
    pub dim: usize,
    /// Key rows per batch row.
    pub n: usize,
    /// Whether every batch row has its own `n` keys (else one shared cache).
    pub per_row_keys: bool,
}

/// Widest last dimension the fused RMSNorm + FP8 quantiser handles (one CTA
/// holds a row in registers). V4.1 uses 512, 1280, 4096, 5120 and 8192.
pub const RMS_NORM_ACT_QUANT_MAX_DIM: usize = 8192;

/// Outputs of `ops::mhc_pre`: `u` BF16 `[T, D]`, `mixes` F32 `[T, 24]` (the
/// 24 mixes the split was computed from), `pre` and `post` F32 `[T, 4]`,
/// `comb` F32 `[T, 16]` (`comb[j·4 + k]`: source stream j to destination
/// stream k).
#[derive(Debug)]
pub struct MhcPre {
    pub u: Tensor,
    pub mixes: Tensor,
    pub pre: Tensor,
    pub post: Tensor,
    pub comb: Tensor,
}

/// The largest head dimension `SparseMqaKernel::Generic` takes (its query
/// and accumulator live in 48 KiB of shared memory).
pub const SPARSE_MQA_GENERIC_MAX_DIM: usize = 4096;

/// Which CUDA kernel version runs `ops::sparse_mqa` (`kernels-cuda/attention/README.md`
/// gives their designs and measurements; versions 1, 2 and 4 lost to these
/// and left the build, as did V6, V7 and V10). V3 and V5 give bitwise the same
/// result; V8, V9, V11 and V12 (wgmma) sum their dot products in other orders and
/// agree with them within the op's stated bound, not bitwise. The
/// CPU has one reference and ignores this.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SparseMqaKernel {
    /// `sparse_mqa_v3`: 64 heads per CTA, four producer warps (entries
    /// resolved three blocks ahead, rows prefetched into L2, the byte-permute
    /// FP4 decode) and eight mma.sync consumer warps.
    V3,
    /// `sparse_mqa_v5_h32`: V3 with 32 heads per CTA, 8 producer warps and
    /// one consumer warpgroup.
    V5Heads32,
    /// `sparse_mqa_v5_h16`: the same with 16 heads per CTA.
    V5Heads16,
    /// `sparse_mqa_v8`: a producer warpgroup that copies raw rows by
    /// cp.async (missing rows zero-filled) and decodes them from shared
    /// memory, branch-free in blocks of one format; two wgmma consumer
    /// warpgroups, each over all 512 dims for Q·Kᵀ and half of them for P·V
    /// (64 heads per CTA; version 3 where the device has no wgmma).
    V8,
    /// `sparse_mqa_v9`: V8 with one bulk copy (`cp.async.bulk`) per row
    /// (64 heads per CTA; version 3 where the device has no wgmma).
    V9,
    /// `sparse_mqa_v11`: eight producer warps (512 threads) that load 8 rows
    /// a warp straight into registers (four lanes a row) and decode them
    /// into the tile; the two wgmma consumer warpgroups split Q·Kᵀ by dims
    /// (exchanging the partial logits) and issue P·V as two `m64n128`
    /// halves (64 heads per CTA; version 3 where the device has no wgmma).
    V11,
    /// `sparse_mqa_v12`: V9's producer with an 18 KiB raw stage (window
    /// rows copied and decoded in two rounds of 8 a warp) and an unrolled
    /// decode; one consumer warpgroup computes Q·Kᵀ, the softmax and P·V for
    /// half the dims and hands P to the other through shared memory
    /// (64 heads per CTA; version 3 where the device has no wgmma). Bitwise
    /// V9.
    V12,
    /// `sparse_mqa_v14`: V12 with consumer warpgroup 1 also feeding 6 of
    /// every 16 rows of a producer warp into the tile (its own raw slots,
    /// copies and barrier), between its P·V steps. Bitwise V12.
    V14,
    /// `sparse_mqa_generic`: the portable kernel for every shape the op takes
    /// (D a multiple of 64 up to [`SPARSE_MQA_GENERIC_MAX_DIM`], any H), one
    /// CTA per (query, head) with the CPU's sequential sums: bitwise the CPU
    /// reference but for lse's last ulp. A correctness path, not a fast one.
    Generic,
    /// At D 512 and H a multiple of 64: V14 with 64 heads per CTA or V5 with
    /// 32 or 16, the CTA size chosen from the number of CTAs each gives (more,
    /// smaller CTAs for few queries); V14 when [`SparseMqaSplit::Auto`] splits
    /// the lists and always on a batch-invariant handle (V5 and V14 round
    /// differently; V14 is bitwise V12 and V9). At every other shape: `Generic`.
    #[default]
    Auto,
}

/// Split-KV of `ops::sparse_mqa` on CUDA: a query's list cut into spans of
/// a fixed number of entries, one CTA each, their partial results combined
/// in split order by a second kernel. A query's result depends on the span
/// size alone, never on the other queries (the tensor-core versions only;
/// `Generic` and the CPU never split).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SparseMqaSplit {
    /// One CTA per query: no combine pass (the fastest when the queries
    /// fill the GPU).
    None,
    /// Spans of this many entries (a positive multiple of
    /// [`SPARSE_MQA_SPLIT_UNIT`]).
    Entries(usize),
    /// From the number of queries: spans sized so that the CTAs fill the
    /// SMs once when the queries alone would leave them idle, else none. A
    /// batch-invariant handle never splits here (its span would depend on
    /// the batch); it can pass `Entries` for a fixed span.
    #[default]
    Auto,
}

/// Entries of the online-softmax block: a split span is a multiple of it.
pub const SPARSE_MQA_SPLIT_UNIT: usize = 64;

/// Shape of a validated `ops::sparse_mqa` call.
#[derive(Clone, Copy, Debug)]
pub struct SparseMqaShape {
    /// Queries.
    pub t: usize,
    /// Query heads.
    pub h: usize,
    /// Head (latent) dimension.
    pub d: usize,
    /// Window rows in the pool and window entries per query.
    pub nw: usize,
    pub kw: usize,
    /// Compressed rows in the pool and compressed entries per query (0, 0
    /// for a window-only layer).
    pub nc: usize,
    pub kc: usize,
}

/// The head dimension the tensor-core sparse MQA versions take (448 NoPE +
/// 64 RoPE in V4.1).
pub const SPARSE_MQA_CUDA_DIM: usize = 512;
/// Query heads per tensor-core work unit: those versions need a multiple.
pub const SPARSE_MQA_CUDA_HEAD_GROUP: usize = 64;

impl SparseMqaShape {
    /// Whether the tensor-core versions (V1-V5) take this shape: D 512, H a
    /// multiple of 64 below 2^20.
    pub fn fits_tensor_cores(&self) -> bool {
        self.d == SPARSE_MQA_CUDA_DIM
            && self.h.is_multiple_of(SPARSE_MQA_CUDA_HEAD_GROUP)
            && self.h / 16 <= u16::MAX as usize
    }

    /// Whether `SparseMqaKernel::Generic` takes it: D ≤
    /// [`SPARSE_MQA_GENERIC_MAX_DIM`], H ≤ 65535 (the grid's y).
    pub fn fits_generic(&self) -> bool {
        self.d <= SPARSE_MQA_GENERIC_MAX_DIM && self.h <= u16::MAX as usize
    }
}

/// The three encoded cache rows of `kv_format` (`v41-flash.md` §11), as the
/// row writers (`ops::kv_rows`, `ops::compressor_rows_into`) produce them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvRowFormat {
    /// The window ring row: e4m3 values, one E8M0 scale per 32 (528 bytes
    /// at 512).
    Window,
    /// The compressed-KV row: packed e2m1, one E4M3 scale per 16 (288 bytes
    /// at 512).
    Compressed,
    /// The index-key row: packed e2m1, one E8M0 scale per 32 (68 bytes at
    /// 128).
    IndexKey,
}

impl KvRowFormat {
    /// Values sharing one scale; a row's width must be a multiple of it.
    pub fn group(self) -> usize {
        match self {
            KvRowFormat::Compressed => FP4_KV_GROUP,
            KvRowFormat::Window | KvRowFormat::IndexKey => MX_BLOCK,
        }
    }

    /// Bytes of the encoded row of `dim` values.
    pub fn row_bytes(self, dim: usize) -> usize {
        match self {
            KvRowFormat::Window => dim + dim / MX_BLOCK,
            KvRowFormat::Compressed => dim / 2 + dim / FP4_KV_GROUP,
            KvRowFormat::IndexKey => dim / 2 + dim / MX_BLOCK,
        }
    }
}

/// Widest row (values) and RoPE slice the CUDA row writers take
/// (`DI_KV_MAX_DIM`, `DI_KV_MAX_ROPE_DIM`).
pub const KV_ROWS_CUDA_MAX_DIM: usize = 4096;
/// See [`KV_ROWS_CUDA_MAX_DIM`].
pub const KV_ROWS_CUDA_MAX_ROPE_DIM: usize = 256;
