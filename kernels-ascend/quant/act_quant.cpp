// FP8 1x32 activation quantisation with E8M0 scales (v41-flash.md §10.1).
// For every block of 32 consecutive values along k:
//
//     amax = max(max_j |x_j|, fp32(1e-4))            (NaN ignored, as fmaxf)
//     e    = ceil(log2(fp32(amax * fp32(1/448))))   on the fp32 bit pattern:
//            exponent - 127, plus 1 if the mantissa is nonzero; e in [-127, 127]
//     scale byte (E8M0) = e + 127
//     q_j  = e4m3(x_j * 2^-e)   saturating to +-448, nearest even, NaN -> 0x7F
//
// STATUS: UNVERIFIED. Written against the AscendC documentation only; it has
// never been compiled or run (no CANN toolchain, no Ascend device). See
// kernels-ascend/README.md, section "Unverified".
//
// Entry point (extern "C", so the symbol is exactly `act_quant_fp8`):
//
//     act_quant_fp8(GM_ADDR x, GM_ADDR q, GM_ADDR scale, uint64_t rows, uint64_t k)
//
//   x      bf16 [rows, k], dense row-major (read as raw 16-bit patterns)
//   q      e4m3 [rows, k], one byte per value (OCP "fn" encoding, as torch
//          float8_e4m3fn / safetensors F8_E4M3)
//   scale  E8M0 [rows, k / 32], one byte per block, row-major
//   rows   number of rows (0 is a no-op)
//   k      row length; must be a positive multiple of 32 (the kernel returns
//          without writing anything otherwise; the host wrapper must check,
//          and send other shapes to the CPU path)
//
// Scalars are passed by value (no tiling struct); all five arguments are
// 8 bytes wide, so the argument block has no padding.
//
// Work split: each row is cut into tiles of at most kTileCols (4096) columns;
// the rows * ceil(k / 4096) tiles are numbered row-major and split into
// contiguous balanced ranges by AscendC::GetBlockIdx() (as in rms_norm.cpp).
// Launch AIV-only with any block count >= 1, e.g. min(tiles, vector cores).
//
// Per core, one tile at a time, double-buffered (TQue depth 2 for the input,
// the codes and the scales): tile i+1 is copied in (MTE2) while tile i is
// encoded, and tile i's results are copied out (MTE3) while tile i+1 is
// encoded.
//
// HOW THE E4M3 ROUNDING IS DONE, AND WHAT IS ASSUMED
// ---------------------------------------------------
// Default path (DEEPINFER_ASCEND_FP8_NATIVE undefined or 0): integer only, on
// the scalar unit. The block maximum, the E8M0 exponent and every e4m3 code
// are computed from the bf16 bit patterns by the helpers in
// include/deepinfer_ascend/fp8_numerics.h, which use no floating point at all
// (the fp32 product amax * fp32(1/448) is reproduced exactly with a 32-bit
// integer multiply and round-to-nearest-even). Those helpers are checked
// exhaustively on the host against the CPU reference semantics
// (host_check/fp8_numerics_check.cc: every bf16 x every e, all checks pass),
// so this path is bit-exact by construction. It is also slow: about 20-30
// scalar instructions per element. It exists because the AscendC
// documentation we could read does not state the NaN, subnormal and
// saturation behaviour of a float -> fp8 conversion precisely enough for a
// bit-exact port.
//
// Optional path (-DDEEPINFER_ASCEND_FP8_NATIVE=1, Ascend 950 / dav-3510
// only): the encoding runs on the vector unit. What is confirmed: AscendC has
// the types fp8_e4m3fn_t / fp8_e8m0_t on "Ascend 950PR/Ascend 950DT", and the
// dav_3510 implementation of the level-2 Cast lists the pair
// (fp8_e4m3fn_t <- float) for RoundMode::CAST_RINT with a saturating cast
// trait (SDK header impl/basic_api/dav_3510/kernel_operator_vec_vconv_impl.h).
// What is assumed and must be checked against the default path on hardware
// before it is enabled: CAST_RINT is round-to-nearest-even onto the e4m3
// grid including e4m3 subnormals; saturation goes to +-448 (we clamp to
// +-448 first anyway, as the reference does); -0 and negative values that
// round to zero keep the sign (0x80). Known difference: a NaN input gives
// whatever Mins/Maxs and the cast produce (the documented fp8_e5m2 cast
// returns 0 for NaN), not 0x7F. The amax/exponent part stays integer-only.
#include "kernel_operator.h"
#include "deepinfer_ascend/fp8_numerics.h"

#ifndef DEEPINFER_ASCEND_FP8_NATIVE
#define DEEPINFER_ASCEND_FP8_NATIVE 0
#endif

