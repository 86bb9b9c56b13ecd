//! The paged per-sequence state of many sequences (`v41-flash.md` §3.3,
//! §3.4, §11): every layer's window ring (and every DSpark stage's), every
//! KV source's compressed entries and index keys, the ratio-2 compressors'
//! partial groups and the Engram history, in fixed-size pages of
//! `page_rows` rows with one block table per (sequence, cache).
//!
//! Layout (what the GPU kernels read): three flat row pools on the model's
//! device — window rows U8 `[pages · page_rows, 528]`, compressed rows U8
//! `[pages · page_rows, 288]` and index keys `F4E2M1x2` `[pages · page_rows,
//! 136]` — shared by every layer and sequence. Logical row r of a block
//! table (a position for a ring, an entry index for a source) lives at
//! physical row `table[r / page_rows] · page_rows + r % page_rows`. A ring
//! keeps only the pages that hold its last `window` positions: older pages
//! go back to the free list after every step.
//!
//! Sizing (`sizing`): a pool takes at most `min(user budget, free device
//! memory − weights still to load − a step's headroom)` ([`PoolMemory`],
//! [`PoolConfig::within`]), checked before anything is allocated.
//!
//! Invariants: a page belongs to at most one (sequence, cache) at a time;
//! pages are reserved for a whole step before anything is written, all or
//! nothing, so running out of pages is an [`OpError::OutOfPages`] that leaves
//! every sequence as it was; freeing a sequence returns all its pages.
//!
//! Indexing invariant: every ring, source and slot number is the pool's
//! own (`source()` maps a layer to its source or fails; a ring is a layer or
//! DSpark stage of the plan the pool was built from), and every
//! per-sequence vector holds one entry per ring or source; sequence ids go
//! through `get`/`get_mut`, which fail on an unknown id. So the crate's
//! `indexing_slicing` lint is lifted here.
#![allow(clippy::indexing_slicing)]

use super::config::{LayerPlan, ModelConfig};
use super::inputs::{Input, StepInputs};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Error as OpError;
use crate::kv_format;
use crate::model::error::Result;
use crate::ops::{self, index_key_row_nibbles};
use crate::tensor::Tensor;
use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};

mod rollback;
mod sizing;
mod snapshot;
mod tables;
pub use sizing::{CUDA_RESERVE_BYTES, PoolMemory, step_headroom, step_workspace_bytes};
pub use snapshot::SeqSnapshot;
pub(crate) use tables::TableKind;

/// A sequence's handle in a [`StatePool`].
pub type SeqId = u64;

/// Page counts of a pool; [`PoolConfig::from_budget`] derives them from a
/// byte budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// Rows per page (every cache).
    pub page_rows: usize,
    pub window_pages: usize,
    pub compressed_pages: usize,
    pub key_pages: usize,
    /// Most sequences alive at once.
    pub max_seqs: usize,
}

/// Hard limits that keep a pool's arithmetic and allocations sane.
const MAX_PAGE_ROWS: usize = 1 << 16;
const MAX_SEQS: usize = 1 << 20;

impl PoolConfig {
    /// Pages for `max_seqs` sequences of `max_context` tokens each, fed in
    /// steps of at most `max_chunk` tokens per sequence.
    pub fn fitting(
        cfg: &ModelConfig,
        max_seqs: usize,
        max_context: usize,
        max_chunk: usize,
        page_rows: usize,
    ) -> Result<PoolConfig> {
        PoolConfig::from_budget(cfg, usize::MAX, max_seqs, max_context, max_chunk, page_rows)
    }

    /// Splits `budget_bytes` between the three row pools so that `max_seqs`
    /// sequences of `max_context` tokens (fed in steps of at most
    /// `max_chunk` tokens) fit when the budget allows it, and as many
    /// sequences' worth of pages as fit otherwise: a ring needs
    /// `window − 1 + max_chunk` rows during a step (the DSpark stages' the
    /// draft block too), a source `max_context / ratio` rows. The budget
    /// must cover at least one page of every needed pool.
    pub fn from_budget(
        cfg: &ModelConfig,
        budget_bytes: usize,
        max_seqs: usize,
        max_context: usize,
        max_chunk: usize,
        page_rows: usize,
    ) -> Result<PoolConfig> {
        let plans = cfg.layer_plans()?;
        let bytes = RowBytes::of(cfg);
        let pr = page_rows.max(1);
        let a = cfg.attention;
        let chunk = max_chunk.max(cfg.dspark.block_size + 1);
        let ring_pages = plans.len() * ((a.window + chunk).div_ceil(pr) + 1);
        let (mut comp_pages, mut key_pages) = (0, 0);
        for p in plans.iter().filter(|p| p.is_kv_source()) {
            let pages = (max_context / p.ratio).div_ceil(pr) + 1;
            comp_pages += pages;
            if p.owns_index_keys() {
                key_pages += pages;
            }
        }
        let per_seq = page_rows.saturating_mul(
            ring_pages * bytes.window + comp_pages * bytes.compressed + key_pages * bytes.key,
        );
        let pending = max_seqs.saturating_mul(bytes.pending_per_seq(&plans));
        let fits = (budget_bytes.saturating_sub(pending) / per_seq.max(1)).min(max_seqs);
        let scale = |pages: usize| pages.saturating_mul(fits.max(1));
        let cfg = PoolConfig {
            page_rows,
            window_pages: scale(ring_pages),
            compressed_pages: scale(comp_pages),
            key_pages: scale(key_pages),
            max_seqs,
        };
        cfg.validate()?;
        if fits == 0 || cfg.bytes(&bytes, &plans) > budget_bytes {
            return Err(OpError::Argument {
                op: "PoolConfig::from_budget",
                arg: "budget_bytes",
                value: budget_bytes.to_string(),
                why: "below the pages of one sequence plus the partial-group state",
            }
            .into());
        }
        Ok(cfg)
    }

