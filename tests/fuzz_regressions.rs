//! Regression tests for what the fuzzers found (`fuzz/`, issue 15 item 4):
//! each case once panicked, hung or aborted on an allocation, and now
//! returns a typed error (or the right result) at once, each under a memory
//! and time limit (`common::limits::bounded`).

mod common;

use common::limits::{Counting, bounded};
use deepinfer::{DType, Device, Error, Tensor, ops};
use half::bf16;
use std::time::{Duration, Instant};

/// Every case runs under [`bounded`]: at most [`CASE_BYTES`] allocated on
/// its thread and [`CASE_TIME`] of wall time, so a regression that
/// allocates by a hostile size or loops over one fails the case instead of
/// taking the machine.
#[global_allocator]
static ALLOC: Counting = Counting;

const CASE_BYTES: u64 = 64 << 20;
const CASE_TIME: Duration = Duration::from_secs(5);

fn f32s(shape: &[usize]) -> Tensor {
    Tensor::from_vec(vec![1.0f32; shape.iter().product()], shape).unwrap()
}

fn bf16s(shape: &[usize]) -> Tensor {
    Tensor::from_vec(vec![bf16::ONE; shape.iter().product()], shape).unwrap()
}

fn shape_error<T: std::fmt::Debug>(r: Result<T, Error>, op: &str) {
    match r {
        Err(Error::Shape { op: o, .. }) if o == op => {}
        other => panic!("{op}: expected a shape error, got {other:?}"),
    }
}

/// `start + len` and `row + n` overflowed (a debug panic; in release a
/// wrapped range that then indexed out of bounds).
#[test]
fn row_ranges_that_overflow_are_shape_errors() {
    bounded(
        "row_ranges_that_overflow_are_shape_errors",
        CASE_BYTES,
        CASE_TIME,
        || {
            let t = f32s(&[4, 2]);
            shape_error(t.narrow_rows(usize::MAX, 2), "Tensor::narrow_rows");
            shape_error(t.narrow_rows(2, usize::MAX), "Tensor::narrow_rows");
            shape_error(t.narrow_rows(3, 2), "Tensor::narrow_rows");
            assert_eq!(t.narrow_rows(1, 3).unwrap().shape(), &[3, 2]);
            let mut d = f32s(&[4, 2]);
            shape_error(
                d.copy_rows_from(usize::MAX, &t, 0, 1),
                "Tensor::copy_rows_from",
            );
            shape_error(
                d.copy_rows_from(0, &t, usize::MAX, 2),
                "Tensor::copy_rows_from",
            );
            shape_error(
                d.copy_rows_from(1, &t, 0, usize::MAX),
                "Tensor::copy_rows_from",
            );
            d.copy_rows_from(1, &t, 0, 3).unwrap();
            // 0 rows of a row shape whose own product overflows: nothing to copy
            // (row_bytes overflowed).
            let z = Tensor::from_vec(Vec::<f32>::new(), &[0, 1 << 62, 4]).unwrap();
            assert_eq!(z.narrow_rows(0, 0).unwrap().shape(), &[0, 1 << 62, 4]);
            let mut z2 = z.clone();
            z2.copy_rows_from(0, &z, 0, 0).unwrap();
            assert_eq!(
                Tensor::cat_rows(&[&z, &z]).unwrap().shape(),
                &[0, 1 << 62, 4]
            );
        },
    );
}

/// A rank-0 tensor has no row axis: `cat_rows` indexed `shape[0]`, and
/// `narrow_rows` / `copy_rows_from` must refuse it too.
#[test]
fn rank_zero_tensors_have_no_rows_to_concatenate() {
    bounded(
        "rank_zero_tensors_have_no_rows_to_concatenate",
        CASE_BYTES,
        CASE_TIME,
        || {
            let s = Tensor::from_vec(vec![1.0f32], &[]).unwrap();
            shape_error(Tensor::cat_rows(&[&s, &s]), "Tensor::cat_rows");
            shape_error(s.narrow_rows(0, 0), "Tensor::narrow_rows");
            let mut d = s.clone();
            shape_error(d.copy_rows_from(0, &s, 0, 0), "Tensor::copy_rows_from");
            let r = f32s(&[2, 3]);
            assert_eq!(Tensor::cat_rows(&[&r, &r]).unwrap().shape(), &[4, 3]);
        },
    );
}

