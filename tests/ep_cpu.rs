//! Expert parallelism on the CPU (runs in CI): route → dispatch → grouped
//! FP4 GEMMs → combine over a simulated world of R ∈ {1, 2, 8, 64} ranks
//! equals the single-rank MoE bitwise, in both modes, with both payloads,
//! with the uniform and a balanced placement (replicas); the low-latency
//! mode's overflow is counted exactly; the placement and the load balancer
//! keep their invariants; the simulated world fails, never hangs, when a
//! rank errors, panics or leaves early; and bad input is a typed error.

mod common;

use common::ep::{Problem, bits, ep_rank, problem, shards, single_rank, t};
use deepinfer::ep::{
    self, EpConfig, ExpertLoad, Local, Mode, Payload, Placement, SimRank, SimWorld, Transport,
};
use deepinfer::{Error, Tensor};
use half::bf16;
use rand::Rng;
use std::time::Duration;

fn ep_world(cfg: &EpConfig, p: &Problem, shards: &[(usize, usize)]) -> (Vec<bf16>, usize) {
    let per_rank = SimWorld::run(cfg.placement().ranks(), |rank: &SimRank<'_>| {
        ep_rank(rank, cfg, p, shards[rank.rank()])
    })
    .unwrap();
    let overflow = per_rank.iter().map(|r| r.1).sum();
    (per_rank.into_iter().flat_map(|r| r.0).collect(), overflow)
}

#[test]
fn dispatch_gemm_combine_equals_the_single_rank_moe_bitwise() {
    let mut rng = common::rng("ep_equals_single_rank");
    let (n_experts, top_k, d, inter) = (64, 6, 64, 96);
    for &world in &[1usize, 2, 8, 64] {
        let tokens = rng.random_range(1..=3 * world + 20);
        let p = problem(&mut rng, tokens, n_experts, top_k, d, inter);
        let want = bits(&single_rank(&p));
        let shards = shards(&mut rng, tokens, world);
        let max_tokens = shards.iter().map(|s| s.1).max().unwrap_or(0).max(1);
        // A skewed load for the balanced placement: one slot to spare per rank.
        let load: Vec<u64> = (0..n_experts as u64).map(|e| 1 + 1000 / (e + 1)).collect();
        let placements = [
            Placement::uniform(n_experts, world).unwrap(),
            ep::balance(&load, world, (n_experts / world + 1).min(n_experts)).unwrap(),
        ];
        for placement in &placements {
            for payload in [Payload::Bf16, Payload::Fp8] {
                for mode in [Mode::Normal, Mode::low_latency(max_tokens, world)] {
                    let cfg = EpConfig::new(placement.clone(), top_k, d, payload, mode).unwrap();
                    let (got, overflow) = ep_world(&cfg, &p, &shards);
                    assert_eq!(overflow, 0, "world {world} {payload:?} {mode:?}");
                    assert_eq!(
                        bits(&got),
                        want,
                        "world {world}, {payload:?}, {mode:?}, table {:?}",
                        placement.table()
                    );
                }
            }
        }
    }
}

#[test]
fn the_local_transport_runs_the_same_dispatch() {
    let mut rng = common::rng("ep_local");
    let p = problem(&mut rng, 37, 16, 4, 64, 64);
    let want = bits(&single_rank(&p));
    for mode in [Mode::Normal, Mode::low_latency(37, 1)] {
        let cfg = EpConfig::new(
            Placement::uniform(16, 1).unwrap(),
            4,
            64,
            Payload::Fp8,
            mode,
        )
        .unwrap();
        let (got, overflow) = ep_rank(&Local, &cfg, &p, (0, 37)).unwrap();
        assert_eq!((bits(&got), overflow), (want.clone(), 0), "{mode:?}");
    }
}

