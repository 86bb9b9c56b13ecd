//! Launch of the TileLang-generated fused SwiGLU + FP8 1×32 quantiser
//! (`tilelang/swiglu_act_quant_fp8.py`, generated into
//! `tilelang/generated/swiglu_act_quant_fp8.sm_*.cu`). Like the launchers in
//! `tilelang.rs`, it passes raw device addresses and scalars in the order
//! TileLang emits (its parameters sorted: buffers by name, then scalars by
//! name), not the program's order. The kernel is persistent: the grid is the
//! CTAs resident on the device at once (each loads the σ table into shared
//! memory once), never more than the 64-group tiles.

use super::{i32_param, u32_param};
use super::{launch_raw, read_ptr, resident_ctas, write_ptr};
use crate::device::CudaDevice;
use crate::error::{Error, Result};
use crate::kernels;
use crate::numerics::{SIGMOID_TABLE_HALF, sigmoid, sigmoid_bf16_table};
use crate::tensor::Tensor;
use cudarc::driver::LaunchConfig;

/// Threads per CTA (`THREADS` in `tilelang/swiglu_act_quant_fp8.py`).
const THREADS: u32 = 256;
/// 32-groups per tile (`GROUPS_PER_TILE`: 4 lanes per group, one slot).
const GROUPS_PER_TILE: usize = 64;
/// Dynamic shared memory: the σ table (`TABLE_BYTES`), which the kernel
/// copies whole from the uploaded `numerics::sigmoid_bf16_table`.
const TABLE_BYTES: u32 = 32_784;
const _: () = assert!(TABLE_BYTES as usize == 2 * SIGMOID_TABLE_HALF * size_of::<f32>());

/// `(magic, shift)` with `n / d == (n · magic) >> shift` for every
/// `n < 2^31` (the kernel's group index), `d ≥ 1`: the round-up method with
/// a 31-bit dividend, `magic = ⌈2^(31+l) / d⌉` and `l = ⌈log2 d⌉`, so that
/// `magic ≤ 2^32 − 1` for d ≥ 2 (2^31 for d = 1) and `shift = 31 + l ≤ 62`.
fn row_divider(d: u32) -> (u32, u32) {
    let l = d.next_power_of_two().trailing_zeros();
    let magic = (1u64 << (31 + l)).div_ceil(u64::from(d.max(1)));
    // ⌈2^(31+l) / d⌉ < 2^32 because d > 2^(l−1): the conversion never saturates.
    (u32::try_from(magic).unwrap_or(u32::MAX), 31 + l)
}