/// `cat_cols` of `[2^62, 0]` parts looped 2^62 times over empty rows.
#[test]
fn cat_cols_of_empty_parts_with_huge_row_counts_returns_at_once() {
    bounded(
        "cat_cols_of_empty_parts_with_huge_row_counts_returns_at_once",
        CASE_BYTES,
        CASE_TIME,
        || {
            let t0 = Instant::now();
            let e = Tensor::from_vec(Vec::<f32>::new(), &[1 << 62, 0]).unwrap();
            let out = ops::cat_cols(&[&e, &e]).unwrap();
            assert_eq!(out.shape(), &[1 << 62, 0]);
            assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
            let (a, b) = (f32s(&[2, 3]), f32s(&[2, 0]));
            assert_eq!(ops::cat_cols(&[&a, &b, &a]).unwrap().shape(), &[2, 6]);
        },
    );
}

/// A huge host tensor aborted the process ("memory allocation of N bytes
/// failed"); it is a typed out-of-memory error naming the constructor.
#[test]
fn host_tensors_larger_than_memory_are_out_of_memory_errors() {
    bounded(
        "host_tensors_larger_than_memory_are_out_of_memory_errors",
        CASE_BYTES,
        CASE_TIME,
        || {
            for r in [
                Tensor::filled_bytes(DType::F32, &[1 << 60], 0xFF),
                Tensor::empty(&Device::Cpu, DType::I64, &[1 << 40, 1 << 10]),
                Tensor::zeros(&Device::Cpu, DType::BF16, &[1 << 61]),
            ] {
                match r {
                    Err(Error::OutOfMemory { what, bytes, .. }) => {
                        assert!(what.starts_with("Tensor::"), "{what}");
                        assert!(bytes >= 1 << 50, "{bytes}");
                    }
                    other => panic!("expected OutOfMemory, got {other:?}"),
                }
            }
        },
    );
}

/// `engram_lookup` computed `head_dim + head_dim / 32` and `cols ×
/// head_dim` unchecked (overflow panics).
#[test]
fn engram_lookup_with_an_overflowing_head_dim_is_a_shape_error() {
    bounded(
        "engram_lookup_with_an_overflowing_head_dim_is_a_shape_error",
        CASE_BYTES,
        CASE_TIME,
        || {
            let table = Tensor::from_vec(vec![0u8; 2 * 33], &[2, 33]).unwrap();
            let rows = Tensor::from_vec(vec![0i64, 1], &[1, 2]).unwrap();
            let huge = usize::MAX - usize::MAX % 32;
            shape_error(ops::engram_lookup(&table, &rows, huge), "engram_lookup");
            assert_eq!(
                ops::engram_lookup(&table, &rows, 32).unwrap().shape(),
                &[1, 64]
            );
        },
    );
}

/// `index_reindex_topk` allocated its `[batch, k]` output before checking
/// k ≤ n: k = 2^40 aborted on the allocation.
#[test]
fn index_reindex_topk_checks_k_before_allocating() {
    bounded(
        "index_reindex_topk_checks_k_before_allocating",
        CASE_BYTES,
        CASE_TIME,
        || {
            let scores = bf16s(&[2, 8]);
            let candidates = Tensor::from_vec(vec![0i32; 2], &[2, 1]).unwrap();
            let visible = Tensor::from_vec(vec![8i32; 2], &[2]).unwrap();
            for k in [1usize << 40, usize::MAX, 9] {
                let e =
                    ops::index_reindex_topk(&scores, &candidates, 4, &visible, k, 0).unwrap_err();
                assert!(
                    matches!(e, Error::Argument { arg: "k", .. }),
                    "k = {k}: {e}"
                );
            }
        },
    );
}

/// `compress_ratio2` took an odd head dim and panicked packing FP4 pairs:
/// like `compressor_rows_into` it needs a multiple of 16.
#[test]
fn compress_ratio2_needs_head_dims_of_whole_fp4_groups() {
    bounded(
        "compress_ratio2_needs_head_dims_of_whole_fp4_groups",
        CASE_BYTES,
        CASE_TIME,
        || {
            for hd in [1usize, 2, 8, 24] {
                let kv = f32s(&[2, hd]);
                shape_error(ops::compress_ratio2(&kv, &kv), "compress_ratio2");
            }
            let kv = f32s(&[4, 16]);
            assert_eq!(ops::compress_ratio2(&kv, &kv).unwrap().shape(), &[2, 16]);
        },
    );
}

