// RMSNorm over rows of BF16 values with fp32 math (v41-flash.md §10.6):
//
//     out[r, i] = bf16_rne( w[i] * ( x[r, i] * (1 / sqrt(sum_i x[r, i]^2 / dim + eps)) ) )
//
// with x and w promoted to fp32; V4.1 uses eps = 1e-20 (the vision tower 1e-6).
//
// STATUS: UNVERIFIED. Written against the AscendC documentation only; it has
// never been compiled or run (no CANN toolchain, no Ascend device). See
// kernels-ascend/README.md, section "Unverified", before relying on it.
//
// Entry point (extern "C", so the symbol is exactly `rms_norm_bf16`):
//
//     rms_norm_bf16(GM_ADDR x, GM_ADDR weight, GM_ADDR out,
//                   uint64_t rows, uint64_t dim, float eps)
//
//   x       bf16 [rows, dim], dense row-major, device (global) memory
//   weight  bf16 [dim]
//   out     bf16 [rows, dim], dense row-major; must not alias x
//   rows    number of rows (0 is a no-op)
//   dim     row length, 1 <= dim <= kMaxDim (8192); any value in that range,
//           the copies use DataCopyPad so no alignment of dim is required
//   eps     added to mean(x^2) before the square root (fp32)
//
// Scalars are passed by value, no tiling struct: every argument before `eps`
// is 8 bytes wide, so the argument block has no interior padding whatever
// alignment rule the launcher applies (3 pointers, 2 x u64, then one f32).
// The host wrapper must check 1 <= dim <= 8192 (the kernel returns without
// writing anything otherwise) and that x, weight, out are distinct buffers.
//
// Launch: an AIV-only kernel (KERNEL_TYPE_AIV_ONLY) with any block count
// `blockDim` >= 1; min(rows, number of vector cores) is the sensible choice.
// Rows are split into contiguous, balanced ranges by AscendC::GetBlockIdx():
// block b handles rows [b*q + min(b, r), ...) with q = rows / blockDim,
// r = rows % blockDim, and q + (b < r) rows.
//
// Per core, one row at a time, double-buffered (TQue depth 2):
//   CopyIn(r+1) is issued as soon as row r has been dequeued, so the MTE2 load
//   of the next row overlaps the vector work and the MTE3 store of this one.
//   Compute: fp32 x = cast(x_bf16); ss = ReduceSum(x*x); the inverse RMS is
//   formed on the vector unit in a 1-element tensor (Div, Adds, Sqrt, Div),
//   read back by the scalar unit after a V->S flag, then y = x * inv_rms,
//   out = bf16_rne(w_fp32 * y).
// The weight is loaded and cast to fp32 once per core.
//
// UB use at dim = 8192: 2x16 KiB in + 2x16 KiB out + 32 KiB x(fp32)
// + 32 KiB w(fp32) + 1 KiB reduce work + 128 B = 129 KiB (A2/A3 UB: 192 KiB;
// the Ascend 950 UB size is assumed to be at least that, unverified).
//
// Numerics versus the CPU reference (src/cpu_backend/rms_norm.rs):
//   * Summation order differs (ReduceSum: pairwise within each 64-element
//     repeat, then across repeats), as it does for CUDA, so results can differ
//     in the last fp32 bits of the sum and, rarely, by 1 bf16 ulp of the
//     output. Tests must use the same tolerance as for CUDA.
//   * mean = sum / dim and 1 / sqrt(.) are computed with the vector Div and
//     Sqrt; the CPU uses IEEE-correct division and sqrt. Whether the AI Core
//     vector Div/Sqrt are correctly rounded is not documented (unverified).
//   * Cast fp32 -> bf16 uses CAST_RINT (nearest, ties to even). The AscendC
//     documentation says the conversion saturates on overflow, where the CPU
//     and CUDA round to inf; only |w * y| > 3.39e38 is affected.
//   * If the vector unit flushes fp32 subnormals, rows whose x^2 underflow
//     (|x| < ~1e-19) lose accuracy; the CPU keeps subnormals.
#include "kernel_operator.h"