/// `deepinfer_swiglu_act_quant_fp8_kernel(const bfloat16_t* gu, fp8_e4_t* q,
/// uchar* scale, const float* sigma, const float* weight, float limit,
/// int n_ctas, int n_groups, int n_rows, uint row_magic, int row_shift,
/// float sigma_limit)` with `gu` `[rows, 2 · inter]` (g's and u's 32-blocks
/// alternating), `n_groups = rows * inter / 32`, `sigma` the
/// `numerics::sigmoid_bf16_table` on the device, `sigma_limit = σ(limit)`
/// and the row divider of `inter / 32` (`row_divider`): 64 groups a tile,
/// 256 threads a CTA, 32,784 bytes of dynamic shared memory. Needs
/// `inter % 32 == 0` (checked by the caller, and again here because a
/// partial group would be read past its row) and `4 · (n_groups + 64) <
/// 2^31` (the kernel's 32-bit group index reaches two grids of tiles past
/// the last one, clamped, in its paired loads).
#[allow(clippy::too_many_arguments)]
pub fn swiglu_act_quant_fp8(
    dev: &CudaDevice,
    gu: &Tensor,
    weight: &Tensor,
    limit: f32,
    q: &mut Tensor,
    scale: &mut Tensor,
    rows: usize,
    inter: usize,
) -> Result<()> {
    const OP: &str = "swiglu_act_quant_fp8 (TileLang)";
    let kernel = kernels::tilelang_swiglu_act_quant_fp8::DEEPINFER_SWIGLU_ACT_QUANT_FP8_KERNEL;
    if inter == 0 || !inter.is_multiple_of(32) {
        return Err(Error::Shape {
            op: OP,
            tensor: "gu",
            got: gu.shape().to_vec(),
            expected: "a last dimension that is a multiple of 32".into(),
        });
    }
    let groups = rows.checked_mul(inter / 32);
    let fits = |n: usize| {
        n.checked_add(GROUPS_PER_TILE)
            .and_then(|m| m.checked_mul(4))
            .is_some_and(|m| i32::try_from(m).is_ok())
    };
    let (Some(groups), Ok(n_rows), Ok(n_blocks)) = (
        groups.filter(|&n| fits(n)),
        i32::try_from(rows),
        u32::try_from(inter / 32),
    ) else {
        return Err(Error::Argument {
            op: OP,
            arg: "rows * inter / 32",
            value: format!("{rows} * {inter} / 32"),
            why: "the generated kernel indexes 32-groups (up to 4 x (groups + 64)) with a 32-bit int",
        });
    };
    if rows == 0 {
        return Ok(());
    }
    let n_groups = i32_param("groups", groups)?;
    let (row_magic, row_shift) = row_divider(n_blocks);
    let row_shift = i32_param("row shift", row_shift as usize)?;
    let sigma_limit = sigmoid(limit);
    // Uploaded once per device (a step captured as a CUDA graph reads the
    // copy an earlier step made).
    let table = dev.constant_named("numerics::sigmoid_bf16_table", || {
        sigmoid_bf16_table()
            .iter()
            .flat_map(|s| s.to_le_bytes())
            .collect()
    })?;
    let tiles = groups.div_ceil(GROUPS_PER_TILE);
    let ctas = resident_ctas(dev, kernel, THREADS, TABLE_BYTES)?.min(tiles);
    let n_ctas = i32_param("ctas", ctas)?;
    let (tp, _gt) = read_ptr(&table, dev);
    let (gp, _gg) = read_ptr(gu.cuda()?, dev);
    let (wp, _gw) = read_ptr(weight.cuda()?, dev);
    let (qp, _gq) = write_ptr(q.cuda_mut()?, dev);
    let (sp, _gs) = write_ptr(scale.cuda_mut()?, dev);
    let (gu, q, scale, sigma, weight) = (gp as u64, qp as u64, sp as u64, tp as u64, wp as u64);
    let cfg = LaunchConfig {
        grid_dim: (u32_param("grid", ctas)?, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: TABLE_BYTES,
    };
    // SAFETY: the argument list matches the generated signature above in
    // order and size (five 8-byte device addresses, one float, three ints,
    // one unsigned, one int, one float). The addresses come from whole
    // allocations (256-byte aligned, so the kernel's 16-byte loads of gu and
    // 8-byte stores of q are aligned: a group is 128 and 32 bytes) of
    // rows*inter*4 (gu), rows*4 (weight), rows*inter (q), rows*inter/32
    // (scale) and 32,784 (sigma, the whole table the kernel copies) bytes, as
    // the caller validated (gu is [rows, 2 inter], weight is [rows]); their
    // guards live until after the launch, gu, weight and sigma are only read
    // and q, scale are distinct buffers (&mut). The grid is at most the
    // ceil(n_groups / 64) tiles: CTA b writes tiles b, b + n_ctas, ..., so
    // every group below n_groups is written exactly once and the ones past
    // it are masked; every load takes its group clamped to n_groups − 1, and
    // the weight index (group · magic) >> shift is group / (inter / 32)
    // exactly (row_divider), below n_rows. 4 · (n_groups + 64) fits in an
    // int, so no group index overflows (a CTA's tiles, pairs included, stay
    // below bx + 2 · ceil(iters / 2) · n_ctas < tiles + 2 · n_ctas ≤
    // 3 · tiles). 32,784 bytes of dynamic shared memory need no opt-in.
    unsafe {
        launch_raw(
            dev,
            kernel,
            cfg,
            &[
                gu.into(),
                q.into(),
                scale.into(),
                sigma.into(),
                weight.into(),
                limit.into(),
                n_ctas.into(),
                n_groups.into(),
                n_rows.into(),
                row_magic.into(),
                row_shift.into(),
                sigma_limit.into(),
            ],
        )
    }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::row_divider;

    /// The divider is exact on the edges of every quotient for the model's
    /// and other block counts, up to the largest 31-bit group index.
    #[test]
    fn row_divider_is_exact_below_2_pow_31() {
        let max = (1u64 << 31) - 1;
        for d in (1u32..=300).chain([384, 511, 512, 513, 1000, 4095, 65_535, 1 << 20, 1 << 30]) {
            let (magic, shift) = row_divider(d);
            let div = |n: u64| (n * u64::from(magic)) >> shift;
            let d64 = u64::from(d);
            let mut n = 0u64;
            while n <= max {
                for m in [n.saturating_sub(1), n, n + 1] {
                    if m <= max {
                        assert_eq!(div(m), m / d64, "d {d} n {m}");
                    }
                }
                // Step through the multiples of d, denser where quotients are small.
                n += d64 * (1 + n / (d64 * 4096)).max(1);
            }
            for m in [max - 1, max] {
                assert_eq!(div(m), m / d64, "d {d} n {m}");
            }
        }
    }
}
