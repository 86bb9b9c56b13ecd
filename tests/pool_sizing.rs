//! The state pool sized from free memory and a user budget (`PoolMemory`,
//! `PoolConfig::within`, issue 11's memory item): the budget is
//! `min(user, free − weights to load − headroom)`, the headroom of a V4.1
//! step is the stated per-token estimate (written here from the spec's
//! dimensions), a pool one byte over its budget is a typed out-of-memory
//! error naming the cap that binds, and a pool sized exactly for two
//! sequences runs out of pages as a typed error that leaves the other
//! sequence's logits bitwise those of its solo run.

mod common;

use deepinfer::Device;
use deepinfer::error::Error;
use deepinfer::model::config::{ModelConfig, V41_FLASH_CONFIG};
use deepinfer::model::forward::Model;
use deepinfer::model::pool::{
    CUDA_RESERVE_BYTES, PoolConfig, PoolMemory, StatePool, step_headroom, step_workspace_bytes,
};

const GB: usize = 1_000_000_000;

fn memory(free: usize, weights: usize, headroom: usize, user: Option<usize>) -> PoolMemory {
    PoolMemory {
        free,
        weights_to_load: weights,
        headroom,
        user_budget: user,
    }
}

#[test]
fn the_budget_is_the_smaller_of_the_user_cap_and_the_free_memory_left() {
    // An H200 with an EP-8 rank still to load: 141 GB free, 72.5 GB of
    // weights, 12 GB of headroom.
    let m = memory(141 * GB, 72_500_000_000, 12 * GB, None);
    assert_eq!(m.budget().unwrap(), 56_500_000_000);
    assert_eq!(
        memory(141 * GB, 72_500_000_000, 12 * GB, Some(GB))
            .budget()
            .unwrap(),
        GB
    );
    assert_eq!(
        memory(141 * GB, 72_500_000_000, 12 * GB, Some(100 * GB))
            .budget()
            .unwrap(),
        56_500_000_000
    );
    // Nothing left: weights and headroom take it all, or a zero cap.
    for m in [
        memory(80 * GB, 72_500_000_000, 12 * GB, None),
        memory(80 * GB, 0, 0, Some(0)),
    ] {
        let e = m.budget().unwrap_err();
        assert!(
            matches!(e.op(), Some(Error::OutOfMemory { available: 0, .. })),
            "{e}"
        );
    }
    // Which cap binds is named.
    let user = memory(141 * GB, 0, 0, Some(1000)).check(1001).unwrap_err();
    assert!(
        user.to_string().contains("pool_memory") && user.to_string().contains("1000 available"),
        "{user}"
    );
    let free = memory(2000, 500, 500, Some(5000)).check(1001).unwrap_err();
    let text = free.to_string();
    assert!(
        text.contains("needs 1001 bytes")
            && text.contains("2000 bytes free")
            && text.contains("1000 available"),
        "{text}"
    );
    memory(2000, 500, 500, Some(5000)).check(1000).unwrap();
}

#[test]
fn a_v41_steps_headroom_is_its_logits_and_twice_a_layers_activations_per_token() {
    let cfg = ModelConfig::from_hf_json(V41_FLASH_CONFIG).unwrap();
    // Per token: logits 129280 × 4; twice (streams in and out 2 × 4 × 5120
    // × 4, q and attention output 2 × 64 × 512 × 2, six routed rows of
    // (5120 + 2 × 2304) × 2).
    let layer = 2 * 4 * 5120 * 4 + 2 * 64 * 512 * 2 + 6 * (5120 + 2 * 2304) * 2;
    let per_token = 129_280 * 4 + 2 * layer;
    assert_eq!(per_token, 1_340_416);
    assert_eq!(step_workspace_bytes(&cfg, 1), per_token);
    assert_eq!(step_workspace_bytes(&cfg, 8192), 8192 * per_token);
    assert_eq!(step_workspace_bytes(&cfg, usize::MAX), usize::MAX);
    assert_eq!(step_headroom(&Device::Cpu, &cfg, 8192), 0);
    assert_eq!(CUDA_RESERVE_BYTES, 1 << 30);
}

