//! How often the exact re-encoding of `kernels-cuda/gemm/README.md` (option
//! 3; issue 13) applies to MXFP8 operands: a 128-deep K block whose four
//! 32-deep blocks carry E8M0 scales 2^e0 … 2^e3 can run with one promotion
//! per 128 (DeepGEMM's rate) when every e4m3 code v of block g, shifted to
//! the block's largest exponent E, is still an e4m3 value: v · 2^(e_g − E)
//! exact. Shifting down only (up could pass 448); a shift is exact while the
//! value stays normal or its low mantissa bits are zero.
//! The library's `numerics::share_mx_scales` makes the rewrite; this bench
//! counts where it applies.
//!
//! Operands, quantised by the library's own quantiser
//! ([`numerics::act_quant_block`]): activations 1 × 32 per row (Gaussian,
//! Student-t with 3 degrees of freedom, and per-channel log-normal scales
//! with 1 % outlier channels × 20, the shape of LLM activations), and
//! weights with one scale per 32 × 32 block (Gaussian, σ 0.02). Per operand:
//! the share of 128-blocks (row × K block) whose four scales are equal, the
//! share that qualifies, and the spread E − min e. For a GEMM the kernel
//! needs both operands' blocks to qualify: the joint share over every
//! (activation row, weight row) pair of a 256 × 256 tile and every K block.
//!
//! A chained wgmma covers 64 rows of A (a consumer warpgroup) and the tile's
//! 128 rows of B at once, so a kernel can skip promotions for a K block only
//! when every one of those rows qualifies: the per-group shares (64
//! activation rows, 128 weight rows) are printed for blocks of 128 (one
//! promotion per 128) and of 64 (a pair of 32-blocks, one per 64).
//!
//! Writes `DEEPINFER_BENCH_OUT` (the CPU bench JSON) when set; prints a
//! table either way.

#[path = "common/cpu_doc.rs"]
mod cpu_doc;

use deepinfer::numerics::{act_quant_block, e8m0_to_f32, share_mx_scales};
use deepinfer::{E4M3, E8M0};
use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

const K: usize = 4096;
const ROWS: usize = 256;
const BLOCK: usize = 32;
const WIDE: usize = 128;