    /// Device bytes of a pool of this configuration for `cfg`'s model.
    pub fn memory_bytes(&self, cfg: &ModelConfig) -> Result<usize> {
        Ok(self.bytes(&RowBytes::of(cfg), &cfg.layer_plans()?))
    }

    fn validate(&self) -> Result<()> {
        let bad = |arg, value: usize, why| {
            Err(OpError::Argument {
                op: "StatePool::new",
                arg,
                value: value.to_string(),
                why,
            }
            .into())
        };
        if self.page_rows == 0 || self.page_rows > MAX_PAGE_ROWS {
            return bad("page_rows", self.page_rows, "must be in 1..=65536");
        }
        if self.max_seqs == 0 || self.max_seqs > MAX_SEQS {
            return bad("max_seqs", self.max_seqs, "must be in 1..=2^20");
        }
        for (arg, pages) in [
            ("window_pages", self.window_pages),
            ("compressed_pages", self.compressed_pages),
            ("key_pages", self.key_pages),
        ] {
            if pages
                .checked_mul(self.page_rows)
                .is_none_or(|r| r > i32::MAX as usize)
            {
                return bad(arg, pages, "pages × page_rows must stay below 2^31 rows");
            }
        }
        Ok(())
    }

    fn bytes(&self, b: &RowBytes, plans: &[LayerPlan]) -> usize {
        self.page_rows
            .saturating_mul(
                self.window_pages * b.window
                    + self.compressed_pages * b.compressed
                    + self.key_pages * b.key,
            )
            .saturating_add(self.max_seqs * b.pending_per_seq(plans))
    }
}

/// Bytes of one row of each cache for a config.
struct RowBytes {
    window: usize,
    compressed: usize,
    key: usize,
    head_dim: usize,
}

impl RowBytes {
    fn of(cfg: &ModelConfig) -> RowBytes {
        let hd = cfg.attention.head_dim;
        RowBytes {
            window: kv_format::window_row_bytes(hd),
            compressed: kv_format::compressed_row_bytes(hd),
            key: kv_format::index_key_row_bytes(cfg.indexer.head_dim),
            head_dim: hd,
        }
    }

    /// The ratio-2 partial groups: kv and score, fp32, per gated source.
    fn pending_per_seq(&self, plans: &[LayerPlan]) -> usize {
        let gated = plans
            .iter()
            .filter(|p| p.is_kv_source() && p.ratio == 2)
            .count();
        gated * 2 * self.head_dim * 4
    }
}

/// One cache kind's pages: the flat row tensor and its free list.
struct Pages {
    name: &'static str,
    rows: Tensor,
    free: Vec<u32>,
    total: usize,
}

impl Pages {
    fn new(
        name: &'static str,
        device: &Device,
        dtype: DType,
        row_width: usize,
        pages: usize,
        page_rows: usize,
    ) -> Result<Pages> {
        Ok(Pages {
            name,
            rows: Tensor::zeros(device, dtype, &[pages * page_rows, row_width])?,
            free: (0..u32::try_from(pages).map_err(|_| too_many(name, pages))?)
                .rev()
                .collect(),
            total: pages,
        })
    }
}

/// Logical rows → pages for one (sequence, cache): `pages[i]` holds logical
/// page `first + i`.
#[derive(Clone, Debug, Default)]
struct BlockTable {
    first: usize,
    pages: VecDeque<u32>,
}

impl BlockTable {
    /// Logical pages up to which the table is allocated.
    fn end(&self) -> usize {
        self.first + self.pages.len()
    }

    /// Physical row of logical `row`, if its page is held.
    fn row(&self, row: usize, page_rows: usize) -> Option<usize> {
        let page = row / page_rows;
        (page >= self.first)
            .then(|| self.pages.get(page - self.first))
            .flatten()
            .map(|&p| p as usize * page_rows + row % page_rows)
    }

    /// New pages needed to hold logical rows below `rows`.
    fn missing(&self, rows: usize, page_rows: usize) -> usize {
        rows.div_ceil(page_rows).saturating_sub(self.end())
    }

    /// Drops the pages entirely below logical row `keep_from`.
    fn trim(&mut self, keep_from: usize, page_rows: usize, free: &mut Vec<u32>) {
        while self.first < keep_from / page_rows {
            match self.pages.pop_front() {
                Some(p) => free.push(p),
                None => {
                    self.first = keep_from / page_rows;
                    break;
                }
            }
            self.first += 1;
        }
    }
}

/// A KV source of the model: its layer, ratio and whether it owns keys.
#[derive(Clone, Copy, Debug)]
struct Source {
    layer: usize,
    ratio: usize,
    keys: bool,
    /// Index among the gated (ratio-2) sources, for the partial groups.
    gated: Option<usize>,
}

/// One sequence's tables.
#[derive(Clone, Debug)]
struct Sequence {
    pos: usize,
    slot: usize,
    /// One per ring: backbone layers, then DSpark stages.
    rings: Vec<BlockTable>,
    /// Highest position + 1 written into each ring.
    ring_end: Vec<usize>,
    /// Lowest valid position of each backbone ring: a write that leaves a
    /// gap after `ring_end` (a replayed or truncated span) restarts it, so
    /// rows never written are never read.
    ring_begin: Vec<usize>,
    entries: Vec<BlockTable>,
    n_entries: Vec<usize>,
    keys: Vec<BlockTable>,
    pending: Vec<bool>,
    /// Compressed ids of the last (up to) three positions, oldest first.
    history: VecDeque<Option<i64>>,
    /// Open speculative-decoding checkpoint ([`StatePool::checkpoint`]).
    checkpoint: Option<Box<rollback::Checkpoint>>,
}