#[test]
fn a_pool_fits_its_budget_to_the_byte() {
    let (model, _) = common::tiny::tiny_model(5);
    let cfg = &model.cfg;
    let exact = PoolConfig::fitting(cfg, 3, 100, 100, 16).unwrap();
    let bytes = exact.memory_bytes(cfg).unwrap();
    let within = |budget| {
        PoolConfig::within(
            cfg,
            &memory(usize::MAX, 0, 0, Some(budget)),
            3,
            100,
            100,
            16,
        )
    };
    assert_eq!(within(bytes).unwrap(), exact);
    let e = within(bytes - 1).unwrap_err();
    assert!(
        matches!(e.op(), Some(Error::OutOfMemory { bytes: b, available, .. }) if *b == bytes && *available == bytes - 1),
        "{e}"
    );
    // From the host's own free memory: the tiny pool fits.
    let host = PoolMemory::query(&Device::Cpu, 0, 0, None).unwrap();
    assert!(host.free > bytes);
    PoolConfig::within(cfg, &host, 3, 100, 100, 16).unwrap();
}

fn logits_bits(model: &Model, pool: &mut StatePool, seq: u64, tokens: &[u32]) -> Vec<u32> {
    let out = model.forward(pool, seq, tokens).unwrap();
    out.logits
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

#[test]
fn running_out_of_a_budget_sized_pool_is_a_typed_error_that_spares_the_neighbour() {
    let (model, _) = common::tiny::tiny_model(6);
    let cfg = &model.cfg;
    let context = 40;
    let pc = PoolConfig::fitting(cfg, 2, context, context, 4).unwrap();
    let budget = pc.memory_bytes(cfg).unwrap();
    let pc = PoolConfig::within(
        cfg,
        &memory(usize::MAX, 0, 0, Some(budget)),
        2,
        context,
        context,
        4,
    )
    .unwrap();
    let tokens: Vec<u32> = (0..2 * context as u32)
        .map(|i| (i * 53 + 11) % 512)
        .collect();
    // B alone, in a pool of its own.
    let mut solo = StatePool::new(cfg, &Device::Cpu, pc).unwrap();
    let b = solo.add_sequence().unwrap();
    let want: Vec<Vec<u32>> = (0..context)
        .map(|t| logits_bits(&model, &mut solo, b, &tokens[t..=t]))
        .collect();
    // B's first half; then A runs on past the context the pool was sized
    // for until the pages run out (it takes B's future pages, which a
    // shared free list allows); the engine then frees A, and B finishes.
    let mut pool = StatePool::new(cfg, &Device::Cpu, pc).unwrap();
    let (a, b) = (pool.add_sequence().unwrap(), pool.add_sequence().unwrap());
    let half = context / 2;
    for (t, want) in want.iter().enumerate().take(half) {
        let got = logits_bits(&model, &mut pool, b, &tokens[t..=t]);
        assert!(got == *want, "B's step {t} differs from its solo run");
    }
    let mut failed_at = None;
    for u in 0..tokens.len() {
        if let Err(e) = model.forward(&mut pool, a, &tokens[u..=u]) {
            assert!(matches!(e.op(), Some(Error::OutOfPages { .. })), "{e}");
            assert_eq!(pool.position(a).unwrap(), u, "a failed step moves nothing");
            failed_at = Some(u);
            break;
        }
    }
    let at = failed_at.expect("A never ran out of pages");
    assert!(
        at >= context,
        "A ran out at {at}, inside the context the pool holds"
    );
    pool.free_sequence(a).unwrap();
    for (t, want) in want.iter().enumerate().skip(half) {
        let got = logits_bits(&model, &mut pool, b, &tokens[t..=t]);
        assert!(got == *want, "B's step {t} differs from its solo run");
    }
}
