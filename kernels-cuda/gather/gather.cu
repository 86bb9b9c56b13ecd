// Row copies (ops::gather_rows, ops::copy_rows_into: the expert-parallel
// dispatch and combine; ops::copy_rows_where: device lists). Layout: src
// [src_rows, row_bytes] and out [dst_rows, row_bytes] bytes of any dtype;
// src_idx and dst_idx [n] int32 or null (null: the identity, row i).
// out[dst_idx[i]] = src[src_idx[i]] for i in [0, n), skipping a pair with
// either row outside its tensor (host lists are checked before, device lists
// use -1 for "no copy"); the dst_idx rows of the pairs copied are distinct
// (the host checks its lists; the device lists' callers promise it), so no
// two CTAs write one row. One CTA per copied row
// (grid-stride over rows), threads over the row in 16-byte words when
// row_bytes is a multiple of 16 (allocations are 256-byte aligned and
// tensors have no offsets), else in bytes. Also paged_rows (ops::paged_rows),
// at the end: logical rows -> physical rows of a paged pool.
#include <cstdint>
#include "deepinfer/pdl.cuh"
#include "deepinfer/params.h"

extern "C" __global__ void copy_rows(const __grid_constant__ di_gather_params p) {
    DI_PDL_ENTRY();
    const bool words = p.row_bytes % 16 == 0;
    for (int64_t i = blockIdx.x; i < p.n; i += gridDim.x) {
        const int64_t s = p.src_idx ? int64_t(p.src_idx[i]) : i;
        const int64_t d = p.dst_idx ? int64_t(p.dst_idx[i]) : i;
        if (s < 0 || s >= p.src_rows || d < 0 || d >= p.dst_rows) continue;
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

// Logical -> physical rows of a paged pool (ops::paged_rows; the rule is
// di_paged_rows_params'): one thread per output element, grid-stride.
// Every read is bounds-checked against the table's shape, so any index
// values give -1 rather than an out-of-range read.
extern "C" __global__ void paged_rows(const __grid_constant__ di_paged_rows_params p) {
    DI_PDL_ENTRY();
    const int64_t total = p.tokens * p.width;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t t = i / p.width;
        const int64_t j = i - t * p.width;
        int64_t r;
        if (p.idx) {
            r = p.idx[i];
        } else {
            // max(0, pos + 1 - width) without overflow at extreme positions.
            const int64_t pos = p.positions[t];
            const int64_t first = pos >= p.width ? pos - p.width + 1 : 0;
            r = (pos >= 0 && first + j <= pos) ? first + j : -1;
        }
        const int32_t e = p.owner[t];
        int32_t v = -1;
        if (r >= 0 && e >= 0 && e < p.entries) {
            const int32_t *b = p.bounds + 3 * int64_t(e);
            if (r >= b[1] && r < b[2]) {
                const int64_t c = r / p.page_rows - b[0];
                if (c >= 0 && c < p.table_pages) {
                    const int64_t page = p.pages[int64_t(e) * p.table_pages + c];
                    const int64_t phys = page * p.page_rows + r % p.page_rows;
                    if (page >= 0 && phys <= INT32_MAX) v = int32_t(phys);
                }
            }
        }
        p.out[i] = v;
    }
}