#[test]
fn low_latency_overflow_is_counted_and_spares_the_other_tokens() {
    let mut rng = common::rng("ep_overflow");
    let (n_experts, top_k, d, world) = (8, 3, 64, 4);
    let tokens = 48;
    let p = problem(&mut rng, tokens, n_experts, top_k, d, 64);
    let want = single_rank(&p);
    let shards: Vec<(usize, usize)> = (0..world).map(|r| (r * 12, 12)).collect();
    let capacity = 7;
    let cfg = EpConfig::new(
        Placement::uniform(n_experts, world).unwrap(),
        top_k,
        d,
        Payload::Bf16,
        Mode::LowLatency {
            max_tokens: 12,
            capacity,
        },
    )
    .unwrap();
    let (got, overflow) = ep_world(&cfg, &p, &shards);
    // Each expert keeps its first `capacity` entries in token order (the
    // shards are contiguous, so source rank then token is token order).
    let ids: Vec<i32> = p.ids.to_vec().unwrap();
    let mut seen = vec![0usize; n_experts];
    let mut intact = vec![true; tokens];
    let mut dropped = 0;
    for (j, &e) in ids.iter().enumerate() {
        let e = e as usize;
        if seen[e] >= capacity {
            intact[j / top_k] = false;
            dropped += 1;
        }
        seen[e] += 1;
    }
    assert!(dropped > 0, "the case must overflow");
    assert_eq!(overflow, dropped);
    for tok in (0..tokens).filter(|&t| intact[t]) {
        assert_eq!(
            bits(&got[tok * d..(tok + 1) * d]),
            bits(&want[tok * d..(tok + 1) * d]),
            "token {tok}"
        );
    }
}

#[test]
fn uniform_and_table_placements_check_their_invariants() {
    let u = Placement::uniform(12, 4).unwrap();
    assert_eq!(u.local_experts(2), &[6, 7, 8]);
    assert_eq!(u.replicas(5), &[5]);
    assert!(u.local_experts(4).is_empty());
    for (e, ranks, table, what) in [
        (4, 2, vec![0, 1, 2, 9], "past the expert count"),
        (4, 2, vec![0, 1, 2, 2], "no physical slot"),
        (4, 2, vec![1, 0, 2, 3], "ascending"),
        (4, 2, vec![0, 1, 2], "multiple of ranks"),
        (4, 0, vec![0, 1, 2, 3], "multiple of ranks"),
    ] {
        let err = Placement::from_table(e, ranks, table).unwrap_err();
        assert!(
            err.to_string().contains("table") && err.to_string().contains(what),
            "{err}"
        );
    }
    assert!(Placement::uniform(10, 4).is_err());
    // Absurd sizes are typed errors before anything is allocated.
    for e in [
        Placement::uniform(usize::MAX, 1).unwrap_err(),
        Placement::uniform(1 << 21, 1 << 21).unwrap_err(),
        Placement::from_table(usize::MAX, 1, vec![0]).unwrap_err(),
        ep::balance(&[1, 2, 3], usize::MAX, 2).unwrap_err(),
        ep::balance(&[1, 2, 3], 1 << 20, 3).unwrap_err(),
        ExpertLoad::new(usize::MAX).unwrap_err(),
    ] {
        assert!(e.to_string().contains("2^"), "{e}");
    }
    let r = Placement::from_table(3, 2, vec![0, 1, 0, 2]).unwrap();
    assert_eq!(r.replicas(0), &[0, 2]);
    // Replica choice: (source rank + token) mod replicas.
    assert_eq!(r.physical(0, 0, 0), Some(0));
    assert_eq!(r.physical(0, 0, 1), Some(2));
    assert_eq!(r.physical(0, 1, 1), Some(0));
    assert_eq!(r.physical(3, 0, 0), None);
}

/// Per-rank load recomputed from the table alone.
fn rank_loads(table: &[usize], ranks: usize, load: &[u64]) -> Vec<f64> {
    let per = table.len() / ranks;
    let mut copies = vec![0usize; load.len()];
    for &e in table {
        copies[e] += 1;
    }
    (0..ranks)
        .map(|r| {
            table[r * per..(r + 1) * per]
                .iter()
                .map(|&e| load[e] as f64 / copies[e] as f64)
                .sum()
        })
        .collect()
}

fn max_over_mean(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max) / (v.iter().sum::<f64>() / v.len() as f64)
}

#[test]
fn the_balancer_evens_a_skewed_load_with_replicas_of_the_hot_experts() {
    let mut rng = common::rng("ep_balance");
    let (n, ranks) = (64usize, 8usize);
    // Zipf-like: a few hot experts, shuffled so that id order is no help.
    let mut load: Vec<u64> = (0..n as u64).map(|e| 10 + 20_000 / (e + 1)).collect();
    for i in (1..n).rev() {
        load.swap(i, rng.random_range(0..=i));
    }
    let uniform = Placement::uniform(n, ranks).unwrap();
    let u = max_over_mean(&rank_loads(uniform.table(), ranks, &load));
    let balanced = ep::balance(&load, ranks, n / ranks + 2).unwrap();
    let b = max_over_mean(&rank_loads(balanced.table(), ranks, &load));
    assert!((b - balanced.imbalance(&load)).abs() < 1e-12);
    assert!(b < u && b < 1.10, "balanced {b} vs uniform {u}");
    // The hottest expert is replicated; a cold one is not.
    let hot = (0..n).max_by_key(|&e| load[e]).unwrap();
    let cold = (0..n).min_by_key(|&e| load[e]).unwrap();
    assert!(balanced.replicas(hot).len() > 1);
    assert_eq!(balanced.replicas(cold).len(), 1);
    // Deterministic.
    assert_eq!(ep::balance(&load, ranks, n / ranks + 2).unwrap(), balanced);
    // Infeasible shapes are typed errors.
    assert!(ep::balance(&load, ranks, 7).is_err());
    assert!(ep::balance(&load[..4], 2, 5).is_err());
    assert!(ep::balance(&[], 2, 1).is_err());
}

