//! GPU benchmark of the GEMM family through the safe op API and the shared
//! harness (`benches/common/gpu_harness.rs`: medians of CUDA-event timings,
//! inputs rotated over ≥ 512 MiB so L2 holds none of them, the copy ceiling,
//! torch peers from `benches/peers/gemm_torch.py`, the shared/gpu.md JSON).
//!
//! - Dense: every V4.1 FP8 projection (`PROJECTIONS`) at M ∈ {1, 8, 32, 64,
//!   128, 512, 4096, 16384} through `ops::mxfp8_linear_into` with
//!   `GemmImpl::Auto` (row `auto`); at M ≤ `SKINNY_MAX_M` also the skinny versions
//!   directly (`cuda_backend::gemm_skinny`, rows `skinny_v1` and
//!   `skinny_v2`), `Large` (whole tiles) at M ≥ 64: at 64 the crossover,
//!   above it the baseline of `auto`, which is the large kernel with the
//!   last wave's tiles split over K (`LargeSplit`; `skinny` at M = 128
//!   records its typed error), and `large_skinny_split` at M ≥ 64 (every
//!   tile in the skinny kernel's K split: the batch-invariant mode's
//!   kernel, whose partials cost prefill time). `wo_a` is 8 groups of
//!   1024 × 4096, timed as 8 dense calls (8 inputs, 8 weights) per
//!   iteration. Peers measured here on the same (M, N, K), through cudarc:
//!   cuBLASLt FP8 e4m3 with per-tensor scales (`cublaslt_fp8_tensorwise`)
//!   and cuBLAS BF16 (`cublas_bf16`), both with BF16 output.
//! - MoE: 384 experts, FP4 weights of the gate-up w13 (w1 and w3 as one
//!   4608 × 5120 GEMM, as the model runs them) and w2 (5120 × 2304):
//!   masked decode (`cuda_backend::gemm_skinny::mxfp4_grouped_masked_with`,
//!   V1, V2 and V3 as rows `skinny_v1` / `_v2` / `_v3`, every expert holding 1, 4,
//!   16 or 64 tokens) and contiguous prefill
//!   (`cuda_backend::gemm::mxfp4_grouped_contiguous`, row `large`, with the
//!   torch peers, 8–32 experts × 128–8192 tokens per group).
//!
//! Records: `ours_us`, `tflops` = 2·M·N·K (summed over groups) / time,
//! `gbps` over the bytes that must move once: A (M·K) + its scales
//! (M·⌈K/32⌉) + B (N·K, or N·K/2 for FP4, per group with tokens) + its
//! scales + the BF16 output (2·M·N); each record states its formula. A shape
//! our kernels reject records the error string instead. The FP8 tensor
//! ceiling is cuBLASLt FP8 at 8192³ in this run; the BF16 ceiling comes from
//! the torch peers.
//!
//! DEEPINFER_BENCH_QUICK=1 runs a small subset (two projections, M ∈ {1,
//! 64, 4096}, one MoE shape per layout); DEEPINFER_BENCH_MOE=1 the MoE rows
//! (masked at 1, 4, 16 tokens; contiguous 16 × 2048 and 8 × 4096) and wq_a,
//! wo_b at M = 4096; DEEPINFER_BENCH_MOE=rank one EP-64 rank's decode layer
//! (6 experts of 1 or 8 tokens) in both layouts, then the masked rows at 1,
//! 2 and 3 experts of 1 token (the fixed cost per launch), the weights
//! rotated through copies so they are not L2-hot; DEEPINFER_BENCH_DENSE=1
//! every projection at M ∈ {128, 512, 4096, 16384} only,
//! DEEPINFER_BENCH_DENSE=decode every projection at M ∈ {1, 8}, and
//! DEEPINFER_BENCH_DENSE=wo_b:4096 one projection at one M.

#[cfg(deepinfer_cuda)]
#[path = "common/gpu_harness.rs"]
mod harness;

