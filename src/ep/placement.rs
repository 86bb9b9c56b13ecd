//! Where the experts live: a placement table maps each physical expert slot
//! (rank · slots_per_rank + local slot) to the logical expert it serves,
//! with replicas of hot experts, as DeepInfer's deployment does (EPLB);
//! [`balance`] computes a placement from routing statistics.
//!
//! Invariant: every logical expert has at least one physical slot, every slot
//! serves exactly one logical expert, and the slots of a rank list their
//! logical experts in ascending id (a replica's rank order is fixed by the
//! table). [`Placement::physical`] picks among an expert's replicas from the
//! token's source rank and index alone, so the choice never depends on the
//! rest of the batch; every replica holds the same weights, so the choice
//! never changes a result either.

use crate::error::{Error, Result};
use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashSet};

const OP: &str = "ep::Placement";

/// Most ranks of a placement (DeepEP runs up to EP 2048).
pub const EP_MAX_RANKS: usize = 1 << 16;
/// Most physical slots (and logical experts) of a placement: the bound that
/// keeps its tables small whatever a caller asks for.
pub const EP_MAX_SLOTS: usize = 1 << 20;

/// Logical experts to physical slots on `ranks` ranks of `slots_per_rank`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    n_experts: usize,
    ranks: usize,
    slots_per_rank: usize,
    /// Physical slot → logical expert, `[ranks · slots_per_rank]`.
    table: Vec<usize>,
    /// Logical expert → its physical slots, ascending.
    replicas: Vec<Vec<usize>>,
}

fn arg(arg: &'static str, value: impl ToString, why: &'static str) -> Error {
    Error::Argument {
        op: OP,
        arg,
        value: value.to_string(),
        why,
    }
}

impl Placement {
    /// `n_experts` experts split evenly, in id order: rank r holds experts
    /// r · E/R … (r + 1) · E/R − 1, one replica each (`ranks` divides
    /// `n_experts`).
    pub fn uniform(n_experts: usize, ranks: usize) -> Result<Placement> {
        if n_experts > EP_MAX_SLOTS || ranks > EP_MAX_RANKS {
            return Err(arg(
                "n_experts",
                format!("{n_experts} experts on {ranks} ranks"),
                "a placement has at most 2^20 experts and 2^16 ranks",
            ));
        }
        if ranks == 0 || n_experts == 0 || !n_experts.is_multiple_of(ranks) {
            return Err(arg(
                "ranks",
                format!("{ranks} for {n_experts} experts"),
                "a uniform placement needs ranks >= 1 dividing the expert count",
            ));
        }
        Placement::from_table(n_experts, ranks, (0..n_experts).collect())
    }

    /// The placement of `table` (physical slot → logical expert, its length
    /// a multiple of `ranks`): every id below `n_experts`, every expert
    /// present, and each rank's slots in ascending expert id with no expert
    /// twice on one rank.
    pub fn from_table(n_experts: usize, ranks: usize, table: Vec<usize>) -> Result<Placement> {
        if n_experts > EP_MAX_SLOTS || table.len() > EP_MAX_SLOTS || ranks > EP_MAX_RANKS {
            return Err(arg(
                "table",
                format!(
                    "{} slots for {n_experts} experts on {ranks} ranks",
                    table.len()
                ),
                "a placement has at most 2^20 slots and experts and 2^16 ranks",
            ));
        }
        if ranks == 0 || table.is_empty() || !table.len().is_multiple_of(ranks) {
            return Err(arg(
                "table",
                format!("{} slots on {ranks} ranks", table.len()),
                "needs ranks >= 1 and a nonzero multiple of ranks slots",
            ));
        }
        let slots_per_rank = table.len() / ranks;
        let mut replicas = vec![Vec::new(); n_experts];
        for (p, &e) in table.iter().enumerate() {
            let Some(list) = replicas.get_mut(e) else {
                return Err(arg(
                    "table",
                    e,
                    "a logical expert id at or past the expert count",
                ));
            };
            list.push(p);
        }
        if let Some(e) = replicas.iter().position(Vec::is_empty) {
            return Err(arg("table", e, "a logical expert with no physical slot"));
        }
        for rank in table.chunks(slots_per_rank) {
            if rank.windows(2).any(|w| matches!(w, [a, b] if a >= b)) {
                return Err(arg(
                    "table",
                    format!("{rank:?}"),
                    "a rank's slots must hold distinct experts in ascending id",
                ));
            }
        }
        Ok(Placement {
            n_experts,
            ranks,
            slots_per_rank,
            table,
            replicas,
        })
    }

    pub fn n_experts(&self) -> usize {
        self.n_experts
    }

    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// Physical experts per rank (local experts).
    pub fn slots_per_rank(&self) -> usize {
        self.slots_per_rank
    }

    /// Physical slot → logical expert, `[ranks · slots_per_rank]`.
    pub fn table(&self) -> &[usize] {
        &self.table
    }