/// `embedding` reserved `T × D` elements before checking any id: an empty
/// table of huge rows (`[0, 2^33]`) aborted on a 16 GiB allocation.
#[test]
fn embedding_checks_the_ids_before_allocating_the_rows() {
    bounded(
        "embedding_checks_the_ids_before_allocating_the_rows",
        CASE_BYTES,
        CASE_TIME,
        || {
            let table = Tensor::from_vec(Vec::<bf16>::new(), &[0, 1 << 33]).unwrap();
            let ids = Tensor::from_vec(vec![0i32, 1], &[2]).unwrap();
            let e = ops::embedding(&table, &ids).unwrap_err();
            assert!(matches!(e, Error::Argument { arg: "ids", .. }), "{e}");
            let table = bf16s(&[4, 8]);
            let e =
                ops::embedding(&table, &Tensor::from_vec(vec![4i32], &[1]).unwrap()).unwrap_err();
            assert!(e.to_string().contains("outside the embedding table"), "{e}");
            assert_eq!(ops::embedding(&table, &ids).unwrap().shape(), &[2, 8]);
        },
    );
}

/// A 13 KB config listing 480 Engram layers with 256 heads and 32-grams
/// asked for 3.8 million hash primes near 2^40 and took 50 s to be
/// refused; 12 distinct layers of 7,936 columns still took seconds. The
/// layer lists are checked first and the prime count is bounded.
#[test]
fn configs_asking_for_millions_of_engram_primes_are_refused_at_once() {
    bounded(
        "configs_asking_for_millions_of_engram_primes_are_refused_at_once",
        CASE_BYTES,
        CASE_TIME,
        || {
            use deepinfer::model::config::{ENGRAM_PRIMES_LIMIT, ModelConfig};
            let tiny: serde_json::Value =
                serde_json::from_str(include_str!("../models/tiny/config.json")).unwrap();
            for (layers, why) in [
                ((0..12).cycle().take(480).collect::<Vec<usize>>(), "twice"),
                ((0..12).collect(), "hash primes"),
            ] {
                let mut c = tiny.clone();
                let t = &mut c["text_config"];
                t["engram_num_embeddings"] = serde_json::json!(vec![1; layers.len()]);
                t["engram_layer_ids"] = serde_json::json!(layers);
                t["engram_n_heads"] = serde_json::json!(256);
                t["engram_max_ngram_size"] = serde_json::json!(32);
                t["engram_vocab_size"] = serde_json::json!(1u64 << 40);
                let t0 = Instant::now();
                let e = ModelConfig::from_hf_json(&c.to_string()).unwrap_err();
                assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
                let e = e.to_string();
                assert!(e.contains("engram_layer_ids") && e.contains(why), "{e}");
            }
            // The limit leaves room: the real V4.1 config (48 primes) loads.
            let v41 =
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/deepseek-v4.1-flash");
            let v41 = ModelConfig::from_dir(&v41).unwrap();
            let primes: usize = v41
                .engram
                .table_primes()
                .unwrap()
                .iter()
                .map(Vec::len)
                .sum();
            assert!(primes <= ENGRAM_PRIMES_LIMIT / 8, "{primes}");
        },
    );
}

/// Rank-1 packed FP4 rows are half a byte: `copy_rows_from` (and so
/// `narrow_rows`, `cat_rows`) copied whole bytes per row, past the storage.
#[test]
fn row_copies_of_rank_one_packed_fp4_are_shape_errors() {
    bounded(
        "row_copies_of_rank_one_packed_fp4_are_shape_errors",
        CASE_BYTES,
        CASE_TIME,
        || {
            use deepinfer::Fp4x2;
            let v = Tensor::from_vec(vec![Fp4x2(0x21); 5], &[10]).unwrap();
            // The row copy inside refuses them.
            shape_error(v.narrow_rows(0, 10), "Tensor::copy_rows_from");
            shape_error(Tensor::cat_rows(&[&v, &v]), "Tensor::copy_rows_from");
            let m = Tensor::from_vec(vec![Fp4x2(0x21); 6], &[3, 4]).unwrap();
            assert_eq!(
                m.narrow_rows(1, 2).unwrap().to_vec::<Fp4x2>().unwrap(),
                vec![Fp4x2(0x21); 4]
            );
        },
    );
}