#[test]
fn the_balancer_places_every_random_load_validly() {
    let mut rng = common::rng("ep_balance_random");
    for _ in 0..300 {
        let n = rng.random_range(1..40usize);
        let ranks = rng.random_range(1..9usize);
        let per = rng.random_range(n.div_ceil(ranks)..=n);
        let load: Vec<u64> = (0..n)
            .map(|_| {
                if rng.random_bool(0.2) {
                    0
                } else {
                    rng.random_range(0..10_000)
                }
            })
            .collect();
        let p = ep::balance(&load, ranks, per)
            .unwrap_or_else(|e| panic!("{n} experts, {ranks} x {per}: {e}"));
        // from_table re-checks every invariant of the table it returns.
        let again = Placement::from_table(n, ranks, p.table().to_vec()).unwrap();
        assert_eq!(again, p);
        assert_eq!(p.table().len(), ranks * per);
    }
}

#[test]
fn the_balancer_is_fast_at_wide_ep_sizes() {
    // 4,096 experts on 4,096 ranks of 16 slots (65,536 slots, 61,440
    // replicas): heaps, not scans of every rank per replica.
    let load: Vec<u64> = (0..4096u64).map(|e| 1 + 1_000_000 / (e + 1)).collect();
    let p = within_a_minute(move || ep::balance(&load, 4096, 16).unwrap());
    assert_eq!(p.table().len(), 4096 * 16);
}

#[test]
fn expert_load_counts_ids_and_refuses_bad_ones() {
    let mut l = ExpertLoad::new(4).unwrap();
    l.observe(&[0, 3, 3, 1]).unwrap();
    l.observe(&[3]).unwrap();
    assert_eq!(l.counts(), &[1, 1, 0, 3]);
    let e = l.observe(&[1, 4]).unwrap_err();
    assert!(
        e.to_string().contains("ids") && e.to_string().contains('4'),
        "{e}"
    );
    assert_eq!(l.counts(), &[1, 1, 0, 3], "a refused batch counts nothing");
}

/// Runs `f` on a thread and fails the test when it takes over 60 s (a hang).
fn within_a_minute<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the simulated world hung")
}

fn one_row(v: f32) -> Vec<Tensor> {
    vec![t(vec![v], &[1])]
}

#[test]
fn a_failing_panicking_or_departing_rank_stops_the_world_without_a_hang() {
    // Rank 2 errors before the first collective: the others fail theirs and
    // the world reports rank 2's own error.
    let r = within_a_minute(|| {
        SimWorld::run(4, |rank| {
            if rank.rank() == 2 {
                return Err(Error::Argument {
                    op: "test",
                    arg: "rank",
                    value: "2".into(),
                    why: "chosen to fail",
                });
            }
            rank.all_to_all_v((0..4).map(|_| t(vec![1.0f32], &[1])).collect())?;
            Ok(())
        })
    });
    assert!(r.unwrap_err().to_string().contains("chosen to fail"));
    // A panic is an error too.
    let r = within_a_minute(|| {
        SimWorld::run(3, |rank| {
            if rank.rank() == 0 {
                panic!("rank 0 panics on purpose");
            }
            rank.all_to_all_v((0..3).map(|_| t(vec![1.0f32], &[1])).collect())?;
            Ok(())
        })
    });
    assert!(r.unwrap_err().to_string().contains("rank 0 panicked"));
    // Rank 1 does one collective fewer than the others.
    let r = within_a_minute(|| {
        SimWorld::run(2, |rank| {
            let rounds = if rank.rank() == 1 { 1 } else { 2 };
            for _ in 0..rounds {
                rank.all_to_all_v(vec![one_row(1.0).remove(0), one_row(2.0).remove(0)])?;
            }
            Ok(())
        })
    });
    assert!(r.unwrap_err().to_string().contains("rank 1 left"));
    // And a healthy world delivers what each rank sent.
    let got = within_a_minute(|| {
        SimWorld::run(3, |rank| {
            let send = (0..3)
                .map(|d| t(vec![(10 * rank.rank() + d) as f32], &[1]))
                .collect();
            let recv = rank.all_to_all_v(send)?;
            recv.iter()
                .map(|x| Ok(x.to_vec::<f32>()?[0]))
                .collect::<deepinfer::Result<Vec<f32>>>()
        })
    })
    .unwrap();
    assert_eq!(
        got,
        vec![
            vec![0.0, 10.0, 20.0],
            vec![1.0, 11.0, 21.0],
            vec![2.0, 12.0, 22.0]
        ]
    );
    assert!(SimWorld::run(0, |_| Ok(())).is_err());
}