impl Sequence {
    /// Marks positions `pos0 .. pos0 + n` of ring `ring` written; on a
    /// backbone ring (below `n_layers`) a gap after the written span
    /// restarts the ring at `pos0`.
    fn extend_ring(&mut self, ring: usize, pos0: usize, n: usize, n_layers: usize) {
        if ring < n_layers && pos0 > self.ring_end[ring] {
            self.ring_begin[ring] = pos0;
        }
        self.ring_end[ring] = self.ring_end[ring].max(pos0 + n);
    }
}

/// The state of every live sequence.
pub struct StatePool {
    cfg: PoolConfig,
    window: usize,
    n_layers: usize,
    sources: Vec<Source>,
    /// Backbone layer → its index in `sources`.
    source_of: HashMap<usize, usize>,
    ring_pages: Pages,
    comp_pages: Pages,
    key_pages: Pages,
    /// F32 `[max_seqs · gated, head_dim]` each.
    pending_kv: Tensor,
    pending_score: Tensor,
    seqs: HashMap<SeqId, Sequence>,
    free_slots: Vec<usize>,
    next_id: SeqId,
    /// Rings per sequence: backbone layers then DSpark stages.
    rings: usize,
    /// The steps' uploads (`model::inputs`): reused storage across steps.
    inputs: StepInputs,
    /// The sources' block tables on the device (`tables`).
    tables: tables::DeviceTables,
}

/// How many entries the Engram history keeps (the n-gram look-back).
const HISTORY: usize = 3;

impl StatePool {
    /// A pool for `cfg`'s model on `device` with the pages of `pool`.
    pub fn new(cfg: &ModelConfig, device: &Device, pool: PoolConfig) -> Result<StatePool> {
        pool.validate()?;
        let bytes = pool.memory_bytes(cfg)?;
        if let Some(available) = device.available_memory()?
            && bytes > available
        {
            return Err(OpError::OutOfMemory {
                what: "StatePool::new",
                bytes,
                device: device.to_string(),
                available,
            }
            .into());
        }
        let plans = cfg.layer_plans()?;
        let hd = cfg.attention.head_dim;
        let mut sources = Vec::new();
        let mut gated = 0;
        for p in plans[..cfg.n_layers].iter().filter(|p| p.is_kv_source()) {
            sources.push(Source {
                layer: p.layer,
                ratio: p.ratio,
                keys: p.owns_index_keys(),
                gated: (p.ratio == 2).then(|| {
                    gated += 1;
                    gated - 1
                }),
            });
        }
        let pr = pool.page_rows;
        let pending_rows = (pool.max_seqs * gated).max(1);
        let owns_keys: Vec<bool> = sources.iter().map(|s| s.keys).collect();
        Ok(StatePool {
            inputs: StepInputs::new(),
            tables: tables::DeviceTables::new(device, &owns_keys)?,
            cfg: pool,
            window: cfg.attention.window,
            n_layers: cfg.n_layers,
            source_of: sources
                .iter()
                .enumerate()
                .map(|(i, s)| (s.layer, i))
                .collect(),
            sources,
            ring_pages: Pages::new(
                "window ring",
                device,
                DType::U8,
                kv_format::window_row_bytes(hd),
                pool.window_pages,
                pr,
            )?,
            comp_pages: Pages::new(
                "compressed KV",
                device,
                DType::U8,
                kv_format::compressed_row_bytes(hd),
                pool.compressed_pages,
                pr,
            )?,
            key_pages: Pages::new(
                "index keys",
                device,
                DType::F4E2M1x2,
                index_key_row_nibbles(cfg.indexer.head_dim),
                pool.key_pages,
                pr,
            )?,
            pending_kv: Tensor::zeros(device, DType::F32, &[pending_rows, hd])?,
            pending_score: Tensor::zeros(device, DType::F32, &[pending_rows, hd])?,
            seqs: HashMap::new(),
            free_slots: (0..pool.max_seqs).rev().collect(),
            next_id: 0,
            rings: plans.len(),
        })
    }
}

impl StatePool {
    /// Adds an empty sequence (position 0).
    pub fn add_sequence(&mut self) -> Result<SeqId> {
        let slot = self.free_slots.pop().ok_or(OpError::Argument {
            op: "StatePool::add_sequence",
            arg: "max_seqs",
            value: self.cfg.max_seqs.to_string(),
            why: "every sequence slot is in use; free one first",
        })?;
        let id = self.next_id;
        self.next_id += 1;
        let n = self.sources.len();
        self.seqs.insert(
            id,
            Sequence {
                pos: 0,
                slot,
                rings: vec![BlockTable::default(); self.rings],
                ring_end: vec![0; self.rings],
                ring_begin: vec![0; self.rings],
                entries: vec![BlockTable::default(); n],
                n_entries: vec![0; n],
                keys: vec![BlockTable::default(); n],
                pending: vec![false; n],
                history: VecDeque::new(),
                checkpoint: None,
            },
        );
        Ok(id)
    }

