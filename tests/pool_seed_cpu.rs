//! Seeding a long context without computing it (`StatePool::seed_context`,
//! `StatePool::fill_rows`, what the per-GPU bench does): a seeded sequence
//! holds the position, compressed entries and ring pages a prefill of the
//! same length leaves, and with every cache row the same pattern its next
//! decode step is bitwise that of a sequence really prefilled to that
//! length whose rows were then overwritten the same way. Bad lengths, a
//! used sequence and running out of pages are typed errors that change
//! nothing.

mod common;

use deepinfer::error::Error;
use deepinfer::kv_format::{encode_row, index_key_row_bytes};
use deepinfer::model::forward::Model;
use deepinfer::model::pool::{PoolConfig, StatePool};
use deepinfer::{DType, Device, Tensor, contract::KvRowFormat};
use half::bf16;

/// One row of each cache, encoded from fixed values: U8 window and
/// compressed rows, an F4E2M1x2 index-key row.
fn patterns(model: &Model) -> (Tensor, Tensor, Tensor) {
    let hd = model.cfg.attention.head_dim;
    let ihd = model.cfg.indexer.head_dim;
    let values = |n: usize| -> Vec<bf16> {
        (0..n)
            .map(|i| bf16::from_f32(((i * 7 % 13) as f32 - 6.0) / 4.0))
            .collect()
    };
    let u8_row = |format| {
        let bytes = encode_row(format, &values(hd));
        let n = bytes.len();
        Tensor::from_le_bytes(&Device::Cpu, DType::U8, &[1, n], &bytes).unwrap()
    };
    let key = encode_row(KvRowFormat::IndexKey, &values(ihd));
    assert_eq!(key.len(), index_key_row_bytes(ihd));
    let keys =
        Tensor::from_le_bytes(&Device::Cpu, DType::F4E2M1x2, &[1, 2 * key.len()], &key).unwrap();
    (
        u8_row(KvRowFormat::Window),
        u8_row(KvRowFormat::Compressed),
        keys,
    )
}

fn engram_ids(model: &Model, tokens: &[u32]) -> Vec<Option<i64>> {
    tokens
        .iter()
        .map(|&t| model.weights.engram_token_map.get(t as usize).copied())
        .collect()
}

#[test]
fn a_seeded_context_decodes_like_a_prefilled_one_with_the_same_rows() {
    let (model, _) = common::tiny::tiny_model(21);
    let cfg = &model.cfg;
    let len = 20;
    let tokens: Vec<u32> = (0..len as u32 + 1).map(|i| (i * 29 + 3) % 512).collect();
    let pc = PoolConfig::fitting(cfg, 2, len + 2, len, 4).unwrap();
    let mut pool = StatePool::new(cfg, &Device::Cpu, pc).unwrap();
    let (real, seeded) = (pool.add_sequence().unwrap(), pool.add_sequence().unwrap());
    model.forward(&mut pool, real, &tokens[..len]).unwrap();
    let free_before = pool.free_pages();
    pool.seed_context(seeded, len, &engram_ids(&model, &tokens[..len]))
        .unwrap();
    let free_after = pool.free_pages();
    assert_eq!(pool.position(seeded).unwrap(), len);
    for plan in model.plans.iter().filter(|p| p.is_kv_source()) {
        assert_eq!(
            pool.entries(seeded, plan.layer).unwrap(),
            pool.entries(real, plan.layer).unwrap(),
            "layer {}",
            plan.layer
        );
        assert!(!pool.has_pending(seeded, plan.layer).unwrap());
    }
    // The seeded sequence took what the prefilled one holds: the rings'
    // last window, the compressed entries and the keys.
    let used =
        |a: (usize, usize, usize), b: (usize, usize, usize)| (a.0 - b.0, a.1 - b.1, a.2 - b.2);
    let held = used(pc_free(&pc, cfg), free_before);
    assert_eq!(used(free_before, free_after), held);
    let (w, c, k) = patterns(&model);
    pool.fill_rows(&w, &c, &k).unwrap();
    let rows = pool.window_rows().to_le_bytes().unwrap();
    let pattern = w.to_le_bytes().unwrap();
    assert!(rows.chunks(pattern.len()).all(|r| r == pattern.as_slice()));
    let next = &tokens[len..=len];
    let a = model.forward(&mut pool, real, next).unwrap();
    let b = model.forward(&mut pool, seeded, next).unwrap();
    assert!(
        a.logits.to_le_bytes().unwrap() == b.logits.to_le_bytes().unwrap(),
        "the seeded sequence's decode differs from the prefilled one's"
    );
}

/// Free pages of a fresh pool of `pc`.
fn pc_free(pc: &PoolConfig, cfg: &deepinfer::model::config::ModelConfig) -> (usize, usize, usize) {
    StatePool::new(cfg, &Device::Cpu, *pc).unwrap().free_pages()
}

#[test]
fn bad_seeds_are_typed_errors_that_change_nothing() {
    let (model, _) = common::tiny::tiny_model(22);
    let cfg = &model.cfg;
    let pc = PoolConfig::fitting(cfg, 2, 64, 1, 4).unwrap();
    let mut pool = StatePool::new(cfg, &Device::Cpu, pc).unwrap();
    let seq = pool.add_sequence().unwrap();
    let free = pool.free_pages();
    // An odd length would leave a ratio-2 partial group.
    let e = pool.seed_context(seq, 21, &[]).unwrap_err();
    assert!(e.to_string().contains("even length"), "{e}");
    // More than the pool holds: out of pages, nothing taken.
    let e = pool.seed_context(seq, 4096, &[]).unwrap_err();
    assert!(matches!(e.op(), Some(Error::OutOfPages { .. })), "{e}");
    assert_eq!(pool.free_pages(), free);
    assert_eq!(pool.position(seq).unwrap(), 0);
    // It still seeds within what the pool holds, once.
    pool.seed_context(seq, 62, &[Some(1), Some(2), Some(3), Some(4)])
        .unwrap();
    let e = pool.seed_context(seq, 2, &[]).unwrap_err();
    assert!(e.to_string().contains("not new"), "{e}");
    model.forward(&mut pool, seq, &[7]).unwrap();
    // A pattern of no rows is refused.
    let empty = Tensor::from_vec(Vec::<u8>::new(), &[0, 4]).unwrap();
    let (_, c, k) = patterns(&model);
    assert!(pool.fill_rows(&empty, &c, &k).is_err());
}