namespace {

constexpr int32_t kBufferNum = 2;          // double buffering
constexpr uint32_t kMaxDim = 8192;         // covers every norm in V4.1 (max 5120)
constexpr uint32_t kBf16PerBlock = 16;     // 32-byte UB block / sizeof(bf16)
constexpr uint32_t kF32PerBlock = 8;       // 32-byte UB block / sizeof(float)
// ReduceSum work space: one fp32 per 64-element repeat, rounded up to a
// 32-byte block (documented formula); 8192 / 64 = 128 floats, doubled.
constexpr uint32_t kReduceWorkFloats = 256;
// Statistics tensor: three 32-byte slots of fp32 (sum / inv_rms, dim, 1.0).
constexpr uint32_t kStatSum = 0;
constexpr uint32_t kStatDim = kF32PerBlock;
constexpr uint32_t kStatOne = 2 * kF32PerBlock;
constexpr uint32_t kStatFloats = 3 * kF32PerBlock;

class RmsNormBf16 {
public:
    __aicore__ inline RmsNormBf16() {}

    __aicore__ inline void Init(GM_ADDR x, GM_ADDR weight, GM_ADDR out, uint64_t rows, uint32_t dim, float eps)
    {
        dim_ = dim;
        eps_ = eps;
        const uint64_t blocks = static_cast<uint64_t>(AscendC::GetBlockNum());
        const uint64_t idx = static_cast<uint64_t>(AscendC::GetBlockIdx());
        const uint64_t base = rows / blocks;
        const uint64_t extra = rows % blocks;
        const uint64_t rowBegin = idx * base + (idx < extra ? idx : extra);
        rowCount_ = base + (idx < extra ? 1 : 0);

        xGm_.SetGlobalBuffer(reinterpret_cast<__gm__ bfloat16_t *>(x) + rowBegin * dim, rowCount_ * dim);
        outGm_.SetGlobalBuffer(reinterpret_cast<__gm__ bfloat16_t *>(out) + rowBegin * dim, rowCount_ * dim);
        wGm_.SetGlobalBuffer(reinterpret_cast<__gm__ bfloat16_t *>(weight), dim);

        const uint32_t padded = (dim + kBf16PerBlock - 1) / kBf16PerBlock * kBf16PerBlock;
        pipe_.InitBuffer(inQueue_, kBufferNum, padded * sizeof(bfloat16_t));
        pipe_.InitBuffer(outQueue_, kBufferNum, padded * sizeof(bfloat16_t));
        pipe_.InitBuffer(xBuf_, padded * sizeof(float));
        pipe_.InitBuffer(wBuf_, padded * sizeof(float));
        pipe_.InitBuffer(workBuf_, kReduceWorkFloats * sizeof(float));
        pipe_.InitBuffer(statBuf_, kStatFloats * sizeof(float));
    }

    __aicore__ inline void Process()
    {
        if (rowCount_ == 0) {
            return;
        }
        Prepare();
        CopyIn(0);
        for (uint64_t r = 0; r < rowCount_; ++r) {
            Compute(r);
            CopyOut(r);
        }
    }

private:
    template <AscendC::HardEvent kEvent>
    __aicore__ inline void Sync()
    {
        const auto id = pipe_.FetchEventID(kEvent);
        AscendC::SetFlag<kEvent>(id);
        AscendC::WaitFlag<kEvent>(id);
    }

    __aicore__ inline AscendC::DataCopyExtParams RowCopy() const
    {
        AscendC::DataCopyExtParams p;
        p.blockCount = 1;
        p.blockLen = dim_ * static_cast<uint32_t>(sizeof(bfloat16_t));  // bytes
        p.srcStride = 0;
        p.dstStride = 0;
        p.rsv = 0;
        return p;
    }

    // Weight -> fp32 once per core (through the input queue), and the
    // constants dim and 1.0 used when forming 1 / sqrt(mean + eps).
    __aicore__ inline void Prepare()
    {
        AscendC::LocalTensor<bfloat16_t> wb = inQueue_.AllocTensor<bfloat16_t>();
        AscendC::DataCopyPadExtParams<bfloat16_t> pad;  // isPad = false
        AscendC::DataCopyPad(wb, wGm_, RowCopy(), pad);
        inQueue_.EnQue(wb);
        wb = inQueue_.DeQue<bfloat16_t>();
        AscendC::LocalTensor<float> wf = wBuf_.Get<float>();
        AscendC::Cast(wf, wb, AscendC::RoundMode::CAST_NONE, dim_);  // exact
        AscendC::LocalTensor<float> stat = statBuf_.Get<float>();
        AscendC::Duplicate(stat[kStatDim], static_cast<float>(dim_), kF32PerBlock);  // exact: dim < 2^24
        AscendC::Duplicate(stat[kStatOne], 1.0f, kF32PerBlock);
        AscendC::PipeBarrier<PIPE_V>();
        inQueue_.FreeTensor(wb);
    }