#[test]
fn bad_input_is_a_typed_error_naming_it() {
    let mut rng = common::rng("ep_errors");
    let p = problem(&mut rng, 5, 8, 2, 64, 64);
    let cfg = EpConfig::new(
        Placement::uniform(8, 1).unwrap(),
        2,
        64,
        Payload::Fp8,
        Mode::Normal,
    )
    .unwrap();
    let named = |e: Error, what: &str| assert!(e.to_string().contains(what), "{e} lacks {what}");
    // An id out of range.
    let mut ids: Vec<i32> = p.ids.to_vec().unwrap();
    ids[3] = 8;
    named(
        ep::dispatch(&Local, &cfg, &p.x, &t(ids, &[5, 2]), &p.weights).unwrap_err(),
        "ids",
    );
    // ... on every path: the low-latency mode, and a rank of a world whose
    // peers then fail their collective instead of waiting for it.
    let mut ids: Vec<i32> = p.ids.to_vec().unwrap();
    ids[3] = -1;
    let bad_ids = t(ids, &[5, 2]);
    let ll = EpConfig::new(
        Placement::uniform(8, 1).unwrap(),
        2,
        64,
        Payload::Bf16,
        Mode::low_latency(5, 1),
    )
    .unwrap();
    named(
        ep::dispatch(&Local, &ll, &p.x, &bad_ids, &p.weights).unwrap_err(),
        "ids",
    );
    let two = EpConfig::new(
        Placement::uniform(8, 2).unwrap(),
        2,
        64,
        Payload::Fp8,
        Mode::Normal,
    )
    .unwrap();
    let (x, w, bad) = (p.x.clone(), p.weights.clone(), bad_ids.clone());
    let good = p.ids.clone();
    let res = within_a_minute(move || {
        let outcome = std::sync::Mutex::new(Vec::new());
        let r = SimWorld::run(2, |rank| {
            let ids = if rank.rank() == 1 { &bad } else { &good };
            let got = ep::dispatch(rank, &two, &x, ids, &w).map(|_| ());
            outcome
                .lock()
                .unwrap()
                .push((rank.rank(), got.as_ref().err().map(|e| e.to_string())));
            got
        });
        (
            r.map(|_| ()).map_err(|e| e.to_string()),
            outcome.into_inner().unwrap(),
        )
    });
    let (r, mut each) = res;
    each.sort();
    assert!(
        r.unwrap_err().contains("ids"),
        "the world reports the bad rank's own error"
    );
    assert!(
        each[0]
            .1
            .as_deref()
            .is_some_and(|e| e.contains("collective")),
        "{each:?}"
    );
    assert!(
        each[1].1.as_deref().is_some_and(|e| e.contains("ids")),
        "{each:?}"
    );
    // Shapes and dtypes.
    named(
        ep::dispatch(
            &Local,
            &cfg,
            &p.x.narrow_rows(0, 4).unwrap(),
            &p.ids,
            &p.weights,
        )
        .unwrap_err(),
        "ids",
    );
    named(
        ep::dispatch(&Local, &cfg, &p.x, &p.ids, &p.ids).unwrap_err(),
        "weights",
    );
    named(
        ep::dispatch(&Local, &cfg, &p.ids, &p.ids, &p.weights).unwrap_err(),
        "`x`",
    );
    // The placement is for another world.
    let two = EpConfig::new(
        Placement::uniform(8, 2).unwrap(),
        2,
        64,
        Payload::Fp8,
        Mode::Normal,
    )
    .unwrap();
    named(
        ep::dispatch(&Local, &two, &p.x, &p.ids, &p.weights).unwrap_err(),
        "transport",
    );
    // Too many tokens for the low-latency buffers.
    let ll = EpConfig::new(
        Placement::uniform(8, 1).unwrap(),
        2,
        64,
        Payload::Bf16,
        Mode::low_latency(4, 1),
    )
    .unwrap();
    named(
        ep::dispatch(&Local, &ll, &p.x, &p.ids, &p.weights).unwrap_err(),
        "max_tokens",
    );
    // Contradictory configs.
    let pl = || Placement::uniform(8, 1).unwrap();
    named(
        EpConfig::new(pl(), 0, 64, Payload::Bf16, Mode::Normal).unwrap_err(),
        "top_k",
    );
    named(
        EpConfig::new(pl(), 9, 64, Payload::Bf16, Mode::Normal).unwrap_err(),
        "top_k",
    );
    named(
        EpConfig::new(pl(), 2, 48, Payload::Fp8, Mode::Normal).unwrap_err(),
        "hidden",
    );
    named(
        EpConfig::new(
            pl(),
            2,
            64,
            Payload::Bf16,
            Mode::LowLatency {
                max_tokens: 1,
                capacity: usize::MAX,
            },
        )
        .unwrap_err(),
        "capacity",
    );
    // Combine with the wrong expert output or shared shape.
    let got = ep::dispatch(&Local, &cfg, &p.x, &p.ids, &p.weights).unwrap();
    let n = got.handle.out_rows();
    let wrong = t(vec![bf16::ZERO; (n + 1) * 64], &[n + 1, 64]);
    named(
        ep::combine(&Local, &got.handle, &wrong, &p.shared).unwrap_err(),
        "expert_out",
    );
    let right = t(vec![bf16::ZERO; n * 64], &[n, 64]);
    named(
        ep::combine(&Local, &got.handle, &right, &p.x.narrow_rows(0, 4).unwrap()).unwrap_err(),
        "shared",
    );
    // A gather past the rows.
    named(
        deepinfer::ops::gather_rows(&p.x, &[0, 5]).unwrap_err(),
        "rows",
    );
}

