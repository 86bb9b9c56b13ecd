//! The engine's prefix cache (`serving.md` §3 and §7): the state of a
//! prompt prefix of whole token blocks, kept across batches so that a later
//! prompt starting with the same tokens skips their prefill.
//!
//! Keys: a hash chain over fixed-size token blocks (block k's hash mixes
//! block k − 1's), one chain value per block boundary. An entry at boundary
//! H holds the H tokens themselves and a [`SeqSnapshot`] of a sequence after
//! exactly those tokens: the global state (compressed KV, index keys,
//! compressor partial groups, Engram history) and, for the exact path, the
//! window rings.
//!
//! Invariants:
//! - a lookup returns an entry only when its tokens equal the prompt's
//!   first H tokens, compared in full: a hash collision is a miss, never a
//!   reuse;
//! - the bytes held (snapshots plus their tokens) never exceed the budget:
//!   [`PrefixCache::make_room`] evicts the least recently used entries
//!   before the engine copies a snapshot, and an entry larger than the
//!   whole budget is neither copied nor kept. The budget counts the
//!   snapshots' bytes on the pool's device (GPU memory for a CUDA pool) plus
//!   the host bytes of their tokens;
//! - entries are deep copies behind `Arc`: a batch restores by copying into
//!   its own pool's pages, so evicting an entry (or dropping the cache)
//!   never touches a live sequence.

use crate::error::Error as OpError;
use crate::model::Result;
use crate::model::pool::SeqSnapshot;
use std::collections::HashMap;
use std::sync::Arc;

/// The largest block size the cache accepts.
const MAX_BLOCK_TOKENS: usize = 1 << 20;

/// Size of the cache's blocks and its memory budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefixCacheConfig {
    /// Tokens per block; hits end at multiples of it.
    pub block_tokens: usize,
    /// Bytes the entries may hold in all.
    pub budget_bytes: usize,
}

/// The chain step: the hash of a block given the previous block's hash.
pub type BlockHash = fn(u64, &[u32]) -> u64;

/// FNV-1a (64-bit) over the previous hash and the block's tokens.
pub fn fnv_block_hash(prev: u64, block: &[u32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let prime: u64 = 0x0000_0100_0000_01b3;
    for b in prev
        .to_le_bytes()
        .into_iter()
        .chain(block.iter().flat_map(|t| t.to_le_bytes()))
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(prime);
    }
    h
}

/// What the cache has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub lookups: u64,
    /// Hits that were used: restored into the batch's pool
    /// ([`PrefixCache::hit_used`]); a hit the pool could not take counts in
    /// `restore_failures` instead.
    pub hits: u64,
    /// Prompt tokens covered by the hits used.
    pub hit_tokens: u64,
    /// Entries whose chain hash matched but whose tokens did not.
    pub collisions: u64,
    pub inserted: u64,
    pub evicted: u64,
    /// Entries not kept because they alone exceed the budget.
    pub rejected: u64,
    /// Hits the pool could not restore (the request then prefilled cold).
    pub restore_failures: u64,
    /// Snapshots not taken because the pool's device had too little free
    /// memory for the copy, or the copy failed (the request went on).
    pub snapshot_failures: u64,
    pub entries: usize,
    pub bytes: usize,
}

struct CacheEntry {
    tokens: Vec<u32>,
    snap: Arc<SeqSnapshot>,
    bytes: usize,
    last_used: u64,
}

/// Cached prefixes by block-hash chain.
pub struct PrefixCache {
    cfg: PrefixCacheConfig,
    hash: BlockHash,
    map: HashMap<u64, Vec<CacheEntry>>,
    clock: u64,
    stats: CacheStats,
}

impl PrefixCache {
    /// An empty cache with [`fnv_block_hash`].
    pub fn new(cfg: PrefixCacheConfig) -> Result<PrefixCache> {
        PrefixCache::with_hash(cfg, fnv_block_hash)
    }

    /// An empty cache chaining blocks with `hash` (any function: a weak one
    /// only costs speed, never correctness, since tokens are compared).
    pub fn with_hash(cfg: PrefixCacheConfig, hash: BlockHash) -> Result<PrefixCache> {
        if cfg.block_tokens == 0 || cfg.block_tokens > MAX_BLOCK_TOKENS {
            return Err(bad(
                "block_tokens",
                cfg.block_tokens.to_string(),
                "must be in 1..=2^20",
            ));
        }
        if cfg.budget_bytes == 0 {
            return Err(bad(
                "budget_bytes",
                "0".into(),
                "a prefix cache needs a budget above 0 bytes",
            ));
        }
        Ok(PrefixCache {
            cfg,
            hash,
            map: HashMap::new(),
            clock: 0,
            stats: CacheStats::default(),
        })
    }

    pub fn config(&self) -> PrefixCacheConfig {
        self.cfg
    }

    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// The chain hash at every block boundary of `tokens`.
    fn chain(&self, tokens: &[u32]) -> Vec<u64> {
        let mut h = 0;
        tokens
            .chunks_exact(self.cfg.block_tokens)
            .map(|b| {
                h = (self.hash)(h, b);
                h
            })
            .collect()
    }