    /// Marks `len` positions of the new (empty) sequence `seq` as processed
    /// without computing them, for benches that need long contexts
    /// cheaply: reserves the pages a prefill of `len` tokens leaves behind
    /// (each backbone ring's pages of the last `window` positions, each
    /// source's `len / ratio` entries and index keys) and counts their rows
    /// as written, with whatever bytes the pool holds there (write rows of
    /// the right format first or after: [`StatePool::fill_rows`]). No
    /// partial group (`len` must be a multiple of every source's ratio),
    /// `history` (the last compressed ids, oldest first) as the Engram
    /// history, the DSpark stage rings left empty. All or nothing: out of
    /// pages is an [`OpError::OutOfPages`] that changes nothing.
    pub fn seed_context(&mut self, seq: SeqId, len: usize, history: &[Option<i64>]) -> Result<()> {
        let bad = |why| OpError::Argument {
            op: "StatePool::seed_context",
            arg: "len",
            value: format!("{len} for sequence {seq}"),
            why,
        };
        if self.get(seq)?.pos != 0 {
            return Err(bad("the sequence is not new (its position is not 0)").into());
        }
        if self.sources.iter().any(|s| !len.is_multiple_of(s.ratio)) {
            return Err(
                bad("a ratio-2 source would hold a partial group: use an even length").into(),
            );
        }
        if len > i32::MAX as usize {
            return Err(bad("positions must stay below 2^31").into());
        }
        let (pr, window, n_layers) = (self.cfg.page_rows, self.window, self.n_layers);
        // The rings keep the pages of the window of the next position only.
        let keep = (len + 1).saturating_sub(window);
        let s = self.get_mut(seq)?;
        for t in &mut s.rings[..n_layers] {
            t.first = keep / pr;
        }
        if let Err(e) = self.reserve_step(&[(seq, len)]) {
            let s = self.get_mut(seq)?;
            for t in &mut s.rings[..n_layers] {
                t.first = 0;
            }
            return Err(e);
        }
        let sources = self.sources.clone();
        let s = self.get_mut(seq)?;
        for ring in 0..n_layers {
            s.extend_ring(ring, keep, len - keep, n_layers);
        }
        for (i, src) in sources.iter().enumerate() {
            s.n_entries[i] = len / src.ratio;
        }
        s.pos = len;
        s.history = history[history.len().saturating_sub(HISTORY)..]
            .iter()
            .copied()
            .collect();
        Ok(())
    }

    /// Overwrites every row of the three row pools with `window`,
    /// `compressed` and `keys` (each of the pool's dtype and row width)
    /// repeated from row 0: a bench's cheap stand-in for the caches of long
    /// contexts ([`StatePool::seed_context`]). Live sequences' rows change
    /// too; their tables and counts do not.
    pub fn fill_rows(&mut self, window: &Tensor, compressed: &Tensor, keys: &Tensor) -> Result<()> {
        for (pages, rows) in [
            (&mut self.ring_pages, window),
            (&mut self.comp_pages, compressed),
            (&mut self.key_pages, keys),
        ] {
            let (total, period) = (pages.rows.rows(), rows.rows());
            if period == 0 {
                return Err(OpError::Argument {
                    op: "StatePool::fill_rows",
                    arg: pages.name,
                    value: "0 rows".into(),
                    why: "a fill pattern needs at least one row",
                }
                .into());
            }
            let mut at = 0;
            while at < total {
                let n = period.min(total - at);
                pages.rows.copy_rows_from(at, rows, 0, n)?;
                at += n;
            }
        }
        Ok(())
    }

    /// A copy of `seq` in new pages: the same position, caches, partial
    /// groups and history, evolving independently afterwards (a snapshot
    /// to decode from twice, or to roll back to): [`StatePool::snapshot`]
    /// with the rings, then [`StatePool::restore`]. Out of pages or slots,
    /// or an open checkpoint on `seq`, is a typed error that changes nothing.
    pub fn fork(&mut self, seq: SeqId) -> Result<SeqId> {
        let snap = self.snapshot(seq, true)?;
        self.restore(&snap)
    }

    /// Copies of each source's partial group of `s` (its pending kv and
    /// score rows), `None` for a source with none.
    fn pending_copies(&self, s: &Sequence) -> Result<Vec<Option<(Tensor, Tensor)>>> {
        (0..self.sources.len())
            .map(|i| {
                if !s.pending[i] {
                    return Ok(None);
                }
                let row = self.pending_row(s.slot, i)?;
                Ok(Some((
                    self.pending_kv.narrow_rows(row, 1)?,
                    self.pending_score.narrow_rows(row, 1)?,
                )))
            })
            .collect()
    }

    /// The arena every upload of a step on this pool goes through.
    pub fn inputs(&self) -> &StepInputs {
        &self.inputs
    }

    /// The device the pool's pages (and its snapshots' copies) live on.
    pub fn device(&self) -> Device {
        self.pending_kv.device()
    }

    /// Frees a sequence and returns all its pages.
    pub fn free_sequence(&mut self, seq: SeqId) -> Result<()> {
        let s = self.seqs.remove(&seq).ok_or_else(|| unknown(seq))?;
        self.ring_pages
            .free
            .extend(s.rings.iter().flat_map(|t| t.pages.iter().copied()));
        self.comp_pages
            .free
            .extend(s.entries.iter().flat_map(|t| t.pages.iter().copied()));
        self.key_pages
            .free
            .extend(s.keys.iter().flat_map(|t| t.pages.iter().copied()));
        self.free_slots.push(s.slot);
        Ok(())
    }

    /// The sequence's next position (tokens processed so far).
    pub fn position(&self, seq: SeqId) -> Result<usize> {
        Ok(self.get(seq)?.pos)
    }

    /// Free pages of (window rings, compressed KV, index keys).
    pub fn free_pages(&self) -> (usize, usize, usize) {
        (
            self.ring_pages.free.len(),
            self.comp_pages.free.len(),
            self.key_pages.free.len(),
        )
    }

    pub fn config(&self) -> PoolConfig {
        self.cfg
    }

    /// Entries of the KV source of backbone layer `layer` for `seq`.
    pub fn entries(&self, seq: SeqId, layer: usize) -> Result<usize> {
        let src = self.source(layer)?;
        Ok(self.get(seq)?.n_entries[src])
    }

    /// Whether the ratio-2 source of `layer` holds a partial group for `seq`.
    pub fn has_pending(&self, seq: SeqId, layer: usize) -> Result<bool> {
        let src = self.source(layer)?;
        Ok(self.get(seq)?.pending[src])
    }

    fn get(&self, seq: SeqId) -> Result<&Sequence> {
        Ok(self.seqs.get(&seq).ok_or_else(|| unknown(seq))?)
    }

    fn get_mut(&mut self, seq: SeqId) -> Result<&mut Sequence> {
        Ok(self.seqs.get_mut(&seq).ok_or_else(|| unknown(seq))?)
    }