/// `copy_rows_into` writes exactly the named rows of the destination's
/// matrix view (leading dimensions flattened) and leaves the others; bad
/// lists are typed errors that change nothing.
#[test]
fn copy_rows_into_writes_the_named_rows_and_nothing_else() {
    use deepinfer::{DType, Device, ops};
    let named = |e: Error, what: &str| assert!(e.to_string().contains(what), "{e} lacks {what}");
    let mut rng = common::rng("copy_rows_into");
    for (dtype, width) in [(DType::BF16, 64usize), (DType::F8E4M3, 33), (DType::F32, 3)] {
        let bytes = |rng: &mut rand::rngs::StdRng, n: usize| -> Vec<u8> {
            (0..dtype.storage_bytes(n)).map(|_| rng.random()).collect()
        };
        let src_rows_n = rng.random_range(1..40usize);
        let src_bytes = bytes(&mut rng, src_rows_n * width);
        let src =
            Tensor::from_le_bytes(&Device::Cpu, dtype, &[src_rows_n, width], &src_bytes).unwrap();
        // dst is [4, 6, width]: 24 rows in its matrix view.
        let dst_bytes = bytes(&mut rng, 24 * width);
        let mut dst =
            Tensor::from_le_bytes(&Device::Cpu, dtype, &[4, 6, width], &dst_bytes).unwrap();
        let mut dst_rows: Vec<usize> = (0..24).collect();
        for i in (1..dst_rows.len()).rev() {
            dst_rows.swap(i, rng.random_range(0..=i));
        }
        dst_rows.truncate(rng.random_range(0..24));
        let src_rows: Vec<usize> = dst_rows
            .iter()
            .map(|_| rng.random_range(0..src_rows_n))
            .collect();
        ops::copy_rows_into(&mut dst, &dst_rows, &src, &src_rows).unwrap();
        let rb = dtype.storage_bytes(width);
        let mut want = dst_bytes.clone();
        for (&d, &s) in dst_rows.iter().zip(&src_rows) {
            want[d * rb..(d + 1) * rb].copy_from_slice(&src_bytes[s * rb..(s + 1) * rb]);
        }
        assert_eq!(dst.to_le_bytes().unwrap(), want, "{dtype}");
        // Typed errors, and the destination unchanged.
        let before = dst.to_le_bytes().unwrap();
        for (d, s, what) in [
            (vec![0, 1], vec![0], "src_rows"),
            (vec![24], vec![0], "dst_rows"),
            (vec![3, 3], vec![0, 0], "dst_rows"),
            (vec![0], vec![src_rows_n], "src_rows"),
        ] {
            named(
                ops::copy_rows_into(&mut dst, &d, &src, &s).unwrap_err(),
                what,
            );
        }
        let narrow =
            Tensor::from_le_bytes(&Device::Cpu, dtype, &[1, 1], &bytes(&mut rng, 1)).unwrap();
        named(
            ops::copy_rows_into(&mut dst, &[0], &narrow, &[0]).unwrap_err(),
            "src",
        );
        assert_eq!(
            dst.to_le_bytes().unwrap(),
            before,
            "{dtype}: an error wrote rows"
        );
    }
}