/// `engram_rows` divided by zero (fewer than 3 primes), indexed past the
/// three n-gram orders (a count not a multiple of 3) and overflowed summing
/// primes near 2^64.
#[test]
fn engram_rows_needs_whole_orders_of_primes_that_fit_the_rows() {
    bounded(
        "engram_rows_needs_whole_orders_of_primes_that_fit_the_rows",
        CASE_BYTES,
        CASE_TIME,
        || {
            let ids = Tensor::from_vec(vec![5i64; 8], &[2, 4]).unwrap();
            let m = [3i64, 5, 7, 11];
            for primes in [
                vec![7u64],
                vec![7, 11],
                vec![7, 11, 13, 17],
                vec![u64::MAX, u64::MAX, 3],
                vec![1 << 62, 1 << 62, 1 << 62],
            ] {
                let e = ops::engram_rows(&ids, &m, &primes).unwrap_err();
                assert!(
                    matches!(e, Error::Argument { arg: "primes", .. }),
                    "{primes:?}: {e}"
                );
            }
            let rows = ops::engram_rows(&ids, &m, &[7, 11, 13]).unwrap();
            assert_eq!(rows.shape(), &[2, 3]);
            let r = rows.to_vec::<i64>().unwrap();
            assert!(
                r[0] < 7 && (7..18).contains(&r[1]) && (18..31).contains(&r[2]),
                "{r:?}"
            );
        },
    );
}

/// `engram_gate_update` computed `streams + 1` unchecked: a `[0, 2^64 − 1,
/// D]` streams tensor (0 elements) overflowed.
#[test]
fn engram_gate_update_with_an_overflowing_stream_count_is_a_shape_error() {
    bounded(
        "engram_gate_update_with_an_overflowing_stream_count_is_a_shape_error",
        CASE_BYTES,
        CASE_TIME,
        || {
            let s = Tensor::from_vec(Vec::<bf16>::new(), &[0, usize::MAX, 2]).unwrap();
            let w = bf16s(&[4, 2]);
            shape_error(
                ops::engram_gate_update(&s, &s, &w, &w, 1e-6),
                "engram_gate_update",
            );
        },
    );
}

/// `cat_rows` sized its output from the first part before checking the
/// others: `[0, 2^26]` then `[3, 1]` allocated 768 MiB, then failed.
#[test]
fn cat_rows_checks_every_part_before_allocating() {
    bounded(
        "cat_rows_checks_every_part_before_allocating",
        CASE_BYTES,
        CASE_TIME,
        || {
            let empty = Tensor::from_vec(Vec::<f32>::new(), &[0, 1 << 26]).unwrap();
            let r = f32s(&[3, 1]);
            shape_error(Tensor::cat_rows(&[&empty, &r]), "Tensor::cat_rows");
            let b = bf16s(&[3, 1]);
            assert!(matches!(
                Tensor::cat_rows(&[&r, &b]),
                Err(Error::DType {
                    op: "Tensor::cat_rows",
                    ..
                })
            ));
        },
    );
}

/// `grouped_bf16_linear` computed `groups × K` unchecked (overflow panic).
#[test]
fn grouped_linear_with_an_overflowing_group_count_is_a_shape_error() {
    bounded(
        "grouped_linear_with_an_overflowing_group_count_is_a_shape_error",
        CASE_BYTES,
        CASE_TIME,
        || {
            let (x, w) = (bf16s(&[2, 8]), bf16s(&[4, 4]));
            shape_error(
                ops::grouped_bf16_linear(&x, &w, usize::MAX),
                "grouped_bf16_linear",
            );
            assert_eq!(
                ops::grouped_bf16_linear(&x, &w, 2).unwrap().shape(),
                &[2, 4]
            );
        },
    );
}

/// `hc_stream_mean` of `[2^60, 4, 0]` streams (0 elements) looped over
/// 2^60 empty rows.
#[test]
fn hc_stream_mean_of_empty_rows_returns_at_once() {
    bounded(
        "hc_stream_mean_of_empty_rows_returns_at_once",
        CASE_BYTES,
        CASE_TIME,
        || {
            let t0 = Instant::now();
            let s = Tensor::from_vec(Vec::<bf16>::new(), &[1 << 60, 4, 0]).unwrap();
            assert_eq!(ops::hc_stream_mean(&s).unwrap().shape(), &[1 << 60, 0]);
            assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
            let s = bf16s(&[2, 4, 3]);
            assert_eq!(ops::hc_stream_mean(&s).unwrap().shape(), &[2, 3]);
        },
    );
}