/// A standard normal draw (Box–Muller).
fn normal(rng: &mut StdRng) -> f64 {
    let u: f64 = rng.random_range(f64::EPSILON..1.0);
    let v: f64 = rng.random();
    (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
}

/// Quantised operand: e4m3 codes `[rows, K]`, its E8M0 scales (one per
/// `rps` rows and 32 of K, the layout `share_mx_scales` takes) and the
/// exponent of each code's 32-deep block (`exps[row][kb]`).
struct Operand {
    codes: Vec<E4M3>,
    scales: Vec<E8M0>,
    rps: usize,
    exps: Vec<Vec<i32>>,
}

/// The E8M0 exponent of a scale byte.
fn exponent(scale: E8M0) -> i32 {
    e8m0_to_f32(scale).log2().round() as i32
}

/// 1 × 32 blocks per row.
fn activations(x: &[f32]) -> Operand {
    let mut codes = vec![E4M3(0); ROWS * K];
    let mut scales = vec![E8M0(0); ROWS * (K / BLOCK)];
    let mut exps = vec![vec![0; K / BLOCK]; ROWS];
    for (r, row_exps) in exps.iter_mut().enumerate() {
        for (kb, e) in row_exps.iter_mut().enumerate() {
            let at = r * K + kb * BLOCK;
            let block: Vec<bf16> = x[at..at + BLOCK]
                .iter()
                .map(|&v| bf16::from_f32(v))
                .collect();
            let s = act_quant_block(&block, &mut codes[at..at + BLOCK]);
            scales[r * (K / BLOCK) + kb] = s;
            *e = exponent(s);
        }
    }
    Operand {
        codes,
        scales,
        rps: 1,
        exps,
    }
}

/// One scale per 32 × 32 block (rows × K).
fn weights(x: &[f32]) -> Operand {
    let mut codes = vec![E4M3(0); ROWS * K];
    let mut scales = vec![E8M0(0); (ROWS / BLOCK) * (K / BLOCK)];
    let mut exps = vec![vec![0; K / BLOCK]; ROWS];
    let mut block = vec![bf16::ZERO; BLOCK * BLOCK];
    let mut q = vec![E4M3(0); BLOCK * BLOCK];
    for rb in 0..ROWS / BLOCK {
        for kb in 0..K / BLOCK {
            for i in 0..BLOCK {
                let at = (rb * BLOCK + i) * K + kb * BLOCK;
                for (o, &v) in block[i * BLOCK..(i + 1) * BLOCK]
                    .iter_mut()
                    .zip(&x[at..at + BLOCK])
                {
                    *o = bf16::from_f32(v);
                }
            }
            let s = act_quant_block(&block, &mut q);
            scales[rb * (K / BLOCK) + kb] = s;
            let e = exponent(s);
            for i in 0..BLOCK {
                let r = rb * BLOCK + i;
                codes[r * K + kb * BLOCK..r * K + (kb + 1) * BLOCK]
                    .copy_from_slice(&q[i * BLOCK..(i + 1) * BLOCK]);
                exps[r][kb] = e;
            }
        }
    }
    Operand {
        codes,
        scales,
        rps: BLOCK,
        exps,
    }
}

/// Which `wide`-deep blocks of each row share one scale once
/// `numerics::share_mx_scales` has rewritten a copy of the operand (the
/// blocks whose codes all survive the shift to the block's largest
/// exponent): `[ROWS][K / wide]`.
fn shared(op: &Operand, wide: usize) -> Vec<Vec<bool>> {
    let (mut codes, mut scales) = (op.codes.clone(), op.scales.clone());
    share_mx_scales(&mut codes, &mut scales, ROWS, K, op.rps, wide)
        .expect("the bench's shapes are valid");
    let kb = K / BLOCK;
    let per = wide / BLOCK;
    (0..ROWS)
        .map(|r| {
            let row = &scales[(r / op.rps) * kb..(r / op.rps + 1) * kb];
            row.chunks(per)
                .map(|run| run.iter().all(|s| *s == run[0]))
                .collect()
        })
        .collect()
}

/// Per-operand figures: (share with four equal scales, share qualifying,
/// histogram of the spread 0, 1, 2, ≥ 3) and the qualifying table.
fn survey(op: &Operand) -> (f64, f64, [f64; 4], Vec<Vec<bool>>) {
    let per = WIDE / BLOCK;
    let blocks = K / WIDE;
    let (mut equal, mut ok, mut spread) = (0usize, 0usize, [0usize; 4]);
    let table = shared(op, WIDE);
    for (r, row) in table.iter().enumerate() {
        for (wb, &cell) in row.iter().enumerate() {
            let e = &op.exps[r][wb * per..(wb + 1) * per];
            let (lo, hi) = (
                e.iter().copied().min().unwrap_or(0),
                e.iter().copied().max().unwrap_or(0),
            );
            equal += usize::from(lo == hi);
            spread[((hi - lo) as usize).min(3)] += 1;
            ok += usize::from(cell);
        }
    }
    let n = (ROWS * blocks) as f64;
    (
        equal as f64 / n,
        ok as f64 / n,
        spread.map(|s| s as f64 / n),
        table,
    )
}

fn main() {
    let mut rng = StdRng::seed_from_u64(13);
    let gauss: Vec<f32> = (0..ROWS * K).map(|_| normal(&mut rng) as f32).collect();
    let student: Vec<f32> = (0..ROWS * K)
        .map(|_| {
            let chi2: f64 = (0..3).map(|_| normal(&mut rng).powi(2)).sum();
            (normal(&mut rng) / (chi2 / 3.0).sqrt()) as f32
        })
        .collect();
    let channel: Vec<f64> = (0..K)
        .map(|_| {
            let s = normal(&mut rng).exp();
            if rng.random_range(0.0..1.0) < 0.01 {
                20.0 * s
            } else {
                s
            }
        })
        .collect();
    let outliers: Vec<f32> = (0..ROWS * K)
        .map(|i| (normal(&mut rng) * channel[i % K]) as f32)
        .collect();
    let w: Vec<f32> = (0..ROWS * K)
        .map(|_| (0.02 * normal(&mut rng)) as f32)
        .collect();

    let operands = [
        ("activations_gaussian", activations(&gauss)),
        ("activations_student_t3", activations(&student)),
        ("activations_outlier_channels", activations(&outliers)),
        ("weights_gaussian_32x32", weights(&w)),
    ];
    let surveys: Vec<_> = operands.iter().map(|(_, op)| survey(op)).collect();
    println!("operand                          equal scales  qualifies   spread 0 / 1 / 2 / >=3");
    let mut records = Vec::new();
    for ((name, _), (equal, ok, spread, _)) in operands.iter().zip(&surveys) {
        println!(
            "{name:32} {:>11.1}% {:>9.1}%   {:.3} / {:.3} / {:.3} / {:.3}",
            100.0 * equal,
            100.0 * ok,
            spread[0],
            spread[1],
            spread[2],
            spread[3]
        );
        records.push(json!({
            "operand": name, "equal_scales": equal, "qualifies": ok,
            "spread": {"0": spread[0], "1": spread[1], "2": spread[2], "3+": spread[3]},
        }));
    }
    // A GEMM tile: activation row i × weight row j, K block b, both qualify.
    let wt = &surveys[3].3;
    let mut joint = Vec::new();
    for (name, (_, _, _, at)) in operands.iter().map(|(n, _)| n).zip(&surveys).take(3) {
        let mut both = 0usize;
        for a in at {
            for w in wt {
                both += a.iter().zip(w).filter(|(x, y)| **x && **y).count();
            }
        }
        let share = both as f64 / (ROWS * ROWS * (K / WIDE)) as f64;
        println!("joint with the weights: {name:32} {:>6.1}%", 100.0 * share);
        joint.push(
            json!({"activations": name, "weights": "weights_gaussian_32x32", "qualifies": share}),
        );
    }
    // Per group of rows (a warpgroup's 64 activation rows, a tile's 128
    // weight rows): the share of (group, K block) where every row qualifies.
    let mut groups = Vec::new();
    println!("every row of a group qualifies   rows   per 64-deep   per 128-deep");
    for (name, op) in &operands {
        let rows = if name.starts_with("weights") { 128 } else { 64 };
        let mut shares = Vec::new();
        for wide in [64, 128] {
            let blocks = K / wide;
            let table = shared(op, wide);
            let mut pass = 0usize;
            for group in table.chunks(rows) {
                pass += (0..blocks)
                    .filter(|&wb| group.iter().all(|row| row[wb]))
                    .count();
            }
            shares.push(pass as f64 / ((ROWS / rows) * blocks) as f64);
        }
        println!(
            "{name:32} {rows:>5} {:>12.1}% {:>13.1}%",
            100.0 * shares[0],
            100.0 * shares[1]
        );
        groups.push(
            json!({"operand": name, "rows": rows, "per_64": shares[0], "per_128": shares[1]}),
        );
    }
    if let Some(out) = std::env::var_os("DEEPINFER_BENCH_OUT") {
        cpu_doc::write(
            &out,
            json!({
                "bench": "mx_reencode_cpu",
                "what": "share of 128-deep K blocks of MXFP8 operands whose four E8M0-scaled 32-blocks re-encode exactly to one shared exponent (kernels-cuda/gemm/README.md option 3)",
                "shape": {"rows": ROWS, "k": K, "block": BLOCK, "wide_block": WIDE},
                "operands": records,
                "gemm_joint": joint,
                "group_qualifies": groups,
            }),
        );
    }
}