/// The preallocated low-latency path of a one-rank group (its ops' CPU
/// reference): reused across calls of different token counts, it equals
/// the single-rank MoE bitwise; past a capacity, each expert keeps its first
/// entries in token order, the overflow is counted exactly and read only
/// when asked, and the other tokens are untouched; bad ids are reported
/// lazily, naming `ids`.
#[test]
fn the_low_latency_buffer_is_reused_counts_overflow_and_reports_bad_ids() {
    use common::ep::masked_rank;
    use deepinfer::ep::LowLatencyBuffer;
    use deepinfer::{DType, Device};
    let mut rng = common::rng("ep_ll_buffer");
    let (n_experts, top_k, d) = (16, 4, 64);
    let max_tokens = 40;
    for payload in [Payload::Bf16, Payload::Fp8] {
        let cfg = EpConfig::new(
            Placement::uniform(n_experts, 1).unwrap(),
            top_k,
            d,
            payload,
            Mode::low_latency(max_tokens, 1),
        )
        .unwrap();
        let mut buf = LowLatencyBuffer::new(&cfg, &Device::Cpu).unwrap();
        for tokens in [37, 1, 40, 0] {
            let p = problem(&mut rng, tokens, n_experts, top_k, d, 64);
            let (got, overflow) = masked_rank(&mut buf, &cfg, &p).unwrap();
            assert_eq!(overflow, 0);
            assert_eq!(bits(&got), bits(&single_rank(&p)), "{payload:?} {tokens}");
        }
    }
    // Overflow: capacity 3 for 30 tokens over 8 experts.
    let (n_experts, tokens, capacity) = (8, 30, 3);
    let p = problem(&mut rng, tokens, n_experts, 2, d, 64);
    let cfg = EpConfig::new(
        Placement::uniform(n_experts, 1).unwrap(),
        2,
        d,
        Payload::Fp8,
        Mode::LowLatency {
            max_tokens: tokens,
            capacity,
        },
    )
    .unwrap();
    let mut buf = LowLatencyBuffer::new(&cfg, &Device::Cpu).unwrap();
    let (got, overflow) = masked_rank(&mut buf, &cfg, &p).unwrap();
    let ids: Vec<i32> = p.ids.to_vec().unwrap();
    let mut seen = vec![0usize; n_experts];
    let mut intact = vec![true; tokens];
    let mut dropped = 0;
    for (j, &e) in ids.iter().enumerate() {
        if seen[e as usize] >= capacity {
            intact[j / 2] = false;
            dropped += 1;
        }
        seen[e as usize] += 1;
    }
    assert!(dropped > 0, "the case must overflow");
    assert_eq!(overflow, dropped);
    let counts: Vec<i32> = buf.counts().to_vec().unwrap();
    let want: Vec<i32> = seen.iter().map(|&s| s.min(capacity) as i32).collect();
    assert_eq!(counts, want);
    let want_out = single_rank(&p);
    for tok in (0..tokens).filter(|&t| intact[t]) {
        assert_eq!(
            bits(&got[tok * d..(tok + 1) * d]),
            bits(&want_out[tok * d..(tok + 1) * d]),
            "token {tok}"
        );
    }
    // Bad ids: the dispatch itself succeeds (no host check), the overflow
    // read names them; shapes past max_tokens are refused up front.
    let mut bad: Vec<i32> = p.ids.to_vec().unwrap();
    bad[5] = n_experts as i32;
    bad[8] = -3;
    buf.dispatch(&p.x, &t(bad, &[tokens, 2]), &p.weights)
        .unwrap();
    let e = buf.overflow().unwrap_err().to_string();
    assert!(e.contains("ids") && e.contains("2 entries"), "{e}");
    let big = Tensor::zeros(&Device::Cpu, DType::BF16, &[tokens + 1, d]).unwrap();
    let e = buf.dispatch(&big, &p.ids, &p.weights).unwrap_err();
    assert!(e.to_string().contains("max_tokens"), "{e}");
    assert!(
        LowLatencyBuffer::new(
            &EpConfig::new(
                Placement::uniform(8, 2).unwrap(),
                2,
                d,
                Payload::Bf16,
                Mode::low_latency(4, 2)
            )
            .unwrap(),
            &Device::Cpu
        )
        .is_err()
    );
}