/// The mHC ops computed `4 × D` unchecked: `[0, 4, 2^62]` streams (0
/// elements) overflowed.
#[test]
fn mhc_streams_with_an_overflowing_width_are_shape_errors() {
    bounded(
        "mhc_streams_with_an_overflowing_width_are_shape_errors",
        CASE_BYTES,
        CASE_TIME,
        || {
            let s = Tensor::from_vec(Vec::<bf16>::new(), &[0, 4, 1 << 62]).unwrap();
            let f = f32s(&[0, 4]);
            shape_error(ops::mhc_expand(&s, &bf16s(&[0, 4]), &f, &f), "mhc_expand");
        },
    );
}

/// Found by reading the code (the leftovers of issue 15's fuzzing): Sinkhorn
/// took any count up to 2^31 − 1 (minutes of work per token), and
/// `moe_layout` any expert count below 2^31 (24 GiB of outputs). Both now
/// share the config's bounds (`contract::{MHC_MAX_SINKHORN_ITERS,
/// MOE_MAX_EXPERTS}`): one past is an argument error at once, the bound
/// itself works.
#[test]
fn sinkhorn_iterations_and_expert_counts_are_bounded() {
    bounded(
        "sinkhorn_iterations_and_expert_counts_are_bounded",
        CASE_BYTES,
        CASE_TIME,
        || {
            use deepinfer::contract::{MHC_MAX_SINKHORN_ITERS, MOE_MAX_EXPERTS};
            let (t, d) = (2, 8);
            let s = bf16s(&[t, 4, d]);
            let (f, base, scale, lag) =
                (f32s(&[24, 4 * d]), f32s(&[24]), f32s(&[3]), f32s(&[t, 4]));
            for iters in [MHC_MAX_SINKHORN_ITERS + 1, 1 << 31, usize::MAX] {
                let p = ops::MhcParams {
                    iters,
                    ..ops::MhcParams::default()
                };
                let start = Instant::now();
                match ops::mhc_pre(&s, &f, &base, &scale, &lag, p) {
                    Err(Error::Argument { arg: "iters", .. }) => {}
                    other => panic!("iters {iters}: {other:?}"),
                }
                assert!(start.elapsed() < Duration::from_secs(1));
            }
            let p = ops::MhcParams {
                iters: MHC_MAX_SINKHORN_ITERS,
                ..ops::MhcParams::default()
            };
            assert!(ops::mhc_pre(&s, &f, &base, &scale, &lag, p).is_ok());
            let ids = Tensor::from_vec(vec![0i32, 1, 2, 3], &[2, 2]).unwrap();
            for n in [MOE_MAX_EXPERTS + 1, (1 << 31) - 1] {
                match ops::moe_layout(&ids, n) {
                    Err(Error::Argument {
                        arg: "n_experts", ..
                    }) => {}
                    other => panic!("n_experts {n}: {other:?}"),
                }
            }
            let (counts, offsets, _) = ops::moe_layout(&ids, MOE_MAX_EXPERTS).unwrap();
            assert_eq!(counts.shape(), &[MOE_MAX_EXPERTS]);
            assert_eq!(offsets.to_vec::<i32>().unwrap().last(), Some(&4));
        },
    );
}

