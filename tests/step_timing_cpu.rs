//! Op-family timing of a step (`Capture::timing`, the per-GPU bench's
//! breakdown): on the CPU the host clock charges the step to embed,
//! Engram, mHC, attention, MoE and head, in the order they first ran, and
//! the families sum to no more than the step; the parts split attention
//! and MoE and sum to their families; off, nothing is recorded.

mod common;

use deepinfer::model::forward::{Capture, SeqInput};
use deepinfer::model::runner::single_sequence_pool;
use std::time::Instant;

#[test]
fn a_timed_step_names_every_op_family_and_sums_within_the_step() {
    let (model, _) = common::tiny::tiny_model(31);
    let tokens: Vec<u32> = (0..12).map(|i| (i * 41 + 9) % 512).collect();
    let mut pool = single_sequence_pool(&model, 16).unwrap();
    let seq = pool.add_sequence().unwrap();
    let timing = Capture {
        timing: true,
        ..Capture::default()
    };
    let t0 = Instant::now();
    let out = model
        .step(
            &mut pool,
            &[SeqInput {
                seq,
                tokens: &tokens[..8],
            }],
            timing,
        )
        .unwrap();
    let wall_ms = t0.elapsed().as_secs_f64() * 1e3;
    let names: Vec<&str> = out.families.iter().map(|f| f.0).collect();
    // Layer 0 has no Engram (the tiny config's are 1 and 4).
    assert_eq!(
        names,
        ["embed", "mhc", "attention", "moe", "engram", "head"]
    );
    assert!(out.families.iter().all(|f| f.1 >= 0.0 && f.1.is_finite()));
    let sum: f64 = out.families.iter().map(|f| f.1).sum();
    assert!(
        sum > 0.0 && sum <= wall_ms,
        "families {sum} ms, step {wall_ms} ms"
    );
    // The parts: attention and MoE split, the others whole; every family's
    // time is the sum of its parts', and on the CPU a part's device time is
    // its host time.
    let parts: Vec<&str> = out.parts.iter().map(|p| p.0).collect();
    assert_eq!(
        parts,
        [
            "embed",
            "mhc",
            "attention.query",
            "attention.kv",
            "attention.lists",
            "attention.mqa",
            "attention.out",
            "moe.route",
            "moe.experts",
            "moe.shared",
            "moe.combine",
            // Layer 1 has Engram; the first index source comes later.
            "engram",
            "attention.index",
            "head"
        ]
    );
    for (family, ms) in &out.families {
        let of_family: f64 = out
            .parts
            .iter()
            .filter(|p| p.0.split('.').next() == Some(family))
            .map(|p| p.1.device_ms)
            .sum();
        assert!(
            (of_family - ms).abs() <= 1e-9 * ms.max(1.0),
            "{family}: parts {of_family} ms, family {ms} ms"
        );
    }
    assert!(out.parts.iter().all(|p| p.1.device_ms == p.1.host_ms));
    let plain = model
        .step(
            &mut pool,
            &[SeqInput {
                seq,
                tokens: &tokens[8..],
            }],
            Capture::default(),
        )
        .unwrap();
    assert!(plain.families.is_empty() && plain.parts.is_empty());
}