    fn source(&self, layer: usize) -> Result<usize> {
        Ok(self
            .source_of
            .get(&layer)
            .copied()
            .ok_or(OpError::Argument {
                op: "StatePool",
                arg: "layer",
                value: layer.to_string(),
                why: "the layer is not a KV source",
            })?)
    }

    /// Reserves, all or nothing, the pages a step of `len` new tokens of
    /// each `(seq, len)` needs in the backbone rings and the sources.
    pub(crate) fn reserve_step(&mut self, batch: &[(SeqId, usize)]) -> Result<()> {
        let pr = self.cfg.page_rows;
        // Per sequence: new pages of each ring, source and key table.
        let mut plan: Vec<(SeqId, [Vec<usize>; 3])> = Vec::new();
        let (mut need_r, mut need_c, mut need_k) = (0, 0, 0);
        for &(seq, len) in batch {
            let s = self.get(seq)?;
            let end = s.pos + len;
            let rings: Vec<usize> = s.rings[..self.n_layers]
                .iter()
                .map(|t| t.missing(end, pr))
                .collect();
            let mut comp = Vec::new();
            let mut keys = Vec::new();
            for (i, src) in self.sources.iter().enumerate() {
                comp.push(s.entries[i].missing(end / src.ratio, pr));
                keys.push(if src.keys {
                    s.keys[i].missing(end / src.ratio, pr)
                } else {
                    0
                });
            }
            need_r += rings.iter().sum::<usize>();
            need_c += comp.iter().sum::<usize>();
            need_k += keys.iter().sum::<usize>();
            plan.push((seq, [rings, comp, keys]));
        }
        let first = batch.first().map_or(0, |b| b.0);
        for (pages, need) in [
            (&self.ring_pages, need_r),
            (&self.comp_pages, need_c),
            (&self.key_pages, need_k),
        ] {
            if need > pages.free.len() {
                tracing::warn!(
                    cache = pages.name,
                    need,
                    free = pages.free.len(),
                    "out of pages"
                );
                return Err(OpError::OutOfPages {
                    cache: pages.name,
                    seq: first,
                    needed: need,
                    free: pages.free.len(),
                    total: pages.total,
                }
                .into());
            }
        }
        for (seq, [rings, comp, keys]) in plan {
            let s = self.seqs.get_mut(&seq).ok_or_else(|| unknown(seq))?;
            for (t, n) in s.rings.iter_mut().zip(rings) {
                grow(t, n, &mut self.ring_pages, seq)?;
            }
            for (t, n) in s.entries.iter_mut().zip(comp) {
                grow(t, n, &mut self.comp_pages, seq)?;
            }
            for (t, n) in s.keys.iter_mut().zip(keys) {
                grow(t, n, &mut self.key_pages, seq)?;
            }
        }
        Ok(())
    }

    /// Reserves the pages ring `ring` of `seq` needs for positions below
    /// `end` (the DSpark stages reserve their own).
    pub(crate) fn reserve_ring(&mut self, seq: SeqId, ring: usize, end: usize) -> Result<()> {
        let pr = self.cfg.page_rows;
        let need = self.get(seq)?.rings[ring].missing(end, pr);
        if need > self.ring_pages.free.len() {
            return Err(OpError::OutOfPages {
                cache: self.ring_pages.name,
                seq,
                needed: need,
                free: self.ring_pages.free.len(),
                total: self.ring_pages.total,
            }
            .into());
        }
        let s = self.seqs.get_mut(&seq).ok_or_else(|| unknown(seq))?;
        grow(&mut s.rings[ring], need, &mut self.ring_pages, seq)?;
        Ok(())
    }

    /// Writes `n` encoded window rows of `rows` (from row `row0`) at
    /// positions `pos0 ..` of ring `ring` of `seq`.
    pub(crate) fn write_ring(
        &mut self,
        seq: SeqId,
        ring: usize,
        pos0: usize,
        rows: &Tensor,
        row0: usize,
        n: usize,
    ) -> Result<()> {
        let pr = self.cfg.page_rows;
        let s = self.seqs.get_mut(&seq).ok_or_else(|| unknown(seq))?;
        write_runs(
            &s.rings[ring],
            pr,
            &mut self.ring_pages.rows,
            pos0,
            rows,
            row0,
            n,
            "ring",
        )?;
        s.extend_ring(ring, pos0, n, self.n_layers);
        Ok(())
    }

    /// The window pool rows (physical) of positions `pos0 .. pos0 + n` of
    /// ring `ring` of `seq`, which count as written from now on: the caller
    /// stores the rows there (one row writer call for a whole step). The
    /// pages must be reserved.
    pub(crate) fn claim_ring_rows(
        &mut self,
        seq: SeqId,
        ring: usize,
        pos0: usize,
        n: usize,
    ) -> Result<Vec<i32>> {
        let pr = self.cfg.page_rows;
        let s = self.seqs.get_mut(&seq).ok_or_else(|| unknown(seq))?;
        let rows = claim_rows(&s.rings[ring], pr, pos0, n, "ring")?;
        s.extend_ring(ring, pos0, n, self.n_layers);
        Ok(rows)
    }

    /// Physical row of position `pos` in ring `ring` of `seq`, if held.
    pub(crate) fn ring_row(&self, seq: SeqId, ring: usize, pos: usize) -> Result<Option<i32>> {
        let s = self.get(seq)?;
        (s.ring_begin[ring] <= pos && pos < s.ring_end[ring])
            .then(|| s.rings[ring].row(pos, self.cfg.page_rows))
            .flatten()
            .map(phys_i32)
            .transpose()
    }

