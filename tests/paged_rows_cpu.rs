//! `ops::paged_rows` and `ops::paged_window_rows` on the CPU against an
//! independent model of a paged pool (`common::paged`: a map from (entry,
//! logical page) to physical page), over random tables with missing
//! pages, out-of-range owners, negative and far rows, page sizes 1–256,
//! extreme positions, rows past i32, width 0 and empty batches; wrong shapes and dtypes are typed errors naming the
//! tensor. Also the in-place refill of a step's inputs (`Tensor::write_from`
//! and the step arena, `model::inputs`, which makes the positions and
//! owners these ops read).

mod common;

use deepinfer::{Device, Error, Tensor, ops};

#[test]
fn paged_rows_follow_the_block_tables() {
    let mut rng = common::rng("paged_rows_follow_the_block_tables");
    for case in 0..300 {
        let tokens = [0usize, 1, 5, 33][case % 4];
        let width = [1usize, 7, 64, 130][(case / 4) % 4];
        let p = common::paged::problem(&mut rng, tokens, 1 + case % 9, width);
        let (rows, window) = common::paged::run_on(&p, &Device::Cpu);
        assert_eq!(rows, p.expect_rows, "case {case}: paged_rows");
        assert_eq!(window, p.expect_window, "case {case}: paged_window_rows");
    }
}

#[test]
fn edge_cases_give_their_known_lists() {
    for (p, what) in common::paged::edges() {
        let (rows, window) = common::paged::run_on(&p, &Device::Cpu);
        assert_eq!(rows, p.expect_rows, "{what}: paged_rows");
        assert_eq!(window, p.expect_window, "{what}: paged_window_rows");
    }
}

#[test]
fn bad_shapes_and_dtypes_are_typed_errors() {
    let i32t = |v: Vec<i32>, s: &[usize]| Tensor::from_vec(v, s).unwrap();
    let pages = i32t(vec![0; 6], &[2, 3]);
    let bounds = i32t(vec![0; 6], &[2, 3]);
    let owner = i32t(vec![0; 4], &[4]);
    let idx = i32t(vec![0; 8], &[4, 2]);
    let ok = ops::BlockTables {
        pages: &pages,
        bounds: &bounds,
        page_rows: 4,
    };
    assert!(ops::paged_rows(&idx, &owner, ok).is_ok());
    let named = |r: Result<Tensor, Error>, what: &str| {
        let e = r.expect_err(what).to_string();
        assert!(e.contains(what), "{e} should name {what}");
    };
    let short = i32t(vec![0; 3], &[3]);
    named(ops::paged_rows(&idx, &short, ok), "owner");
    let bad_bounds = i32t(vec![0; 4], &[2, 2]);
    named(
        ops::paged_rows(
            &idx,
            &owner,
            ops::BlockTables {
                bounds: &bad_bounds,
                ..ok
            },
        ),
        "bounds",
    );
    named(
        ops::paged_rows(&idx, &owner, ops::BlockTables { page_rows: 0, ..ok }),
        "page_rows",
    );
    let f32_idx = Tensor::from_vec(vec![0f32; 8], &[4, 2]).unwrap();
    named(ops::paged_rows(&f32_idx, &owner, ok), "idx");
    let i32_pos = i32t(vec![0; 4], &[4]);
    named(ops::paged_window_rows(&i32_pos, &owner, ok, 3), "positions");
}

/// A decode step's static inputs refilled in place on the CPU (the same
/// bodies run on the GPU in `cuda_glue.rs`).
#[test]
fn static_inputs_are_refilled_in_place() {
    let mut rng = common::rng("static_inputs_cpu");
    common::static_inputs::write_from_overwrites_in_place(&Device::Cpu, &mut rng);
    common::static_inputs::step_inputs_reuse_their_slots(&Device::Cpu, &mut rng);
    common::static_inputs::byte_uploads_fill_in_place(&Device::Cpu, &mut rng);
    common::static_inputs::write_rows_from_overwrites_only_its_rows(&Device::Cpu, &mut rng);
}