namespace {

namespace dn = deepinfer_ascend;

constexpr int32_t kBufferNum = 2;                      // double buffering
constexpr uint32_t kBlock = 32;                        // values per scale
constexpr uint32_t kTileCols = 4096;                   // columns per tile, multiple of kBlock
constexpr uint32_t kTileBlocks = kTileCols / kBlock;   // 128 scales per tile (128 B)

struct Tile {
    uint64_t xOffset;  // element offset of the tile in x and q
    uint64_t sOffset;  // element offset of its first scale
    uint32_t cols;     // multiple of kBlock, <= kTileCols
};

#if DEEPINFER_ASCEND_FP8_NATIVE
__aicore__ inline float F32FromBits(uint32_t bits)
{
    union {
        uint32_t u;
        float f;
    } v;
    v.u = bits;
    return v.f;
}
#endif

class ActQuantFp8 {
public:
    __aicore__ inline ActQuantFp8() {}

    __aicore__ inline void Init(GM_ADDR x, GM_ADDR q, GM_ADDR scale, uint64_t rows, uint64_t k)
    {
        k_ = k;
        tilesPerRow_ = (k + kTileCols - 1) / kTileCols;
        const uint64_t tiles = rows * tilesPerRow_;
        const uint64_t blocks = static_cast<uint64_t>(AscendC::GetBlockNum());
        const uint64_t idx = static_cast<uint64_t>(AscendC::GetBlockIdx());
        const uint64_t base = tiles / blocks;
        const uint64_t extra = tiles % blocks;
        tileBegin_ = idx * base + (idx < extra ? idx : extra);
        tileCount_ = base + (idx < extra ? 1 : 0);

        xGm_.SetGlobalBuffer(reinterpret_cast<__gm__ uint16_t *>(x), rows * k);
        qGm_.SetGlobalBuffer(reinterpret_cast<__gm__ uint8_t *>(q), rows * k);
        sGm_.SetGlobalBuffer(reinterpret_cast<__gm__ uint8_t *>(scale), rows * (k / kBlock));

        pipe_.InitBuffer(inQueue_, kBufferNum, kTileCols * sizeof(uint16_t));  // 8 KiB
        pipe_.InitBuffer(qQueue_, kBufferNum, kTileCols);                      // 4 KiB
        pipe_.InitBuffer(sQueue_, kBufferNum, kTileBlocks);                    // 128 B
#if DEEPINFER_ASCEND_FP8_NATIVE
        pipe_.InitBuffer(f32Buf_, kTileCols * sizeof(float));                  // 16 KiB
#endif
    }

