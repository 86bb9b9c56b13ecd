// Row gather (ops::gather_rows: the expert-parallel dispatch and combine).
// Layout: src [rows, row_bytes] bytes of any dtype, idx [n] int32 (each in
// [0, rows): the host checked them), out [n, row_bytes]; out[i] = src[idx[i]].
// One CTA per output row (grid-stride over rows), threads over the row in
// 16-byte words when row_bytes is a multiple of 16 (allocations are 256-byte
// aligned and tensors have no offsets), else in bytes.
#include <cstdint>
#include "deepinfer/params.h"

extern "C" __global__ void gather_rows(const __grid_constant__ di_gather_params p) {
    const bool words = p.row_bytes % 16 == 0;
    for (int64_t i = blockIdx.x; i < p.n; i += gridDim.x) {
        const char *src = static_cast<const char *>(p.src) + int64_t(p.idx[i]) * p.row_bytes;
        char *out = static_cast<char *>(p.out) + i * p.row_bytes;
        if (words) {
            const uint4 *s = reinterpret_cast<const uint4 *>(src);
            uint4 *o = reinterpret_cast<uint4 *>(out);
            for (int64_t e = threadIdx.x; e < p.row_bytes / 16; e += blockDim.x) o[e] = s[e];
        } else {
            for (int64_t e = threadIdx.x; e < p.row_bytes; e += blockDim.x) out[e] = src[e];
        }
    }
}