    /// Claims the next `n` entries of `layer`'s source for `seq` (they
    /// count from now on; the caller stores them): their first entry index
    /// and their physical rows in the compressed pool and, when the source
    /// owns keys, in the key pool. The pages must be reserved.
    pub(crate) fn claim_entries(
        &mut self,
        seq: SeqId,
        layer: usize,
        n: usize,
    ) -> Result<(usize, Vec<i32>, Option<Vec<i32>>)> {
        let src = self.source(layer)?;
        let pr = self.cfg.page_rows;
        let keys = self.sources[src].keys;
        let s = self.seqs.get_mut(&seq).ok_or_else(|| unknown(seq))?;
        let j0 = s.n_entries[src];
        let rows = claim_rows(&s.entries[src], pr, j0, n, "entries")?;
        let key_rows = if keys {
            Some(claim_rows(&s.keys[src], pr, j0, n, "keys")?)
        } else {
            None
        };
        s.n_entries[src] += n;
        Ok((j0, rows, key_rows))
    }

    /// The pages holding the first `n` index keys of `layer`'s source for
    /// `seq`, in logical order.
    pub(crate) fn key_pages_of(&self, seq: SeqId, layer: usize, n: usize) -> Result<Vec<usize>> {
        let src = self.source(layer)?;
        let s = self.get(seq)?;
        let pr = self.cfg.page_rows;
        (0..n)
            .step_by(pr.max(1))
            .map(|j| {
                let phys = s.keys[src].row(j, pr).ok_or(OpError::Argument {
                    op: "StatePool::key_pages_of",
                    arg: "n",
                    value: n.to_string(),
                    why: "more keys asked for than the source holds",
                })?;
                Ok(phys / pr)
            })
            .collect()
    }

    /// The first `n` index-key rows of the key pages `blocks` (a list of
    /// [`StatePool::key_pages_of`]),
    /// contiguous: `[n, 136]` on the pool's device, in one gather of whole
    /// pages (and one copy of a partial last page).
    pub(crate) fn gather_key_blocks(&self, blocks: &[usize], n: usize) -> Result<Tensor> {
        Ok(ops::gather_row_blocks(
            &self.key_pages.rows,
            self.cfg.page_rows,
            blocks,
            n,
        )?)
    }

    /// The index-key pool: `[pages · page_rows, 136]` nibbles, read through
    /// the pages of the sources' key tables ([`StatePool::gather_table`]).
    pub(crate) fn key_rows(&self) -> &Tensor {
        &self.key_pages.rows
    }

    /// The row of the partial group of `layer`'s ratio-2 source for `seq`
    /// in the pending tensors ([`StatePool::compressor_io`]), if it holds
    /// one.
    pub(crate) fn pending_row_of(&self, seq: SeqId, layer: usize) -> Result<Option<i32>> {
        let src = self.source(layer)?;
        let s = self.get(seq)?;
        s.pending[src]
            .then(|| self.pending_row(s.slot, src).and_then(phys_i32))
            .transpose()
    }

    /// Plans the partial groups of `layer`'s ratio-2 source after a step:
    /// each sequence of `tails` keeps (`Some(r)`: row `r` of the step's kv
    /// and score) or clears (`None`) its partial group. Records that on the
    /// host now and returns the row copy [`StatePool::copy_pending`] makes
    /// once the step has computed kv and score: lists of one pair per
    /// sequence, −1 for a sequence without a tail (`ops::copy_rows_where`),
    /// so the copies' shapes depend on the number of sequences alone
    /// (`docs/graph-decode.md`); `None` for no sequence. A step names each
    /// sequence once (`Model::step` refuses a repeat), so the destinations
    /// are distinct.
    pub(crate) fn plan_pending(
        &mut self,
        layer: usize,
        tails: &[(SeqId, Option<usize>)],
    ) -> Result<Option<PendingCopy>> {
        let src = self.source(layer)?;
        let (mut dst, mut from) = (Vec::new(), Vec::new());
        let index = |r: usize| {
            i32::try_from(r).map_err(|_| OpError::Argument {
                op: "StatePool::plan_pending",
                arg: "row",
                value: r.to_string(),
                why: "a row past int32",
            })
        };
        for &(seq, tail) in tails {
            match tail {
                Some(r) => {
                    dst.push(index(self.pending_row(self.get(seq)?.slot, src)?)?);
                    from.push(index(r)?);
                }
                None => {
                    dst.push(-1);
                    from.push(-1);
                }
            }
            self.get_mut(seq)?.pending[src] = tail.is_some();
        }
        if dst.is_empty() {
            return Ok(None);
        }
        let device = self.pending_kv.device();
        let n = dst.len();
        Ok(Some(PendingCopy {
            dst: self.inputs.upload(dst, &[n], &device)?,
            from: self.inputs.upload(from, &[n], &device)?,
        }))
    }

    /// The row copy of a [`StatePool::plan_pending`] from the step's `kv`
    /// and `score` into the pending tensors.
    pub(crate) fn copy_pending(
        &mut self,
        copy: &PendingCopy,
        kv: &Tensor,
        score: &Tensor,
    ) -> Result<()> {
        ops::copy_rows_where(&mut self.pending_kv, &copy.dst, kv, &copy.from)?;
        ops::copy_rows_where(&mut self.pending_score, &copy.dst, score, &copy.from)?;
        Ok(())
    }

    /// Copies row `r` of `kv` and `score` into pending row `row` (a
    /// [`StatePool::pending_row`]): the one-row write of a partial group,
    /// shared by a restore and a rollback (a step writes its groups at once,
    /// [`StatePool::copy_pending`]).
    fn put_pending(&mut self, row: usize, kv: &Tensor, score: &Tensor, r: usize) -> Result<()> {
        self.pending_kv.copy_rows_from(row, kv, r, 1)?;
        self.pending_score.copy_rows_from(row, score, r, 1)?;
        Ok(())
    }