    __aicore__ inline void Process()
    {
        if (tileCount_ == 0) {
            return;
        }
        CopyIn(0);
        for (uint64_t i = 0; i < tileCount_; ++i) {
            Compute(i);  // issues CopyIn(i + 1) once tile i is readable
            CopyOut(i);
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

    __aicore__ inline Tile TileAt(uint64_t i) const
    {
        const uint64_t t = tileBegin_ + i;
        const uint64_t row = t / tilesPerRow_;
        const uint64_t col = (t - row * tilesPerRow_) * kTileCols;
        const uint64_t left = k_ - col;
        Tile tile;
        tile.xOffset = row * k_ + col;
        tile.sOffset = row * (k_ / kBlock) + col / kBlock;
        tile.cols = static_cast<uint32_t>(left < kTileCols ? left : kTileCols);
        return tile;
    }

    __aicore__ static inline AscendC::DataCopyExtParams Bytes(uint32_t n)
    {
        AscendC::DataCopyExtParams p;
        p.blockCount = 1;
        p.blockLen = n;  // bytes; DataCopyPad allows lengths that are not 32-byte multiples
        p.srcStride = 0;
        p.dstStride = 0;
        p.rsv = 0;
        return p;
    }

    __aicore__ inline void CopyIn(uint64_t i)
    {
        const Tile tile = TileAt(i);
        AscendC::LocalTensor<uint16_t> xLocal = inQueue_.AllocTensor<uint16_t>();
        // The buffer was last read by the scalar unit (tile i - 2); the queue
        // only orders it against the vector pipe.
        Sync<AscendC::HardEvent::S_MTE2>();
        AscendC::DataCopyPadExtParams<uint16_t> pad;  // isPad = false
        AscendC::DataCopyPad(xLocal, xGm_[tile.xOffset], Bytes(tile.cols * sizeof(uint16_t)), pad);
        inQueue_.EnQue(xLocal);
    }

    __aicore__ inline void Compute(uint64_t i)
    {
        const Tile tile = TileAt(i);
        const uint32_t nblocks = tile.cols / kBlock;
        AscendC::LocalTensor<uint16_t> xLocal = inQueue_.DeQue<uint16_t>();
        // The scalar unit reads the tile: wait for MTE2 explicitly (DeQue
        // orders MTE2 -> V only). Tile i + 1 is not in flight yet, so this
        // waits for tile i alone; then start the prefetch.
        Sync<AscendC::HardEvent::MTE2_S>();
        if (i + 1 < tileCount_) {
            CopyIn(i + 1);
        }
        AscendC::LocalTensor<uint8_t> qLocal = qQueue_.AllocTensor<uint8_t>();
        AscendC::LocalTensor<uint8_t> sLocal = sQueue_.AllocTensor<uint8_t>();
        // Buffers reused from tile i - 2 must have left through MTE3 before
        // the scalar unit writes them (the queues only order MTE3 -> V).
        Sync<AscendC::HardEvent::MTE3_S>();

#if DEEPINFER_ASCEND_FP8_NATIVE
        AscendC::LocalTensor<float> xf = f32Buf_.Get<float>();
        AscendC::Cast(xf, xLocal.ReinterpretCast<bfloat16_t>(), AscendC::RoundMode::CAST_NONE, tile.cols);
        AscendC::PipeBarrier<PIPE_V>();
#endif
        for (uint32_t b = 0; b < nblocks; ++b) {
            const uint32_t base = b * kBlock;
            uint32_t v[kBlock];
            uint32_t amax = 0;
            for (uint32_t j = 0; j < kBlock; ++j) {
                v[j] = static_cast<uint32_t>(xLocal.GetValue(base + j));
                const uint32_t a = dn::AbsBf16ForMax(v[j]);
                amax = a > amax ? a : amax;
            }
            const int32_t e = dn::E8m0Exponent(amax);
            sLocal.SetValue(b, static_cast<uint8_t>(e + 127));
#if DEEPINFER_ASCEND_FP8_NATIVE
            // x * 2^-e is exact in fp32 (a power-of-two scaling of a normal
            // bf16 value that stays normal for |e| <= 126).
            AscendC::Muls(xf[base], xf[base], F32FromBits(dn::Exp2NegF32Bits(e)), static_cast<int32_t>(kBlock));
#else
            for (uint32_t j = 0; j < kBlock; ++j) {
                qLocal.SetValue(base + j, static_cast<uint8_t>(dn::E4m3FromBf16Scaled(v[j], e)));
            }
#endif
        }
#if DEEPINFER_ASCEND_FP8_NATIVE
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Mins(xf, xf, 448.0f, tile.cols);  // the clamp precedes the rounding (§10.1)
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Maxs(xf, xf, -448.0f, tile.cols);
        AscendC::PipeBarrier<PIPE_V>();
        AscendC::Cast(qLocal.ReinterpretCast<fp8_e4m3fn_t>(), xf, AscendC::RoundMode::CAST_RINT, tile.cols);
#endif
        // MTE3 reads what the scalar unit wrote (the scales, and the codes on
        // the default path); EnQue orders V -> MTE3 for the native codes.
        Sync<AscendC::HardEvent::S_MTE3>();
        qQueue_.EnQue(qLocal);
        sQueue_.EnQue(sLocal);
        inQueue_.FreeTensor(xLocal);
    }

    __aicore__ inline void CopyOut(uint64_t i)
    {
        const Tile tile = TileAt(i);
        AscendC::LocalTensor<uint8_t> qLocal = qQueue_.DeQue<uint8_t>();
        AscendC::LocalTensor<uint8_t> sLocal = sQueue_.DeQue<uint8_t>();
        AscendC::DataCopyPad(qGm_[tile.xOffset], qLocal, Bytes(tile.cols));
        AscendC::DataCopyPad(sGm_[tile.sOffset], sLocal, Bytes(tile.cols / kBlock));
        qQueue_.FreeTensor(qLocal);
        sQueue_.FreeTensor(sLocal);
    }

    AscendC::TPipe pipe_;
    AscendC::TQue<AscendC::TPosition::VECIN, kBufferNum> inQueue_;
    AscendC::TQue<AscendC::TPosition::VECOUT, kBufferNum> qQueue_;
    AscendC::TQue<AscendC::TPosition::VECOUT, kBufferNum> sQueue_;
#if DEEPINFER_ASCEND_FP8_NATIVE
    AscendC::TBuf<AscendC::TPosition::VECCALC> f32Buf_;
#endif
    AscendC::GlobalTensor<uint16_t> xGm_;
    AscendC::GlobalTensor<uint8_t> qGm_;
    AscendC::GlobalTensor<uint8_t> sGm_;
    uint64_t k_ = 0;
    uint64_t tilesPerRow_ = 1;
    uint64_t tileBegin_ = 0;
    uint64_t tileCount_ = 0;
};

}  // namespace

extern "C" __global__ __aicore__ void act_quant_fp8(GM_ADDR x, GM_ADDR q, GM_ADDR scale, uint64_t rows, uint64_t k)
{
#if defined(KERNEL_TASK_TYPE_DEFAULT)
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);  // vector cores only
#endif
    if (rows == 0 || k == 0 || k % kBlock != 0) {
        return;
    }
    ActQuantFp8 op;
    op.Init(x, q, scale, rows, k);
    op.Process();
}
