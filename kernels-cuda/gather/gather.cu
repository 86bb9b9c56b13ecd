// Row copies (ops::gather_rows and ops::copy_rows_into: the expert-parallel
// dispatch and combine). Layout: src [*, row_bytes] and out [*, row_bytes]
// bytes of any dtype; src_idx and dst_idx [n] int32 or null (null: the
// identity, row i). out[dst_idx[i]] = src[src_idx[i]] for i in [0, n); the
// host checked every index against its tensor's rows and that the dst_idx
// rows are distinct, so no two CTAs write one row. One CTA per copied row
// (grid-stride over rows), threads over the row in 16-byte words when
// row_bytes is a multiple of 16 (allocations are 256-byte aligned and
// tensors have no offsets), else in bytes.
#include <cstdint>
#include "deepinfer/params.h"

extern "C" __global__ void copy_rows(const __grid_constant__ di_gather_params p) {
    const bool words = p.row_bytes % 16 == 0;
    for (int64_t i = blockIdx.x; i < p.n; i += gridDim.x) {
        const int64_t s = p.src_idx ? int64_t(p.src_idx[i]) : i;
        const int64_t d = p.dst_idx ? int64_t(p.dst_idx[i]) : i;
        const char *src = static_cast<const char *>(p.src) + s * p.row_bytes;
        char *out = static_cast<char *>(p.out) + d * p.row_bytes;
        if (words) {
            const uint4 *sw = reinterpret_cast<const uint4 *>(src);
            uint4 *ow = reinterpret_cast<uint4 *>(out);
            for (int64_t e = threadIdx.x; e < p.row_bytes / 16; e += blockDim.x) ow[e] = sw[e];
        } else {
            for (int64_t e = threadIdx.x; e < p.row_bytes; e += blockDim.x) out[e] = src[e];
        }
    }
}