    fn pending_row(&self, slot: usize, src: usize) -> Result<usize> {
        let gated = self.sources.iter().filter(|s| s.gated.is_some()).count();
        let g = self.sources[src].gated.ok_or(OpError::Argument {
            op: "StatePool",
            arg: "source",
            value: src.to_string(),
            why: "only ratio-2 sources keep partial groups",
        })?;
        Ok(slot * gated + g)
    }

    /// The Engram history of `seq`: the last (up to) three compressed ids,
    /// oldest first (None before the sequence start is not stored).
    pub(crate) fn history(&self, seq: SeqId) -> Result<Vec<Option<i64>>> {
        Ok(self.get(seq)?.history.iter().copied().collect())
    }

    /// Ends a step of `seq`: `len` tokens done, their compressed ids
    /// appended to the history, and the backbone rings' pages older than
    /// the window returned.
    pub(crate) fn advance(&mut self, seq: SeqId, len: usize, ids: &[Option<i64>]) -> Result<()> {
        let (pr, window, n_layers) = (self.cfg.page_rows, self.window, self.n_layers);
        let s = self.seqs.get_mut(&seq).ok_or_else(|| unknown(seq))?;
        s.pos += len;
        if let Some(cp) = &mut s.checkpoint {
            cp.record_ids(ids);
        }
        for &id in ids {
            s.history.push_back(id);
            if s.history.len() > HISTORY {
                s.history.pop_front();
            }
        }
        // An open checkpoint keeps the window of its position (a rollback
        // may return there).
        let from = s.checkpoint.as_ref().map_or(s.pos, |cp| cp.pos());
        let keep = (from + 1).saturating_sub(window);
        for t in &mut s.rings[..n_layers] {
            t.trim(keep, pr, &mut self.ring_pages.free);
        }
        Ok(())
    }

    /// Returns the pages of ring `ring` of `seq` older than the window of a
    /// query at `pos`.
    pub(crate) fn trim_ring(&mut self, seq: SeqId, ring: usize, pos: usize) -> Result<()> {
        let (pr, window) = (self.cfg.page_rows, self.window);
        let s = self.seqs.get_mut(&seq).ok_or_else(|| unknown(seq))?;
        s.rings[ring].trim(
            (pos + 1).saturating_sub(window),
            pr,
            &mut self.ring_pages.free,
        );
        Ok(())
    }

    /// The window row pool (U8 `[rows, 528]`).
    pub fn window_rows(&self) -> &Tensor {
        &self.ring_pages.rows
    }

    /// The window row pool, for the row writer of [`StatePool::claim_ring_rows`].
    pub(crate) fn window_rows_mut(&mut self) -> &mut Tensor {
        &mut self.ring_pages.rows
    }

    /// What a compressor reads and writes: the partial groups (F32 kv and
    /// score `[max_seqs · gated, head_dim]`), the compressed row pool and
    /// the index-key pool.
    pub(crate) fn compressor_io(&mut self) -> CompressorIo<'_> {
        CompressorIo {
            pending: (&self.pending_kv, &self.pending_score),
            entries: &mut self.comp_pages.rows,
            keys: &mut self.key_pages.rows,
        }
    }

    /// The compressed row pool (U8 `[rows, 288]`).
    pub fn compressed_rows(&self) -> &Tensor {
        &self.comp_pages.rows
    }

    /// Ring index of DSpark stage `stage`.
    pub(crate) fn stage_ring(&self, stage: usize) -> usize {
        self.n_layers + stage
    }

    /// The block tables of ring `ring` for `seqs` (row i: `seqs[i]`) on the
    /// pool's device, as [`ops::paged_window_rows`] reads them: a position
    /// maps to the row [`StatePool::ring_row`] gives, else to −1.
    pub(crate) fn ring_tables(&self, seqs: &[SeqId], ring: usize) -> Result<StepTables> {
        let rows = seqs
            .iter()
            .map(|&seq| {
                let s = self.get(seq)?;
                Ok((&s.rings[ring], s.ring_begin[ring], s.ring_end[ring]))
            })
            .collect::<Result<Vec<_>>>()?;
        self.upload_tables(&rows)
    }

    /// The block tables of the entries of `layer`'s source for `seqs`, as
    /// [`ops::paged_rows`] reads them: entry j maps to its physical row in
    /// the compressed pool while j is below the sequence's entry count, else
    /// to −1. The pages are the device table's rows of the sequences'
    /// slots ([`StatePool::sync_tables`] first), gathered by the device
    /// half; only the slots and bounds are uploaded.
    pub(crate) fn source_tables(&self, seqs: &[SeqId], layer: usize) -> Result<StepTables> {
        let src = self.source(layer)?;
        let mut bounds = Vec::with_capacity(seqs.len() * 3);
        for &seq in seqs {
            // The device table's column c is logical page c: first 0.
            bounds.extend([0, 0, phys_i32(self.get(seq)?.n_entries[src])?]);
        }
        let device = self.device();
        let slots = self.slots_of(seqs)?;
        Ok(StepTables {
            pages: TablePages::Device {
                layer,
                kind: TableKind::Entries,
                slots: self.inputs.upload(slots, &[seqs.len()], &device)?,
            },
            bounds: self.inputs.upload(bounds, &[seqs.len(), 3], &device)?,
            page_rows: self.cfg.page_rows,
        })
    }

    /// The pages of `t` as its device half reads them: the uploaded table,
    /// or the device table's rows of its slots, gathered.
    pub(crate) fn step_pages<'a>(&self, t: &'a StepTables) -> Result<Cow<'a, Tensor>> {
        Ok(match &t.pages {
            TablePages::Uploaded(p) => Cow::Borrowed(&**p),
            TablePages::Device { layer, kind, slots } => {
                Cow::Owned(self.gather_table(*layer, *kind, slots)?)
            }
        })
    }

    /// The rows `slots` (I32 `[n]`, [`StatePool::slots_of`]) of the device
    /// table `kind` of `layer`'s source: I32 `[n, width]`, logical page c
    /// in column c, −1 for none.
    pub(crate) fn gather_table(
        &self,
        layer: usize,
        kind: TableKind,
        slots: &Tensor,
    ) -> Result<Tensor> {
        Ok(ops::gather_blocks(self.table(layer, kind)?, 1, slots)?)
    }

    /// Tables `[rows, widest]` (−1 padded) and bounds `[rows, 3]` of
    /// (table, lo, hi) rows, uploaded.
    fn upload_tables(&self, rows: &[(&BlockTable, usize, usize)]) -> Result<StepTables> {
        let width = rows.iter().map(|(t, ..)| t.pages.len()).max().unwrap_or(0);
        let mut pages = Vec::with_capacity(rows.len() * width);
        let mut bounds = Vec::with_capacity(rows.len() * 3);
        for (t, lo, hi) in rows {
            for c in 0..width {
                // A page number is below the pool's pages, which stay
                // below 2^31 rows (so below 2^31 pages).
                pages.push(t.pages.get(c).map_or(Ok(-1), |&p| phys_i32(p as usize))?);
            }
            for v in [t.first, *lo, *hi] {
                bounds.push(phys_i32(v)?);
            }
        }
        let device = self.device();
        Ok(StepTables {
            pages: TablePages::Uploaded(self.inputs.upload(
                pages,
                &[rows.len(), width],
                &device,
            )?),
            bounds: self.inputs.upload(bounds, &[rows.len(), 3], &device)?,
            page_rows: self.cfg.page_rows,
        })
    }
}