    /// The longest cached prefix of `tokens` longer than `min_len` and of at
    /// most `max_len` tokens (with window rings when `rings`): its length H
    /// and snapshot. It counts as a lookup; the caller reports what became
    /// of it ([`PrefixCache::hit_used`] or [`PrefixCache::restore_failed`]),
    /// so the hit statistics count only the hits actually used.
    pub fn lookup(
        &mut self,
        tokens: &[u32],
        (min_len, max_len): (usize, usize),
        rings: bool,
    ) -> Option<(usize, Arc<SeqSnapshot>)> {
        self.stats.lookups += 1;
        let bt = self.cfg.block_tokens;
        let usable = tokens.get(..max_len.min(tokens.len()))?;
        let chain = self.chain(usable);
        self.clock += 1;
        for (k, h) in chain.iter().enumerate().rev() {
            let len = (k + 1) * bt;
            if len <= min_len {
                break;
            }
            let Some(list) = self.map.get_mut(h) else {
                continue;
            };
            let prefix = usable.get(..len)?;
            let mut found = None;
            for e in list.iter_mut() {
                if e.tokens != prefix {
                    self.stats.collisions += 1;
                } else if !rings || e.snap.has_rings() {
                    e.last_used = self.clock;
                    found = Some(Arc::clone(&e.snap));
                    break;
                }
            }
            if let Some(snap) = found {
                return Some((len, snap));
            }
        }
        None
    }

    /// Records a hit of `len` tokens that was restored and used.
    pub fn hit_used(&mut self, len: usize) {
        self.stats.hits += 1;
        self.stats.hit_tokens += len as u64;
    }

    /// Records a hit that the pool could not restore (not counted as a hit).
    pub fn restore_failed(&mut self) {
        self.stats.restore_failures += 1;
    }

    /// Whether exactly `tokens` is cached.
    pub fn contains(&self, tokens: &[u32]) -> bool {
        self.chain(tokens)
            .last()
            .and_then(|h| self.map.get(h))
            .is_some_and(|l| l.iter().any(|e| e.tokens == tokens))
    }

    /// Before a snapshot of `snap_bytes` after `tokens` tokens is copied:
    /// evicts least recently used entries until it fits the budget, and
    /// returns whether it will (false, counted as rejected, for an entry
    /// over the whole budget: then nothing should be copied).
    pub fn make_room(&mut self, tokens: usize, snap_bytes: usize) -> bool {
        let bytes = snap_bytes.saturating_add(tokens.saturating_mul(4));
        if bytes > self.cfg.budget_bytes {
            self.stats.rejected += 1;
            return false;
        }
        while self.stats.bytes + bytes > self.cfg.budget_bytes && self.evict_lru() {}
        true
    }

    /// Counts a snapshot that could not be taken (see
    /// [`CacheStats::snapshot_failures`]).
    pub fn snapshot_failed(&mut self) {
        self.stats.snapshot_failures += 1;
    }

    /// Keeps `snap`, the state after exactly `tokens` (whole blocks),
    /// evicting least recently used entries to stay within the budget.
    /// Returns whether it was kept (an entry over the whole budget is not).
    pub fn insert(&mut self, tokens: &[u32], snap: SeqSnapshot) -> Result<bool> {
        let bt = self.cfg.block_tokens;
        if tokens.is_empty() || !tokens.len().is_multiple_of(bt) || snap.position() != tokens.len()
        {
            return Err(bad(
                "tokens",
                format!(
                    "{} tokens for a snapshot at position {}",
                    tokens.len(),
                    snap.position()
                ),
                "an entry is whole blocks, taken right after those tokens",
            ));
        }
        let bytes = snap.bytes().saturating_add(tokens.len() * 4);
        if bytes > self.cfg.budget_bytes {
            self.stats.rejected += 1;
            return Ok(false);
        }
        let Some(&h) = self.chain(tokens).last() else {
            return Ok(false);
        };
        self.remove_exact(h, tokens);
        while self.stats.bytes + bytes > self.cfg.budget_bytes && self.evict_lru() {}
        self.clock += 1;
        self.map.entry(h).or_default().push(CacheEntry {
            tokens: tokens.to_vec(),
            snap: Arc::new(snap),
            bytes,
            last_used: self.clock,
        });
        self.stats.inserted += 1;
        self.stats.entries += 1;
        self.stats.bytes += bytes;
        Ok(true)
    }

    fn remove_exact(&mut self, h: u64, tokens: &[u32]) {
        if let Some(list) = self.map.get_mut(&h)
            && let Some(i) = list.iter().position(|e| e.tokens == tokens)
        {
            let e = list.swap_remove(i);
            self.stats.entries -= 1;
            self.stats.bytes -= e.bytes;
        }
    }

    /// Drops the least recently used entry; false when there is none.
    fn evict_lru(&mut self) -> bool {
        let oldest = self
            .map
            .iter()
            .flat_map(|(&h, l)| l.iter().enumerate().map(move |(i, e)| (e.last_used, h, i)))
            .min();
        let Some((_, h, i)) = oldest else {
            return false;
        };
        let Some(list) = self.map.get_mut(&h) else {
            return false;
        };
        if i >= list.len() {
            return false;
        }
        let e = list.swap_remove(i);
        if list.is_empty() {
            self.map.remove(&h);
        }
        self.stats.entries -= 1;
        self.stats.bytes -= e.bytes;
        self.stats.evicted += 1;
        true
    }
}

fn bad(arg: &'static str, value: String, why: &'static str) -> crate::model::Error {
    OpError::Argument {
        op: "PrefixCache",
        arg,
        value,
        why,
    }
    .into()
}