/// The masked-layout ops refuse bad shapes and dtypes with typed errors
/// naming the tensor.
#[test]
fn the_masked_ops_refuse_bad_shapes_naming_the_tensor() {
    use deepinfer::{DType, Device, ops};
    let named = |e: Error, what: &str| assert!(e.to_string().contains(what), "{e} lacks {what}");
    let z = |dtype: DType, shape: &[usize]| Tensor::zeros(&Device::Cpu, dtype, shape).unwrap();
    let (ids, w) = (z(DType::I32, &[4, 2]), z(DType::F32, &[4, 2]));
    let (mut counts, mut w_out, mut dropped) = (
        z(DType::I32, &[8]),
        z(DType::F32, &[8, 3]),
        z(DType::I32, &[9]),
    );
    let mut short = z(DType::I32, &[3, 2]);
    named(
        ops::moe_masked_layout_into(&ids, &w, &mut short, &mut counts, &mut w_out, &mut dropped)
            .unwrap_err(),
        "pos",
    );
    let mut pos = z(DType::I32, &[5, 2]);
    named(
        ops::moe_masked_layout_into(&ids, &ids, &mut pos, &mut counts, &mut w_out, &mut dropped)
            .unwrap_err(),
        "weights",
    );
    let mut few = z(DType::I32, &[8]);
    named(
        ops::moe_masked_layout_into(&ids, &w, &mut pos, &mut counts, &mut w_out, &mut few)
            .unwrap_err(),
        "dropped",
    );
    ops::moe_masked_layout_into(&ids, &w, &mut pos, &mut counts, &mut w_out, &mut dropped).unwrap();
    let x = z(DType::BF16, &[4, 48]);
    let mut q = z(DType::F8E4M3, &[8, 3, 48]);
    let mut s = z(DType::E8M0, &[8, 3, 1]);
    named(
        ops::moe_masked_scatter_into(&x, &pos, &mut q, Some(&mut s)).unwrap_err(),
        "32",
    );
    let mut rows = z(DType::BF16, &[8, 3, 48]);
    named(
        ops::moe_masked_scatter_into(&x, &pos, &mut rows, Some(&mut s)).unwrap_err(),
        "out",
    );
    let mut y = z(DType::BF16, &[4, 48]);
    named(
        ops::moe_masked_combine_into(&rows, &short, &x, &mut y).unwrap_err(),
        "pos",
    );
    named(
        ops::moe_masked_combine_into(&z(DType::BF16, &[8, 3, 40]), &pos, &x, &mut y).unwrap_err(),
        "rows",
    );
    ops::moe_masked_combine_into(&rows, &pos, &x, &mut y).unwrap();
}

/// `gather_row_blocks` equals `gather_rows` over the blocks' rows (whole
/// blocks, a partial last block, repeats, none), and bad blocks, block
/// sizes and row counts are typed errors naming the argument.
#[test]
fn gather_row_blocks_equals_gather_rows_over_the_blocks() {
    let mut rng = common::rng("gather_row_blocks_cpu");
    let (rows, width, block) = (70, 5, 8);
    let x = t(
        (0..rows * width)
            .map(|_| bf16::from_f32(rng.random_range(-4.0..4.0)))
            .collect(),
        &[rows, width],
    );
    let whole = rows / block;
    for blocks in [vec![3, 0, 7, 7, 1], vec![6], Vec::new()] {
        for n in [
            blocks.len() * block,
            (blocks.len() * block).saturating_sub(3),
            0,
        ] {
            let idx: Vec<usize> = blocks
                .iter()
                .flat_map(|&b| b * block..(b + 1) * block)
                .take(n)
                .collect();
            let want = deepinfer::ops::gather_rows(&x, &idx).unwrap();
            let got = deepinfer::ops::gather_row_blocks(&x, block, &blocks, n).unwrap();
            assert_eq!(got.shape(), want.shape(), "{blocks:?} {n}");
            assert_eq!(
                got.to_le_bytes().unwrap(),
                want.to_le_bytes().unwrap(),
                "{blocks:?} {n}"
            );
        }
    }
    let arg = |e: Error| match e {
        Error::Argument { arg, .. } => arg,
        e => panic!("not an argument error: {e}"),
    };
    let go = |b: usize, blocks: &[usize], n: usize| {
        deepinfer::ops::gather_row_blocks(&x, b, blocks, n).unwrap_err()
    };
    assert_eq!(arg(go(block, &[whole], 1)), "blocks");
    assert_eq!(arg(go(0, &[0], 0)), "block_rows");
    assert_eq!(arg(go(block, &[0, 1], 2 * block + 1)), "n");
}

