//! The token layout the grouped expert GEMMs need after routing (issue 6,
//! item 6): per-expert token counts, exclusive offsets, and a deterministic
//! permutation of the routed (token, slot) entries grouped by expert.
//!
//! Entry `j = token · top_k + slot` is the slot-th selected expert of a
//! token (the `ids` of [`moe_route`](crate::ops::moe_route), `[T, top_k]`
//! row-major). The permutation lists every entry once, grouped by expert in
//! ascending expert id and, within an expert, in ascending token index (a
//! token selects an expert at most once, so this is ascending `j`): a stable
//! counting sort by expert id.

/// Counts, offsets and permutation of one routed batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoeLayout {
    /// Entries routed to each expert, `[n_experts]`.
    pub counts: Vec<i32>,
    /// Exclusive prefix sums of `counts`, `[n_experts + 1]`; the last is the
    /// number of entries.
    pub offsets: Vec<i32>,
    /// Entry indices `token · top_k + slot` grouped by expert (expert `e`'s
    /// entries at `offsets[e] .. offsets[e + 1]`), ascending within a group.
    pub permutation: Vec<i32>,
}

/// The layout of `ids` (`[T, top_k]` row-major expert ids, each in
/// `0..n_experts`). Panics on an id out of range or more than 2^31 − 1
/// entries (the layout is int32).
pub fn moe_layout(ids: &[i32], n_experts: usize) -> MoeLayout {
    assert!(
        i32::try_from(ids.len()).is_ok(),
        "moe_layout: too many entries"
    );
    let mut counts = vec![0i32; n_experts];
    for &e in ids {
        let e = usize::try_from(e)
            .ok()
            .filter(|&e| e < n_experts)
            .unwrap_or_else(|| panic!("moe_layout: expert id {e} out of 0..{n_experts}"));
        counts[e] += 1;
    }
    let mut offsets = Vec::with_capacity(n_experts + 1);
    let mut acc = 0i32;
    offsets.push(acc);
    for &c in &counts {
        acc += c;
        offsets.push(acc);
    }
    let mut next: Vec<i32> = offsets[..n_experts].to_vec();
    let mut permutation = vec![0i32; ids.len()];
    for (j, &e) in ids.iter().enumerate() {
        let slot = &mut next[e as usize];
        permutation[*slot as usize] = j as i32;
        *slot += 1;
    }
    MoeLayout {
        counts,
        offsets,
        permutation,
    }
}