    __aicore__ inline void CopyIn(uint64_t r)
    {
        AscendC::LocalTensor<bfloat16_t> xb = inQueue_.AllocTensor<bfloat16_t>();
        AscendC::DataCopyPadExtParams<bfloat16_t> pad;  // isPad = false
        AscendC::DataCopyPad(xb, xGm_[r * dim_], RowCopy(), pad);
        inQueue_.EnQue(xb);
    }

    __aicore__ inline void Compute(uint64_t r)
    {
        AscendC::LocalTensor<bfloat16_t> xb = inQueue_.DeQue<bfloat16_t>();
        if (r + 1 < rowCount_) {
            CopyIn(r + 1);  // prefetch: overlaps this row's vector work
        }
        AscendC::LocalTensor<float> xf = xBuf_.Get<float>();
        AscendC::LocalTensor<float> wf = wBuf_.Get<float>();
        AscendC::LocalTensor<float> work = workBuf_.Get<float>();
        AscendC::LocalTensor<float> stat = statBuf_.Get<float>();
        AscendC::LocalTensor<float> sum = stat[kStatSum];

        // Sum of squares in fp32.
        AscendC::Cast(xf, xb, AscendC::RoundMode::CAST_NONE, dim_);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Mul(xf, xf, xf, dim_);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::ReduceSum(sum, xf, work, dim_);
        AscendC::PipeBarrier<PIPE_V>();
        // inv_rms = 1 / sqrt(sum / dim + eps), element 0 of `sum`.
        AscendC::Div(sum, sum, stat[kStatDim], 1);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Adds(sum, sum, eps_, 1);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Sqrt(sum, sum, 1);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Div(sum, stat[kStatOne], sum, 1);
        Sync<AscendC::HardEvent::V_S>();  // the scalar unit reads the vector result
        const float invRms = sum.GetValue(0);

        // y = x * inv_rms, then w * y, then round to bf16 (nearest even).
        AscendC::Cast(xf, xb, AscendC::RoundMode::CAST_NONE, dim_);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Muls(xf, xf, invRms, dim_);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Mul(xf, wf, xf, dim_);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::LocalTensor<bfloat16_t> ob = outQueue_.AllocTensor<bfloat16_t>();
        AscendC::Cast(ob, xf, AscendC::RoundMode::CAST_RINT, dim_);
        outQueue_.EnQue(ob);
        inQueue_.FreeTensor(xb);
    }

    __aicore__ inline void CopyOut(uint64_t r)
    {
        AscendC::LocalTensor<bfloat16_t> ob = outQueue_.DeQue<bfloat16_t>();
        AscendC::DataCopyPad(outGm_[r * dim_], ob, RowCopy());
        outQueue_.FreeTensor(ob);
    }

    AscendC::TPipe pipe_;
    AscendC::TQue<AscendC::TPosition::VECIN, kBufferNum> inQueue_;
    AscendC::TQue<AscendC::TPosition::VECOUT, kBufferNum> outQueue_;
    AscendC::TBuf<AscendC::TPosition::VECCALC> xBuf_;
    AscendC::TBuf<AscendC::TPosition::VECCALC> wBuf_;
    AscendC::TBuf<AscendC::TPosition::VECCALC> workBuf_;
    AscendC::TBuf<AscendC::TPosition::VECCALC> statBuf_;
    AscendC::GlobalTensor<bfloat16_t> xGm_;
    AscendC::GlobalTensor<bfloat16_t> wGm_;
    AscendC::GlobalTensor<bfloat16_t> outGm_;
    uint64_t rowCount_ = 0;
    uint32_t dim_ = 0;
    float eps_ = 0.0f;
};

}  // namespace

extern "C" __global__ __aicore__ void rms_norm_bf16(GM_ADDR x, GM_ADDR weight, GM_ADDR out, uint64_t rows,
                                                    uint64_t dim, float eps)
{
#if defined(KERNEL_TASK_TYPE_DEFAULT)
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);  // vector cores only
#endif
    if (dim == 0 || dim > kMaxDim || rows == 0) {
        return;
    }
    RmsNormBf16 op;
    op.Init(x, weight, out, rows, static_cast<uint32_t>(dim), eps);
    op.Process();
}