/// `copy_rows_where` (device lists, −1 for no copy) writes the pairs whose
/// rows lie inside both tensors and skips the others (−1, i32::MIN, the row
/// count, i32::MAX on either side), against a byte-level reference written
/// here; wrong dtypes, ranks and lengths are typed errors.
#[test]
fn copy_rows_where_copies_the_pairs_inside_and_skips_the_rest() {
    use deepinfer::{DType, Device, ops};
    let named = |e: Error, what: &str| assert!(e.to_string().contains(what), "{e} lacks {what}");
    let mut rng = common::rng("copy_rows_where");
    for (dtype, width) in [(DType::BF16, 64usize), (DType::F8E4M3, 33), (DType::F32, 3)] {
        let bytes = |rng: &mut rand::rngs::StdRng, n: usize| -> Vec<u8> {
            (0..dtype.storage_bytes(n)).map(|_| rng.random()).collect()
        };
        let n_src = rng.random_range(1..40usize);
        let src_bytes = bytes(&mut rng, n_src * width);
        let src = Tensor::from_le_bytes(&Device::Cpu, dtype, &[n_src, width], &src_bytes).unwrap();
        let dst_bytes = bytes(&mut rng, 24 * width);
        let mut dst =
            Tensor::from_le_bytes(&Device::Cpu, dtype, &[4, 6, width], &dst_bytes).unwrap();
        // Distinct destinations, some pairs made void on either side.
        let mut order: Vec<i32> = (0..24).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.random_range(0..=i));
        }
        let void = [-1, i32::MIN, 24, i32::MAX];
        let n = rng.random_range(1..24usize);
        let mut d_rows = Vec::new();
        let mut s_rows = Vec::new();
        for &d in &order[..n] {
            let s = rng.random_range(0..n_src as i32);
            match rng.random_range(0..4) {
                0 => (d_rows.push(void[rng.random_range(0..4)]), s_rows.push(s)),
                1 => (d_rows.push(d), s_rows.push(void[rng.random_range(0..4)])),
                _ => (d_rows.push(d), s_rows.push(s)),
            };
        }
        let list = |v: &[i32]| Tensor::from_vec(v.to_vec(), &[v.len()]).unwrap();
        ops::copy_rows_where(&mut dst, &list(&d_rows), &src, &list(&s_rows)).unwrap();
        let rb = dtype.storage_bytes(width);
        let mut want = dst_bytes.clone();
        for (&d, &s) in d_rows.iter().zip(&s_rows) {
            if (0..24).contains(&d) && (0..n_src as i32).contains(&s) {
                let (d, s) = (d as usize, s as usize);
                want[d * rb..(d + 1) * rb].copy_from_slice(&src_bytes[s * rb..(s + 1) * rb]);
            }
        }
        assert_eq!(dst.to_le_bytes().unwrap(), want, "{dtype}");
        let before = dst.to_le_bytes().unwrap();
        let wide = Tensor::from_vec(vec![0i32, 1], &[1, 2]).unwrap();
        let f32s = Tensor::from_vec(vec![0.0f32], &[1]).unwrap();
        for (d, s, what) in [
            (list(&[0, 1]), list(&[0]), "src_rows"),
            (wide.clone(), list(&[0, 1]), "dst_rows"),
            (f32s.clone(), list(&[0]), "dst_rows"),
            (list(&[0]), f32s, "src_rows"),
        ] {
            named(
                ops::copy_rows_where(&mut dst, &d, &src, &s).unwrap_err(),
                what,
            );
        }
        let narrow =
            Tensor::from_le_bytes(&Device::Cpu, dtype, &[1, 1], &bytes(&mut rng, 1)).unwrap();
        named(
            ops::copy_rows_where(&mut dst, &list(&[0]), &narrow, &list(&[0])).unwrap_err(),
            "src",
        );
        assert_eq!(
            dst.to_le_bytes().unwrap(),
            before,
            "{dtype}: an error wrote"
        );
    }
}