    /// The logical experts of `rank`'s slots, ascending (empty past the
    /// last rank).
    pub fn local_experts(&self, rank: usize) -> &[usize] {
        self.table
            .chunks(self.slots_per_rank)
            .nth(rank)
            .unwrap_or(&[])
    }

    /// The physical slots of logical expert `e`, ascending (empty when out
    /// of range).
    pub fn replicas(&self, e: usize) -> &[usize] {
        self.replicas.get(e).map_or(&[], Vec::as_slice)
    }

    /// The physical slot serving entry (`token`, expert `e`) of `src_rank`:
    /// replica (src_rank + token) mod replicas, spreading a hot expert's
    /// tokens over its replicas; `None` when `e` is out of range.
    pub fn physical(&self, e: usize, src_rank: usize, token: usize) -> Option<usize> {
        let list = self.replicas.get(e)?;
        let pick = src_rank.wrapping_add(token) % list.len();
        list.get(pick).copied()
    }

    /// The load each rank receives when logical expert e has `load[e]`
    /// entries spread evenly over its replicas.
    pub fn rank_loads(&self, load: &[u64]) -> Vec<f64> {
        let mut out = vec![0.0f64; self.ranks];
        for (p, &e) in self.table.iter().enumerate() {
            let share = load.get(e).copied().unwrap_or(0) as f64 / self.replicas(e).len() as f64;
            if let Some(r) = out.get_mut(p / self.slots_per_rank) {
                *r += share;
            }
        }
        out
    }

    /// Max over mean of [`Placement::rank_loads`] (1.0 is perfect balance;
    /// 1.0 also when there is no load).
    pub fn imbalance(&self, load: &[u64]) -> f64 {
        let loads = self.rank_loads(load);
        let mean = loads.iter().sum::<f64>() / loads.len() as f64;
        let max = loads.iter().copied().fold(0.0f64, f64::max);
        if mean > 0.0 { max / mean } else { 1.0 }
    }
}

/// Routed entries per logical expert, accumulated over batches (the
/// statistics [`balance`] reads).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpertLoad {
    counts: Vec<u64>,
}

impl ExpertLoad {
    /// Zero counts for `n_experts` (at most [`EP_MAX_SLOTS`]).
    pub fn new(n_experts: usize) -> Result<ExpertLoad> {
        if n_experts > EP_MAX_SLOTS {
            return Err(Error::Argument {
                op: "ep::ExpertLoad::new",
                arg: "n_experts",
                value: n_experts.to_string(),
                why: "at most 2^20 experts",
            });
        }
        Ok(ExpertLoad {
            counts: vec![0; n_experts],
        })
    }

    /// Counts the expert ids of one batch (`ids` as [`crate::ops::moe_route`]
    /// returns them, read on the host); an id out of range is a typed error
    /// and counts nothing.
    pub fn observe(&mut self, ids: &[i32]) -> Result<()> {
        let n = self.counts.len();
        let bad = ids
            .iter()
            .find(|&&e| usize::try_from(e).map_or(true, |e| e >= n));
        if let Some(&e) = bad {
            return Err(Error::Argument {
                op: "ep::ExpertLoad::observe",
                arg: "ids",
                value: e.to_string(),
                why: "an expert id outside 0..n_experts",
            });
        }
        for &e in ids {
            if let Some(c) = usize::try_from(e).ok().and_then(|e| self.counts.get_mut(e)) {
                *c += 1;
            }
        }
        Ok(())
    }

    pub fn counts(&self) -> &[u64] {
        &self.counts
    }
}

