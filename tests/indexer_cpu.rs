//! Indexer reference: BF16 score roundings against an independent evaluation
//! of §3.5, the top-K output convention, the tie rule, and the candidate
//! pre-filter's pinning and keep rules (§3.6), by brute force.

mod common;

use deepinfer::cpu_backend::indexer::*;
use half::bf16;
use rand::Rng;

#[test]
fn scores_round_each_product_to_bf16_and_mask_invisible_entries() {
    let mut rng = common::rng("index_scores");
    let (heads, dim, n) = (4, 32, 40);
    let q = common::random_activations(&mut rng, heads * dim, 1.0);
    let keys = common::random_activations(&mut rng, n * dim, 1.0);
    let w = common::random_activations(&mut rng, heads, 0.1);
    let s = index_scores(&q, &keys, &w, dim, 30);
    for t in 0..n {
        if t >= 30 {
            assert_eq!(s[t], f32::NEG_INFINITY);
            continue;
        }
        let (mut acc, mut abs_acc, mut slack) = (0.0f64, 0.0f64, 0.0f64);
        for h in 0..heads {
            let dot: f64 = (0..dim)
                .map(|d| q[h * dim + d].to_f64() * keys[t * dim + d].to_f64())
                .sum();
            let terms: f64 = (0..dim)
                .map(|d| (q[h * dim + d].to_f64() * keys[t * dim + d].to_f64()).abs())
                .sum();
            let relu = bf16::from_f64(dot).to_f64().max(0.0);
            let weighted = bf16::from_f64(w[h].to_f64() * relu).to_f64();
            acc += weighted;
            abs_acc += weighted.abs();
            // An fp32 dot product is within dim·2^-24·Σ|q·k| of `dot`, and
            // that error can move it across a BF16 rounding boundary (one ulp,
            // ≤ |dot|·2^-7); the weighted product rounds once more.
            let dot_err = dim as f64 * 2f64.powi(-24) * terms + dot.abs() * 2f64.powi(-7);
            slack += w[h].to_f64().abs() * (dot_err * 1.01 + (relu + dot_err) * 2f64.powi(-7));
        }
        // The head sum is fp32 and the score rounds once to BF16.
        let got = f64::from(s[t]);
        assert!(
            common::bf16_ulps(bf16::from_f32(s[t]), bf16::from_f64(acc)) <= 1
                || (got - acc).abs()
                    <= slack + heads as f64 * 2f64.powi(-24) * abs_acc + acc.abs() * 2f64.powi(-8),
            "entry {t}: {got} vs {acc} (slack {slack})"
        );
        assert_eq!(
            bf16::from_f32(s[t]).to_f32(),
            s[t],
            "scores are BF16 values"
        );
    }
}

#[test]
fn selection_sorts_picks_drops_invisible_ones_and_adds_the_offset() {
    let scores = [0.5, 3.0, 2.0, 1.0, f32::NEG_INFINITY, f32::NEG_INFINITY];
    // K = 5 over 4 visible entries: the 5th pick is a -inf one.
    assert_eq!(select(&scores, 5, 4, 128), vec![128, 129, 130, 131, -1]);
    assert_eq!(select(&scores, 2, 4, 0), vec![1, 2]);
}

#[test]
fn ties_go_to_the_lower_index() {
    let scores = [1.0f32; 10];
    assert_eq!(select(&scores, 3, 10, 0), vec![0, 1, 2]);
    let mut rng = common::rng("topk_ties");
    for _ in 0..200 {
        // BF16-like coarse scores make ties frequent.
        let s: Vec<f32> = (0..100)
            .map(|_| (rng.random_range(0..8) as f32) * 0.25)
            .collect();
        let k = rng.random_range(1..50);
        let got = select(&s, k, 100, 0);
        let kth = {
            let mut v = s.clone();
            v.sort_by(|a, b| b.total_cmp(a));
            v[k - 1]
        };
        let above = s.iter().filter(|&&x| x > kth).count();
        let tied: Vec<i32> = (0..100)
            .filter(|&t| s[t] == kth)
            .map(|t| t as i32)
            .collect();
        let mut want: Vec<i32> = (0..100).filter(|&t| s[t] > kth).map(|t| t as i32).collect();
        want.extend(&tied[..k - above]);
        want.sort_unstable();
        assert_eq!(got, want);
    }
}

#[test]
fn the_candidate_filter_pins_the_newest_block_and_keeps_the_best() {
    let mut rng = common::rng("candidates");
    for _ in 0..200 {
        let n = rng.random_range(1..200);
        let visible = rng.random_range(0..=n);
        let scores: Vec<f32> = (0..n)
            .map(|t| {
                if t < visible {
                    rng.random_range(-2.0..2.0)
                } else {
                    f32::NEG_INFINITY
                }
            })
            .collect();
        let keep = rng.random_range(1..6);
        let mask = candidate_mask(&scores, visible, 8, keep);
        let kept_blocks: Vec<usize> = (0..n.div_ceil(8)).filter(|&b| mask[b * 8]).collect();
        if visible == 0 {
            assert!(kept_blocks.is_empty(), "nothing is reachable");
            continue;
        }
        let newest = (visible - 1) / 8;
        assert!(kept_blocks.contains(&newest), "newest block pinned");
        let reachable = visible.div_ceil(8);
        assert_eq!(kept_blocks.len(), keep.min(reachable));
        // Every kept block other than the pinned one scores at least as high as every dropped reachable block.
        let bmax = |b: usize| {
            (b * 8..((b + 1) * 8).min(visible))
                .map(|t| scores[t])
                .fold(f32::NEG_INFINITY, f32::max)
        };
        let worst_kept = kept_blocks
            .iter()
            .filter(|&&b| b != newest)
            .map(|&b| bmax(b))
            .fold(f32::INFINITY, f32::min);
        for b in (0..reachable).filter(|b| !kept_blocks.contains(b)) {
            assert!(bmax(b) <= worst_kept, "dropped block {b} beats a kept one");
        }
    }
}

#[test]
fn reindexing_only_selects_inside_the_candidates() {
    let scores: Vec<f32> = (0..32).map(|t| t as f32).collect();
    let mask: Vec<bool> = (0..32).map(|t| t < 8).collect();
    assert_eq!(
        select(&mask_scores(&scores, &mask), 3, 32, 0),
        vec![5, 6, 7]
    );
}