#[cfg(deepinfer_cuda)]
mod gpu {
    use super::harness::Harness;
    use deepinfer::cuda_backend::blas::Fp8TensorwisePlan;
    use deepinfer::cuda_backend::gemm::mxfp4_grouped_contiguous;
    use deepinfer::cuda_backend::gemm_skinny::{
        SkinnyVersion, mxfp4_grouped_masked_with, mxfp8_gemm_skinny_with,
    };
    use deepinfer::dtype::Element;
    use deepinfer::ops::{self, GemmImpl};
    use deepinfer::{DType, Device, E4M3, E8M0, Fp4x2, Tensor};
    use half::bf16;
    use serde_json::{Value, json};

    /// A dense FP8 projection: `groups` independent [n, k] weights.
    struct Proj {
        name: &'static str,
        n: usize,
        k: usize,
        groups: usize,
    }

    const PROJECTIONS: &[Proj] = &[
        Proj {
            name: "wq_a",
            n: 1280,
            k: 5120,
            groups: 1,
        },
        Proj {
            name: "wq_b",
            n: 32768,
            k: 1280,
            groups: 1,
        },
        Proj {
            name: "wkv",
            n: 512,
            k: 5120,
            groups: 1,
        },
        Proj {
            name: "wo_a",
            n: 1024,
            k: 4096,
            groups: 8,
        },
        Proj {
            name: "wo_b",
            n: 5120,
            k: 8192,
            groups: 1,
        },
        Proj {
            name: "shared_w13",
            n: 4608,
            k: 5120,
            groups: 1,
        },
        Proj {
            name: "shared_w2",
            n: 5120,
            k: 2304,
            groups: 1,
        },
        Proj {
            name: "indexer_wq_b",
            n: 4096,
            k: 1280,
            groups: 1,
        },
    ];
    const MS: &[usize] = &[1, 8, 32, 64, 128, 512, 4096, 16384];
    /// Both dense kernels are timed up to this M.
    const CROSSOVER_MAX_M: usize = 128;

    /// Routed experts and the two expert shapes (name, N, K).
    const EXPERTS: usize = 384;
    /// `w13` is w1 and w3 as the model runs them: one gate-up GEMM.
    const MOE_SHAPES: &[(&str, usize, usize)] = &[("w13", 4608, 5120), ("w2", 5120, 2304)];
    const MASKED_COUNTS: &[usize] = &[1, 4, 16, 64];
    /// Contiguous prefill: (experts with tokens, tokens per expert).
    const CONTIGUOUS: &[(usize, usize)] = &[(32, 128), (32, 512), (16, 2048), (8, 4096), (8, 8192)];

    fn quick() -> bool {
        std::env::var("DEEPINFER_BENCH_QUICK").is_ok_and(|v| v == "1")
    }