/// The cargo-fuzz `ops` target (2026-12-02): rope of a zero-token x whose
/// head dimension (and so rope_dim) is 2^60 built 2^59 frequencies before
/// finding nothing to rotate, and aborted on the allocation; a zero-token
/// rotation now returns at once, and a rope_dim past the head is still
/// refused by name.
#[test]
fn rope_of_no_tokens_with_a_huge_head_returns_at_once() {
    bounded(
        "rope_of_no_tokens_with_a_huge_head_returns_at_once",
        CASE_BYTES,
        CASE_TIME,
        || {
            use deepinfer::contract::{RopeParams, Yarn};
            let x = Tensor::from_vec(Vec::<bf16>::new(), &[0, 1 << 60]).unwrap();
            let pos = Tensor::from_vec(Vec::<i64>::new(), &[0]).unwrap();
            let yarn = Yarn {
                factor: 16.0,
                original_seq_len: 65_536,
                beta_fast: 32.0,
                beta_slow: 1.0,
            };
            for yarn in [None, Some(yarn)] {
                let p = RopeParams {
                    theta: 10_000.0,
                    yarn,
                };
                let out = ops::rope(&x, &pos, 1, 1 << 60, &p).unwrap();
                assert_eq!(out.shape(), &[0, 1 << 60]);
                let out = ops::inverse_rope(&x, &pos, 1, 1 << 60, &p).unwrap();
                assert_eq!(out.shape(), &[0, 1 << 60]);
                let e = ops::rope(&x, &pos, 1, (1 << 60) + 2, &p).unwrap_err();
                assert!(e.to_string().contains("rope_dim"), "{e}");
            }
        },
    );
}

/// The cargo-fuzz `ops` target (2026-12-02): hc_collapse of zero-width
/// streams walked the input in chunks of 4 · D = 0 elements and panicked
/// ("chunk size must be non-zero"); it returns the empty `[T, 0]` result.
#[test]
fn hc_collapse_of_zero_width_streams_is_empty() {
    bounded(
        "hc_collapse_of_zero_width_streams_is_empty",
        CASE_BYTES,
        CASE_TIME,
        || {
            for t in [0usize, 3] {
                let s = Tensor::from_vec(Vec::<bf16>::new(), &[t, 4, 0]).unwrap();
                let out = ops::hc_collapse(&s, &f32s(&[t, 4])).unwrap();
                assert_eq!(out.shape(), &[t, 0]);
            }
        },
    );
}

/// The cargo-fuzz `ops` target (2026-12-02): index_scores of a zero-batch
/// q with 2^62 heads multiplied heads × dim past usize (a debug panic, a
/// wrapped bound in release); it is the heads × dim shape error.
#[test]
fn index_scores_with_an_overflowing_head_count_is_a_shape_error() {
    bounded(
        "index_scores_with_an_overflowing_head_count_is_a_shape_error",
        CASE_BYTES,
        CASE_TIME,
        || {
            use deepinfer::Fp4x2;
            // R = 34 nibbles: dim 32 and its 32/16 scale nibbles.
            let nib = 32 + 32 / 16;
            let q = Tensor::from_vec(Vec::<Fp4x2>::new(), &[0, 1 << 62, nib]).unwrap();
            let w = Tensor::from_vec(Vec::<bf16>::new(), &[0, 1 << 62]).unwrap();
            let keys = Tensor::from_vec(vec![Fp4x2(0); 4 * nib / 2], &[4, nib]).unwrap();
            let visible = Tensor::from_vec(Vec::<i32>::new(), &[0]).unwrap();
            shape_error(ops::index_scores(&q, &w, &keys, &visible), "index_scores");
        },
    );
}

/// The one-rank low-latency dispatch sized its per-call entry table from the
/// mode's max_tokens, not the call's tokens: a legal config with max_tokens
/// 2^36 asked for 2^36 · top_k · 4 bytes to dispatch 3 tokens (the fuzz
/// harness's `ops` family 37, after 2644fef). It allocates for its 3 tokens.
#[test]
fn a_low_latency_dispatch_allocates_for_its_tokens_not_max_tokens() {
    use deepinfer::ep::{self, EpConfig, Local, Mode, Payload, Placement};
    bounded(
        "a_low_latency_dispatch_allocates_for_its_tokens_not_max_tokens",
        CASE_BYTES,
        CASE_TIME,
        || {
            let mode = Mode::LowLatency {
                max_tokens: 1 << 36,
                capacity: 4,
            };
            let placement = Placement::uniform(4, 1).unwrap();
            let cfg = EpConfig::new(placement, 2, 32, Payload::Fp8, mode).unwrap();
            let ids = Tensor::from_vec(vec![0i32, 1, 2, 3, 1, 2], &[3, 2]).unwrap();
            let d = ep::dispatch(&Local, &cfg, &bf16s(&[3, 32]), &ids, &f32s(&[3, 2])).unwrap();
            assert_eq!(d.overflow, 0);
            assert_eq!(d.x.shape(), &[4, 4, 32]);
        },
    );
}