/// A placement of `load.len()` experts on `ranks` · `slots_per_rank` slots
/// that evens the per-rank load (EPLB's greedy scheme):
///
/// 1. the spare slots (slots − experts) go one at a time to the expert with
///    the largest load per replica (ties: the lower id), at most one replica
///    per rank;
/// 2. the replicas, heaviest first (ties: the lower expert id), each go to
///    the least-loaded rank with a free slot that does not hold that expert
///    yet (ties: the lower rank). When only ranks holding it have free
///    slots, a replica of another expert moves from a full rank to one of
///    them, and the full rank takes this one (such a move always exists);
/// 3. each rank lists its experts in ascending id.
///
/// Deterministic for a given input. Needs experts ≤ slots and
/// slots_per_rank ≤ experts (a rank holds distinct experts).
pub fn balance(load: &[u64], ranks: usize, slots_per_rank: usize) -> Result<Placement> {
    let n = load.len();
    let slots = ranks.saturating_mul(slots_per_rank);
    if slots > EP_MAX_SLOTS || ranks > EP_MAX_RANKS {
        return Err(arg(
            "slots_per_rank",
            format!("{slots_per_rank} on {ranks} ranks"),
            "a placement has at most 2^20 slots and 2^16 ranks",
        ));
    }
    if n == 0 || slots < n || slots_per_rank > n {
        return Err(arg(
            "slots_per_rank",
            format!("{slots_per_rank} on {ranks} ranks for {n} experts"),
            "needs experts <= ranks * slots_per_rank and slots_per_rank <= experts",
        ));
    }
    let cap = u64::try_from(ranks).unwrap_or(u64::MAX);
    let mut copies = vec![1u64; n];
    // Load per replica compared exactly: a/b > c/d ⇔ a·d > c·b (u128).
    let heavier = |a: (u64, u64), b: (u64, u64)| {
        u128::from(a.0) * u128::from(b.1) > u128::from(b.0) * u128::from(a.1)
    };
    // Step 1 on a heap of (load per replica, expert): the heaviest, ties to
    // the lower id, while below the cap (some expert is: slots ≤ ranks · n).
    let mut hot: BinaryHeap<Hot> = (0..n)
        .filter(|_| cap > 1)
        .map(|e| Hot {
            load: load[e],
            copies: 1,
            e,
        })
        .collect();
    for _ in n..slots {
        let Some(mut h) = hot.pop() else { break };
        h.copies += 1;
        copies[h.e] = h.copies;
        if h.copies < cap {
            hot.push(h);
        }
    }
    let mut items: Vec<usize> = (0..n)
        .flat_map(|e| std::iter::repeat_n(e, usize::try_from(copies[e]).unwrap_or(0)))
        .collect();
    items.sort_by(|&a, &b| {
        let (la, lb) = ((load[a], copies[a]), (load[b], copies[b]));
        if heavier(la, lb) {
            std::cmp::Ordering::Less
        } else if heavier(lb, la) {
            std::cmp::Ordering::Greater
        } else {
            a.cmp(&b)
        }
    });
    let share = |e: usize| load[e] as f64 / copies[e] as f64;
    let mut per_rank: Vec<Vec<usize>> = vec![Vec::with_capacity(slots_per_rank); ranks];
    let mut holds: Vec<HashSet<usize>> = vec![HashSet::new(); ranks];
    let mut rank_load = vec![0.0f64; ranks];
    // Step 2's ranks with room, least loaded first (ties: the lower rank);
    // an entry whose load is no longer its rank's is stale and dropped.
    // Loads are finite and ≥ 0, so their bit patterns order like them.
    let mut open: BinaryHeap<Reverse<(u64, usize)>> =
        (0..ranks).map(|r| Reverse((0f64.to_bits(), r))).collect();
    for e in items {
        let mut skipped = Vec::new();
        let mut target = None;
        while let Some(Reverse((bits, r))) = open.pop() {
            if bits != rank_load[r].to_bits() || per_rank[r].len() >= slots_per_rank {
                continue;
            }
            if holds[r].contains(&e) {
                skipped.push(Reverse((bits, r)));
                continue;
            }
            target = Some(r);
            break;
        }
        open.extend(skipped);
        let r = match target {
            Some(r) => r,
            None => {
                // Every rank with room holds e. A full rank without e exists
                // (e has fewer than `ranks` replicas placed), and it holds
                // some f the roomy rank lacks (it holds more experts).
                let has_room = |r: &Vec<usize>| r.len() < slots_per_rank;
                let roomy = (0..ranks).find(|&r| has_room(&per_rank[r]));
                let full = (0..ranks).find(|&r| !holds[r].contains(&e));
                let (Some(roomy), Some(full)) = (roomy, full) else {
                    return Err(arg(
                        "slots_per_rank",
                        slots_per_rank,
                        "no slot left for a replica",
                    ));
                };
                let Some(at) = per_rank[full]
                    .iter()
                    .position(|f| !holds[roomy].contains(f))
                else {
                    return Err(arg("slots_per_rank", slots_per_rank, "no replica to move"));
                };
                let f = per_rank[full].swap_remove(at);
                holds[full].remove(&f);
                rank_load[full] -= share(f);
                per_rank[roomy].push(f);
                holds[roomy].insert(f);
                rank_load[roomy] += share(f);
                if per_rank[roomy].len() < slots_per_rank {
                    open.push(Reverse((rank_load[roomy].to_bits(), roomy)));
                }
                full
            }
        };
        per_rank[r].push(e);
        holds[r].insert(e);
        rank_load[r] += share(e);
        if per_rank[r].len() < slots_per_rank {
            open.push(Reverse((rank_load[r].to_bits(), r)));
        }
    }
    let mut table = Vec::with_capacity(slots);
    for mut experts in per_rank {
        experts.sort_unstable();
        table.extend(experts);
    }
    Placement::from_table(n, ranks, table)
}

/// An expert in step 1 of [`balance`]: greater when its load per replica is
/// larger (exactly, as a rational), then when its id is lower.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Hot {
    load: u64,
    copies: u64,
    e: usize,
}

impl Ord for Hot {
    fn cmp(&self, other: &Self) -> Ordering {
        let a = u128::from(self.load) * u128::from(other.copies);
        let b = u128::from(other.load) * u128::from(self.copies);
        a.cmp(&b).then(other.e.cmp(&self.e))
    }
}

impl PartialOrd for Hot {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