    /// Deterministic pseudo-random bytes (xorshift64*), mapped by `f`.
    fn host<T>(n: usize, seed: u64, f: impl Fn(u8) -> T) -> Vec<T> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let r = s.wrapping_mul(0x2545_F491_4F6C_DD1D);
            for b in r.to_le_bytes() {
                if out.len() < n {
                    out.push(f(b));
                }
            }
        }
        out
    }

    /// e4m3 of magnitude below 2 (exponent bit 6 cleared: never NaN).
    fn fp8(b: u8) -> E4M3 {
        E4M3(b & 0xBF)
    }
    /// E8M0 scales in 2^-7 ..= 2^3.
    fn scale(b: u8) -> E8M0 {
        E8M0(120 + b % 11)
    }
    fn fp4(b: u8) -> Fp4x2 {
        Fp4x2(b)
    }
    fn bf(b: u8) -> bf16 {
        bf16::from_bits(0x3C00 | ((b as u16 & 0x80) << 8) | (b as u16 & 0x7F))
    }

    /// `copies` device copies of one host tensor: one upload, then
    /// device-to-device clones (each a separate allocation).
    fn upload<T: Element>(dev: &Device, v: Vec<T>, shape: &[usize], copies: usize) -> Vec<Tensor> {
        let first = Tensor::from_vec(v, shape).unwrap().to_device(dev).unwrap();
        let mut all: Vec<Tensor> = (1..copies).map(|_| first.clone()).collect();
        all.push(first);
        all
    }

    /// Times `f(i)` with the harness; the first call's error (or a later
    /// one) is returned instead of a time.
    fn measure(
        h: &Harness,
        mut f: impl FnMut(usize) -> deepinfer::Result<()>,
    ) -> Result<f64, String> {
        f(0).map_err(|e| e.to_string())?;
        h.cuda.synchronize().map_err(|e| e.to_string())?;
        let mut err = None;
        let us = h.time_us(|i| {
            if let Err(e) = f(i) {
                err.get_or_insert(e.to_string());
            }
        });
        h.cuda.synchronize().map_err(|e| e.to_string())?;
        match err {
            Some(e) => Err(e),
            None => Ok(us),
        }
    }

    fn peer(name: &str, r: Result<f64, String>) -> Value {
        match r {
            Ok(us) => json!({ "name": name, "us": us }),
            Err(e) => json!({ "name": name, "error": e }),
        }
    }

    /// One projection at every M: ours (Auto, and Large/Skinny up to
    /// CROSSOVER_MAX_M) and the cudarc peers.
    fn dense(h: &mut Harness, p: &Proj, ms: &[usize]) {
        let dev = h.dev.clone();
        let (n, k, g) = (p.n, p.k, p.groups);
        let (kb, nb) = (k.div_ceil(32), n.div_ceil(32));
        // Weight sets (each `g` weights), rotated over >= 512 MiB.
        let wc = Harness::copies(g * n * k);
        let w: Vec<Vec<Tensor>> = (0..g)
            .map(|j| upload(&dev, host(n * k, 11 + j as u64, fp8), &[n, k], wc))
            .collect();
        let w_s: Vec<Vec<Tensor>> = (0..g)
            .map(|j| upload(&dev, host(nb * kb, 21 + j as u64, scale), &[nb, kb], wc))
            .collect();
        let wbc = Harness::copies(2 * g * n * k);
        let w16: Vec<Vec<Tensor>> = (0..g)
            .map(|j| upload(&dev, host(n * k, 31 + j as u64, bf), &[n, k], wbc))
            .collect();
        let one = Tensor::from_vec(vec![1.0f32], &[1])
            .unwrap()
            .to_device(&dev)
            .unwrap();
        for &m in ms {
            let ac = Harness::copies(g * m * k);
            let a: Vec<Vec<Tensor>> = (0..g)
                .map(|j| upload(&dev, host(m * k, 41 + j as u64, fp8), &[m, k], ac))
                .collect();
            let a_s: Vec<Vec<Tensor>> = (0..g)
                .map(|j| upload(&dev, host(m * kb, 51 + j as u64, scale), &[m, kb], ac))
                .collect();
            let abc = Harness::copies(2 * g * m * k);
            let a16: Vec<Vec<Tensor>> = (0..g)
                .map(|j| upload(&dev, host(m * k, 61 + j as u64, bf), &[m, k], abc))
                .collect();
            let mut out: Vec<Tensor> = (0..g)
                .map(|_| Tensor::empty(&dev, DType::BF16, &[m, n]).unwrap())
                .collect();
            let shape = json!({ "m": m, "n": n, "k": k, "groups": g });
            let flops = 2.0 * (g * m * n * k) as f64;
            let bytes = g * (m * k + m * kb + n * k + nb * kb + 2 * m * n);
            let formula = "groups*(m*k (a) + m*ceil(k/32) (a_s) + n*k (w) + ceil(n/32)*ceil(k/32) (w_s) + 2*m*n (bf16 out))";

            // Peers on the same (M, N, K): cuBLASLt FP8 per-tensor, cuBLAS BF16.
            let fp8_peer = match Fp8TensorwisePlan::new(&h.cuda, m, n, k, DType::BF16) {
                Ok(mut plan) => measure(h, |i| {
                    for j in 0..g {
                        plan.run(&a[j][i % ac], &one, &w[j][i % wc], &one, &mut out[j])?;
                    }
                    Ok(())
                }),
                Err(e) => Err(e.to_string()),
            };
            let bf16_peer = measure(h, |i| {
                for j in 0..g {
                    ops::bf16_linear_into(&a16[j][i % abc], &w16[j][i % wbc], &mut out[j])?;
                }
                Ok(())
            });
            // The op with a kernel choice, or one skinny version directly.
            let mut imps = vec![("auto", GemmImpl::Auto, None)];
            if m >= ops::SKINNY_MAX_M {
                // The large kernel with whole tiles (Auto above SKINNY_MAX_M
                // runs it with the last wave split), and cut into the skinny
                // kernel's K split (a batch-invariant device's Auto there).
                imps.push(("large", GemmImpl::Large, None));
                imps.push(("large_skinny_split", GemmImpl::LargeSkinnySplit, None));
            }
            if m <= ops::SKINNY_MAX_M {
                imps.extend([
                    ("skinny_v1", GemmImpl::Skinny, Some(SkinnyVersion::V1)),
                    ("skinny_v2", GemmImpl::Skinny, Some(SkinnyVersion::V2)),
                ]);
            } else if m <= CROSSOVER_MAX_M {
                imps.push(("skinny", GemmImpl::Skinny, None));
            }
            for (label, imp, version) in imps {
                let us = measure(h, |i| {
                    for j in 0..g {
                        let (x, xs, wj, wsj) = (
                            &a[j][i % ac],
                            &a_s[j][i % ac],
                            &w[j][i % wc],
                            &w_s[j][i % wc],
                        );
                        match version {
                            Some(v) => {
                                mxfp8_gemm_skinny_with(&h.cuda, x, xs, wj, wsj, &mut out[j], v)?
                            }
                            None => ops::mxfp8_linear_into(x, xs, wj, wsj, &mut out[j], imp)?,
                        }
                    }
                    Ok(())
                });
                let (peer_op, peers) = if imp == GemmImpl::Auto {
                    (
                        p.name,
                        vec![
                            peer("cublaslt_fp8_tensorwise", fp8_peer.clone()),
                            peer("cublas_bf16", bf16_peer.clone()),
                        ],
                    )
                } else {
                    ("", Vec::new())
                };
                let ran = us.is_ok();
                h.record_gemm(
                    &format!("mxfp8_linear/{}/{label}", p.name),
                    peer_op,
                    shape.clone(),
                    us,
                    flops,
                    bytes,
                    formula,
                    peers,
                );
                // The host's issue time of the same calls (the op's checks,
                // TMA maps and launch): near ours_us, the host set the time.
                if ran && version.is_none() {
                    let host = h.host_issue_us(|i| {
                        let _ = ops::mxfp8_linear_into(
                            &a[0][i % ac],
                            &a_s[0][i % ac],
                            &w[0][i % wc],
                            &w_s[0][i % wc],
                            &mut out[0],
                            imp,
                        );
                    });
                    println!("    host issue {host:.2} us a call (group 0)");
                    h.annotate_last("host_issue_us_per_call", json!(host));
                }
            }
            if m > ops::SKINNY_MAX_M && g == 1 {
                shared_scales(h, p, m);
            }
        }
    }

    /// Share of the `group`-row, 128-deep cells of `scales` (`[rows, kb]`
    /// bytes) whose rows each carry one scale across the cell: the stages a
    /// chained warpgroup (64 rows of A) or weight block (1 row of 32 × 32
    /// scales) may chain.
    fn uniform_share(scales: &[E8M0], rows: usize, kb: usize, group: usize) -> f64 {
        let (mut yes, mut all) = (0usize, 0usize);
        for g in 0..rows.div_ceil(group) {
            for st in 0..kb.div_ceil(4) {
                all += 1;
                let r = g * group..((g + 1) * group).min(rows);
                yes += usize::from(r.into_iter().all(|r| {
                    let row = &scales[r * kb + 4 * st..r * kb + (4 * st + 4).min(kb)];
                    row.iter().all(|s| *s == row[0])
                }));
            }
        }
        yes as f64 / all.max(1) as f64
    }

    /// Issue 13's fewer promotions on quantised Gaussian operands made on
    /// the device (`ops::random_param`: A 1 × 32 with std 1, W 32 × 32 with
    /// std 0.02): `ops::mx_share_scales` on A (its steady-state time: the
    /// rotation's copies are rewritten by their first call, so later calls
    /// only check), then the same rewritten operands through the chained
    /// kernel (`large_shared`) and the per-32 one (`large_split_q`).
    fn shared_scales(h: &mut Harness, p: &Proj, m: usize) {
        use deepinfer::weight_rng::{Format, RandomParam};
        let dev = h.dev.clone();
        let (n, k) = (p.n, p.k);
        let (kb, nb) = (k.div_ceil(32), n.div_ceil(32));
        let make = |key, rows, std, format| {
            let param = RandomParam {
                key,
                mean: 0.0,
                std,
                rows,
                cols: k,
                format,
            };
            ops::random_param(&dev, &param)
        };
        let (a, w) = match (
            make(91, m, 1.0, Format::Fp8Row),
            make(92, n, 0.02, Format::Fp8Block([32, 32])),
        ) {
            (Ok(a), Ok(w)) => (a, w),
            (Err(e), _) | (_, Err(e)) => {
                println!("shared_scales {} m={m}: {e}", p.name);
                return;
            }
        };
        let (mut a, mut a_s) = (a[0].clone(), a[1].clone());
        let (mut w, mut w_s) = (w[0].clone(), w[1].clone());
        let shape = json!({ "m": m, "n": n, "k": k, "groups": 1 });
        let before_a = a_s.to_vec::<E8M0>().unwrap_or_default();
        let before_w = w_s.to_vec::<E8M0>().unwrap_or_default();
        if let Err(e) = ops::mx_share_scales(&mut a, &mut a_s, 1, 128)
            .and_then(|()| ops::mx_share_scales(&mut w, &mut w_s, 32, 128))
        {
            println!("shared_scales {} m={m}: {e}", p.name);
            return;
        }
        let after_a = a_s.to_vec::<E8M0>().unwrap_or_default();
        let after_w = w_s.to_vec::<E8M0>().unwrap_or_default();
        let cells = json!({
            "a_64_rows_before": uniform_share(&before_a, m, kb, 64),
            "a_64_rows_after": uniform_share(&after_a, m, kb, 64),
            "w_32_rows_before": uniform_share(&before_w, nb, kb, 1),
            "w_32_rows_after": uniform_share(&after_w, nb, kb, 1),
        });
        println!("    uniform 128-deep stages: {cells}");
        // The op on rotating copies of A (rewritten by their first call).
        let ac = Harness::copies(m * k);
        let mut ca: Vec<(Tensor, Tensor)> = (0..ac).map(|_| (a.clone(), a_s.clone())).collect();
        let us = measure(h, |i| {
            let (x, xs) = &mut ca[i % ac];
            ops::mx_share_scales(x, xs, 1, 128)
        });
        let bytes = m * k + m * kb;
        let copy_us = h.copy_us(bytes);
        match us {
            Ok(us) => h.record_vs_copy(
                &format!("mx_share_scales/{}", p.name),
                json!({ "m": m, "k": k }),
                us,
                bytes,
                "m*k (codes) + m*ceil(k/32) (scales), read once (rewrites of the first call not counted)",
                copy_us,
            ),
            Err(e) => println!("mx_share_scales/{} m={m}: {e}", p.name),
        }
        drop(ca);
        quant_shared(h, p, m);
        let wc = Harness::copies(n * k);
        let ws: Vec<(Tensor, Tensor)> = (0..wc).map(|_| (w.clone(), w_s.clone())).collect();
        let xs: Vec<(Tensor, Tensor)> = (0..ac).map(|_| (a.clone(), a_s.clone())).collect();
        let mut out = match Tensor::empty(&dev, DType::BF16, &[m, n]) {
            Ok(t) => t,
            Err(e) => {
                println!("shared_scales {} m={m}: {e}", p.name);
                return;
            }
        };
        let flops = 2.0 * (m * n * k) as f64;
        let bytes = m * k + m * kb + n * k + nb * kb + 2 * m * n;
        let formula = "m*k (a) + m*ceil(k/32) (a_s) + n*k (w) + ceil(n/32)*ceil(k/32) (w_s) + 2*m*n (bf16 out)";
        for (label, imp) in [
            ("large_shared", GemmImpl::LargeShared),
            ("large_split_q", GemmImpl::LargeSplit),
        ] {
            let us = measure(h, |i| {
                let ((x, x_s), (wj, wj_s)) = (&xs[i % ac], &ws[i % wc]);
                ops::mxfp8_linear_into(x, x_s, wj, wj_s, &mut out, imp)
            });
            h.record_gemm(
                &format!("mxfp8_linear/{}/{label}", p.name),
                "",
                shape.clone(),
                us,
                flops,
                bytes,
                formula,
                Vec::new(),
            );
            h.annotate_last("uniform_stages", cells.clone());
        }
    }

    /// The activation quantiser with sharing fused (`ops::act_quant_fp8_shared`,
    /// runs of 128) against the plain one (`ops::act_quant_fp8`) on the same
    /// BF16 `[m, k]` (`ops::random_param`, std 1), both against the copy of
    /// their bytes: what the share costs when the quantiser does it.
    fn quant_shared(h: &mut Harness, p: &Proj, m: usize) {
        use deepinfer::weight_rng::{Format, RandomParam};
        let k = p.k;
        let param = RandomParam {
            key: 93,
            mean: 0.0,
            std: 1.0,
            rows: m,
            cols: k,
            format: Format::Bf16,
        };
        let x = match ops::random_param(&h.dev, &param) {
            Ok(x) => x[0].clone(),
            Err(e) => {
                println!("act_quant_fp8_shared/{} m={m}: {e}", p.name);
                return;
            }
        };
        let c = Harness::copies(m * k * 2);
        let xs: Vec<Tensor> = (0..c).map(|_| x.clone()).collect();
        let bytes = 2 * m * k + m * k + m * k.div_ceil(32);
        let copy_us = h.copy_us(bytes);
        let formula = "2*m*k (bf16 x) + m*k (e4m3 q) + m*ceil(k/32) (scales)";
        for (label, shared) in [("act_quant_fp8", false), ("act_quant_fp8_shared", true)] {
            let us = measure(h, |i| {
                if shared {
                    ops::act_quant_fp8_shared(&xs[i % c], 128).map(drop)
                } else {
                    ops::act_quant_fp8(&xs[i % c]).map(drop)
                }
            });
            match us {
                Ok(us) => h.record_vs_copy(
                    &format!("{label}/{}", p.name),
                    json!({ "m": m, "k": k }),
                    us,
                    bytes,
                    formula,
                    copy_us,
                ),
                Err(e) => println!("{label}/{} m={m}: {e}", p.name),
            }
        }
    }

    /// FP4 expert weights [e, n, k] and their scales, `copies` device copies.
    fn expert_weights(
        dev: &Device,
        e: usize,
        n: usize,
        k: usize,
        copies: usize,
    ) -> (Vec<Tensor>, Vec<Tensor>) {
        let kb = k.div_ceil(32);
        let w = upload(dev, host(e * n * k / 2, 71, fp4), &[e, n, k], copies);
        let s = upload(dev, host(e * n * kb, 72, scale), &[e, n, kb], copies);
        (w, s)
    }

    fn moe_masked(
        h: &mut Harness,
        experts: usize,
        counts: &[usize],
        shapes: &[(&str, usize, usize)],
    ) {
        let dev = h.dev.clone();
        for &(name, n, k) in shapes {
            let kb = k.div_ceil(32);
            // A whole layer's 384 experts (2.3 GB) are far larger than L2 and
            // take one copy; an EP rank's few rotate through copies.
            let wc = if experts >= EXPERTS {
                1
            } else {
                Harness::copies(experts * n * k / 2)
            };
            let (w, w_s) = expert_weights(&dev, experts, n, k, wc);
            for &c in counts {
                let ac = Harness::copies(experts * c * k);
                let a = upload(&dev, host(experts * c * k, 81, fp8), &[experts, c, k], ac);
                let a_s = upload(
                    &dev,
                    host(experts * c * kb, 82, scale),
                    &[experts, c, kb],
                    ac,
                );
                let cnt = upload(&dev, vec![c as i32; experts], &[experts], 1).remove(0);
                let mut out = Tensor::empty(&dev, DType::BF16, &[experts, c, n]).unwrap();
                for (label, v) in [
                    ("skinny_v1", SkinnyVersion::V1),
                    ("skinny_v2", SkinnyVersion::V2),
                    ("skinny_v3", SkinnyVersion::V3),
                    ("skinny_v6", SkinnyVersion::V6),
                ] {
                    let us = measure(h, |i| {
                        mxfp4_grouped_masked_with(
                            &h.cuda,
                            &a[i % ac],
                            &a_s[i % ac],
                            &w[i % wc],
                            &w_s[i % wc],
                            &cnt,
                            &mut out,
                            v,
                        )
                    });
                    let rows = experts * c;
                    h.record_gemm(
                        &format!("mxfp4_grouped_masked/{name}/{label}"),
                        &format!("moe_masked/{name}"),
                        json!({ "experts": experts, "tokens_per_expert": c, "n": n, "k": k }),
                        us,
                        2.0 * (rows * n * k) as f64,
                        rows * k + rows * kb + experts * (n * k / 2 + n * kb) + 2 * rows * n,
                        "E*c*k (a) + E*c*ceil(k/32) (a_s) + E*(n*k/2 (fp4 w) + n*ceil(k/32) (w_s)) + 2*E*c*n (bf16 out); every expert holds c tokens",
                        Vec::new(),
                    );
                }
            }
        }
    }

    fn moe_contiguous(
        h: &mut Harness,
        configs: &[(usize, usize)],
        shapes: &[(&str, usize, usize)],
    ) {
        let dev = h.dev.clone();
        for &(name, n, k) in shapes {
            let kb = k.div_ceil(32);
            for &(e, per) in configs {
                let t = e * per;
                let wc = Harness::copies(e * n * k / 2);
                let (w, w_s) = expert_weights(&dev, e, n, k, wc);
                let ac = Harness::copies(t * k);
                let a = upload(&dev, host(t * k, 101, fp8), &[t, k], ac);
                let a_s = upload(&dev, host(t * kb, 102, scale), &[t, kb], ac);
                let offsets: Vec<i32> = (0..=e).map(|x| (x * per) as i32).collect();
                let off = upload(&dev, offsets, &[e + 1], 1).remove(0);
                let mut out = Tensor::empty(&dev, DType::BF16, &[t, n]).unwrap();
                {
                    let us = measure(h, |i| {
                        mxfp4_grouped_contiguous(
                            &h.cuda,
                            &a[i % ac],
                            &a_s[i % ac],
                            &w[i % wc],
                            &w_s[i % wc],
                            &off,
                            &mut out,
                        )
                    });
                    h.record_gemm(
                        &format!("mxfp4_grouped_contiguous/{name}/large"),
                        &format!("moe_contiguous/{name}"),
                        json!({ "experts": e, "tokens_per_expert": per, "n": n, "k": k }),
                        us,
                        2.0 * (t * n * k) as f64,
                        t * k + t * kb + e * (n * k / 2 + n * kb) + 2 * t * n,
                        "T*k (a) + T*ceil(k/32) (a_s) + E*(n*k/2 (fp4 w) + n*ceil(k/32) (w_s)) + 2*T*n (bf16 out); T = E * tokens_per_expert",
                        Vec::new(),
                    );
                }
            }
        }
    }

    /// cuBLASLt FP8 per-tensor at 8192³, the FP8 tensor ceiling of this run.
    fn fp8_ceiling(h: &mut Harness) {
        let dev = h.dev.clone();
        let s = 8192;
        let a = upload(&dev, host(s * s, 1, fp8), &[s, s], 1).remove(0);
        let one = Tensor::from_vec(vec![1.0f32], &[1])
            .unwrap()
            .to_device(&dev)
            .unwrap();
        let mut out = Tensor::empty(&dev, DType::BF16, &[s, s]).unwrap();
        let r = Fp8TensorwisePlan::new(&h.cuda, s, s, s, DType::BF16)
            .map_err(|e| e.to_string())
            .and_then(|mut plan| measure(h, |_| plan.run(&a, &one, &a, &one, &mut out)));
        match r {
            Ok(us) => {
                let tflops = 2.0 * (s * s * s) as f64 / (us * 1e-6) / 1e12;
                println!("fp8 ceiling (cuBLASLt per-tensor, 8192^3): {tflops:.0} TFLOP/s");
                h.set_fp8_ceiling(tflops);
            }
            Err(e) => println!("fp8 ceiling not measured: {e}"),
        }
    }

    pub fn main() {
        let Some(mut h) = Harness::open("gemm_gpu") else {
            return;
        };
        println!(
            "{:<34} {:<34} {:>10} {:>8} {:>9} {:>8}  peers (us)",
            "op", "shape", "ours_us", "TFLOP/s", "GB/s", "%copy"
        );
        fp8_ceiling(&mut h);
        if std::env::var("DEEPINFER_BENCH_MOE").is_ok_and(|v| v == "1") {
            for p in PROJECTIONS
                .iter()
                .filter(|p| p.name == "wq_a" || p.name == "wo_b")
            {
                dense(&mut h, p, &[4096]);
            }
            moe_masked(&mut h, EXPERTS, &MASKED_COUNTS[..3], MOE_SHAPES);
            moe_contiguous(&mut h, &[(16, 2048), (8, 4096)], MOE_SHAPES);
        } else if std::env::var("DEEPINFER_BENCH_MOE").is_ok_and(|v| v == "rank") {
            // One EP-64 rank's layer at decode: 6 experts, every token routed
            // to all of them (the model bench's B 1 and B 8), both layouts.
            let e = EXPERTS / 64;
            moe_masked(&mut h, e, &[1, 8], MOE_SHAPES);
            moe_contiguous(&mut h, &[(e, 1), (e, 8)], MOE_SHAPES);
            // Fewer experts at 1 token: time against units per CTA gives
            // the masked kernels' fixed cost (intercept) and per-unit rate.
            for fewer in [1, 2, 3] {
                moe_masked(&mut h, fewer, &[1], MOE_SHAPES);
            }
        } else if std::env::var("DEEPINFER_BENCH_DENSE").is_ok_and(|v| v == "decode") {
            // Every projection at the decode sizes of an EP rank's step
            // (the skinny versions side by side, against the peers).
            for p in PROJECTIONS {
                dense(&mut h, p, &[1, 8]);
            }
        } else if let Ok(which) = std::env::var("DEEPINFER_BENCH_DENSE") {
            // The dense projections at the prefill sizes only (the large
            // kernel, whole and split tiles, against the peers): `1` for
            // all, or `name:M` for one (a profiler's target).
            let one = which.split_once(':');
            for p in PROJECTIONS {
                match one {
                    Some((name, m)) if name == p.name => match m.parse::<usize>() {
                        Ok(m) => dense(&mut h, p, &[m]),
                        Err(e) => println!("DEEPINFER_BENCH_DENSE={which}: {e}"),
                    },
                    Some(_) => {}
                    None => dense(&mut h, p, &[128, 512, 4096, 16384]),
                }
            }
        } else if quick() {
            for p in PROJECTIONS
                .iter()
                .filter(|p| p.name == "wq_a" || p.name == "wo_b")
            {
                dense(&mut h, p, &[1, 64, 4096]);
            }
            moe_masked(&mut h, EXPERTS, &[4], &MOE_SHAPES[..1]);
            moe_contiguous(&mut h, &[(8, 4096)], &MOE_SHAPES[..1]);
        } else {
            for p in PROJECTIONS {
                dense(&mut h, p, MS);
            }
            moe_masked(&mut h, EXPERTS, MASKED_COUNTS, MOE_SHAPES);
            moe_contiguous(&mut h, CONTIGUOUS, MOE_SHAPES);
        }
        h.finish();
    }
}

fn main() {
    #[cfg(deepinfer_cuda)]
    gpu::main();
    #[cfg(not(deepinfer_cuda))]
    eprintln!("gemm_gpu: built without DEEPINFER_ACCELERATOR=nvidia; nothing to measure");
}