/// One cache's block tables for a step's entries, on the pool's device.
pub(crate) struct StepTables {
    pages: TablePages,
    bounds: Input,
    page_rows: usize,
}

/// Where a [`StepTables`]' pages come from.
enum TablePages {
    /// Uploaded for the step (the window rings: a few pages each).
    Uploaded(Input),
    /// The rows `slots` of a source's device table (`tables`).
    Device {
        layer: usize,
        kind: TableKind,
        slots: Input,
    },
}

impl StepTables {
    /// The tables with their pages `pages` ([`StatePool::step_pages`]).
    pub(crate) fn view<'a>(&'a self, pages: &'a Tensor) -> ops::BlockTables<'a> {
        ops::BlockTables {
            pages,
            bounds: &self.bounds,
            page_rows: self.page_rows,
        }
    }
}

/// The partial-group row copy of one ratio-2 layer in a step
/// ([`StatePool::plan_pending`]): destination pending rows and source step
/// rows, −1 pairs skipped.
pub(crate) struct PendingCopy {
    dst: Input,
    from: Input,
}

/// The tensors of [`StatePool::compressor_io`].
pub(crate) struct CompressorIo<'a> {
    pub pending: (&'a Tensor, &'a Tensor),
    pub entries: &'a mut Tensor,
    pub keys: &'a mut Tensor,
}

/// A physical row as the kernels' int32 index: `PoolConfig::validate` keeps
/// every pool below 2^31 rows, so this fails only if that check is broken.
fn phys_i32(row: usize) -> Result<i32> {
    Ok(i32::try_from(row).map_err(|_| OpError::Argument {
        op: "StatePool",
        arg: "row",
        value: row.to_string(),
        why: "a physical row beyond the int32 index space",
    })?)
}

fn too_many(cache: &'static str, pages: usize) -> OpError {
    OpError::Argument {
        op: "StatePool::new",
        arg: cache,
        value: pages.to_string(),
        why: "more than 2^32 pages",
    }
}

fn unknown(seq: SeqId) -> OpError {
    OpError::Argument {
        op: "StatePool",
        arg: "seq",
        value: seq.to_string(),
        why: "no such sequence in the pool (never added, or freed)",
    }
}

/// Appends `n` free pages to `t` (the caller reserved them).
fn grow(t: &mut BlockTable, n: usize, pages: &mut Pages, seq: SeqId) -> Result<()> {
    for _ in 0..n {
        let p = take_page(pages, seq)?;
        t.pages.push_back(p);
    }
    Ok(())
}

/// A free page; running dry after a reservation said the pages were there
/// is reported as out of pages rather than trusted.
fn take_page(pages: &mut Pages, seq: SeqId) -> Result<u32> {
    Ok(pages.free.pop().ok_or(OpError::OutOfPages {
        cache: pages.name,
        seq,
        needed: 1,
        free: 0,
        total: pages.total,
    })?)
}

/// Copies `n` rows of `src` (from `row0`) to logical rows `at ..` of
/// `table`, one copy per page-contiguous run.
#[allow(clippy::too_many_arguments)]
fn write_runs(
    table: &BlockTable,
    pr: usize,
    dst: &mut Tensor,
    at: usize,
    src: &Tensor,
    row0: usize,
    n: usize,
    what: &'static str,
) -> Result<()> {
    let mut i = 0;
    while i < n {
        let phys = table.row(at + i, pr).ok_or(OpError::Argument {
            op: "StatePool::write",
            arg: what,
            value: (at + i).to_string(),
            why: "row has no reserved page (reserve the step first)",
        })?;
        let run = (pr - (at + i) % pr).min(n - i);
        dst.copy_rows_from(phys, src, row0 + i, run)?;
        i += run;
    }
    Ok(())
}

/// Physical rows of logical rows `at .. at + n` of `table`, as I32 (pools
/// stay below 2^31 rows).
fn claim_rows(
    table: &BlockTable,
    pr: usize,
    at: usize,
    n: usize,
    what: &'static str,
) -> Result<Vec<i32>> {
    (at..at + n)
        .map(|r| {
            table.row(r, pr).map(phys_i32).transpose()?.ok_or_else(|| {
                OpError::Argument {
                    op: "StatePool::claim",
                    arg: what,
                    value: r.to_string(),
                    why: "row has no reserved page (reserve the step first)",
                }
                .into()
            })
        })
        .collect()
}
