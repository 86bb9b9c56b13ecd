/* Kernel parameter structs shared by the CUDA kernels and Rust (bindgen).
 * Kernels take one struct by value as a __grid_constant__ argument, so host
 * and device agree on its layout by construction. Plain C: no C++ types.
 * Pointers are device addresses; every tensor is dense and row-major. */
#ifndef DEEPINFER_PARAMS_H
#define DEEPINFER_PARAMS_H

#include <stdint.h>

/* RMSNorm over rows of `dim` BF16 values:
 * out[r, i] = bf16(weight[i] * (x[r, i] * 1 / sqrt(sum_i x[r, i]^2 / dim + eps))). */
typedef struct di_rms_norm_params {
    const void *x;      /* bf16 [rows, dim] */
    const void *weight; /* bf16 [dim] */
    void *out;          /* bf16 [rows, dim] */
    int64_t rows;
    int32_t dim;
    float eps;
} di_rms_norm_params;

/* FP8 1x32 activation quantisation with E8M0 scales (v41-flash.md 10.1). */
typedef struct di_act_quant_params {
    const void *x;  /* bf16 [rows, k] */
    void *q;        /* e4m3 [rows, k] */
    void *scale;    /* e8m0 [rows, ceil(k / 32)] */
    int64_t rows;
    int32_t k;
} di_act_quant_params;

#endif
