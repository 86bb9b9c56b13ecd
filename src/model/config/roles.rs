//! Derivation of every layer's role from a config:
//! [`ModelConfig::layer_plans`] and the layer-list, ratio and candidate checks
//! it runs first (spec §2).
//!
//! Invariant: layers are planned in order, each seeing only what the layers
//! before it published ([`Published`]); a plan that would read a cache or a
//! top-k nobody published is an error, never a guess.

use std::collections::HashSet;

use super::error::ConfigError;
use super::keys;
use super::layer_plan::{AttentionPlan, CompressorPlan, LayerPlan, Selection};
use super::types::ModelConfig;

impl ModelConfig {
    /// The role of every layer, backbone then DSpark stages, derived by the
    /// rules of spec §2:
    ///
    /// - r_l = `compress_ratios[l]`; layers ≥ `n_layers` are DSpark stages
    ///   (ratio 0, never sources).
    /// - KV source ⇔ l is a backbone layer in `kv_source_layers` (ratio > 0;
    ///   a gated compressor iff r_l > 1). Index source ⇔ l is in
    ///   `index_source_layers`; one that is also a KV source owns the keys,
    ///   one that is not is a Reindex layer.
    /// - A layer with r_l > 0 reads the most recent KV source at or before
    ///   it, whose ratio must be r_l. An index source scores that source's
    ///   keys, restricted to the candidate blocks when
    ///   0 ≤ candidate source < l. Any other ratio > 0 layer reuses the top-k
    ///   of the nearest preceding index source, which must read the same KV
    ///   source.
    /// - RoPE by [`RopeConfig::for_ratio`](super::RopeConfig::for_ratio);
    ///   Engram and DSpark targets by membership in their lists.
    pub fn layer_plans(&self) -> Result<Vec<LayerPlan>, ConfigError> {
        self.check_layer_lists()?;
        self.check_ratios()?;
        self.check_candidate()?;
        let mut published = Published::default();
        self.compress_ratios
            .iter()
            .enumerate()
            .map(|(layer, &ratio)| self.plan_layer(layer, ratio, &mut published))
            .collect()
    }

    fn plan_layer(
        &self,
        layer: usize,
        ratio: usize,
        published: &mut Published,
    ) -> Result<LayerPlan, ConfigError> {
        let backbone = layer < self.n_layers;
        let kv_source = backbone && self.kv_source_layers.contains(&layer);
        let index_source = backbone && self.index_source_layers.contains(&layer);
        if kv_source {
            if ratio == 0 {
                return Err(ConfigError::KvSourceRatioZero { layer });
            }
            published.kv_source = Some((layer, ratio));
        }
        let attention = if ratio == 0 {
            if index_source {
                return Err(ConfigError::IndexSourceRatioZero { layer });
            }
            AttentionPlan::WindowOnly
        } else {
            self.sparse_attention(layer, ratio, index_source, published)?
        };
        Ok(LayerPlan {
            layer,
            ratio,
            dspark_stage: layer.checked_sub(self.n_layers),
            compressor: kv_source.then_some(CompressorPlan { gated: ratio > 1 }),
            attention,
            candidate_source: self.candidate.is_some_and(|c| c.source_layer == layer),
            rope: self.rope.for_ratio(ratio),
            engram: position(&self.engram.layer_ids, layer),
            dspark_target: position(&self.dspark.target_layers, layer),
        })
    }

    fn sparse_attention(
        &self,
        layer: usize,
        ratio: usize,
        index_source: bool,
        published: &mut Published,
    ) -> Result<AttentionPlan, ConfigError> {
        let role = if index_source {
            "index source"
        } else {
            "reuse"
        };
        let (kv_source, kv_ratio) =
            published
                .kv_source
                .ok_or(ConfigError::NoKvSource { layer, ratio, role })?;
        if kv_ratio != ratio {
            return Err(ConfigError::RatioMismatch {
                layer,
                ratio,
                kv_source,
                kv_ratio,
            });
        }
        let selection = if index_source {
            let candidates_from = self
                .candidate
                .map(|c| c.source_layer)
                .filter(|&c| c < layer);
            if let Some(candidate_source) = candidates_from
                && candidate_source != kv_source
            {
                return Err(ConfigError::CandidateKvMismatch {
                    layer,
                    kv_source,
                    candidate_source,
                });
            }
            published.index_source = Some((layer, kv_source));
            Selection::Indexer { candidates_from }
        } else {
            let (index_source, index_kv_source) = published
                .index_source
                .ok_or(ConfigError::NoIndexSource { layer, ratio })?;
            if index_kv_source != kv_source {
                return Err(ConfigError::ReuseAcrossKvSources {
                    layer,
                    kv_source,
                    index_source,
                    index_kv_source,
                });
            }
            Selection::Reuse { index_source }
        };
        Ok(AttentionPlan::Sparse {
            kv_source,
            selection,
        })
    }

    /// Every listed layer id is a backbone layer, listed once.
    pub(super) fn check_layer_lists(&self) -> Result<(), ConfigError> {
        let lists = [
            (keys::KV_SOURCES, &self.kv_source_layers),
            (keys::INDEX_SOURCES, &self.index_source_layers),
            (keys::ENGRAM_LAYERS, &self.engram.layer_ids),
            (keys::DSPARK_TARGETS, &self.dspark.target_layers),
        ];
        for (key, ids) in lists {
            let mut seen = HashSet::new();
            for &id in ids {
                if id >= self.n_layers {
                    return Err(ConfigError::LayerOutOfRange {
                        key,
                        id,
                        n_layers: self.n_layers,
                    });
                }
                if !seen.insert(id) {
                    return Err(ConfigError::Duplicate { key, id });
                }
            }
        }
        Ok(())
    }

    fn check_ratios(&self) -> Result<(), ConfigError> {
        if self.compress_ratios.len() != self.n_total_layers() {
            return Err(ConfigError::RatiosLength {
                len: self.compress_ratios.len(),
                n_layers: self.n_layers,
                n_stages: self.dspark.n_stages,
            });
        }
        for (layer, &ratio) in self.compress_ratios.iter().enumerate() {
            if ratio > 2 {
                return Err(ConfigError::UnsupportedRatio { layer, ratio });
            }
            if let Some(stage) = layer.checked_sub(self.n_layers)
                && ratio != 0
            {
                return Err(ConfigError::StageRatio {
                    layer,
                    stage,
                    ratio,
                });
            }
        }
        Ok(())
    }

    fn check_candidate(&self) -> Result<(), ConfigError> {
        let Some(candidate) = self.candidate else {
            return Ok(());
        };
        let layer = candidate.source_layer;
        if layer >= self.n_layers {
            return Err(ConfigError::LayerOutOfRange {
                key: keys::CANDIDATE_SOURCE,
                id: layer,
                n_layers: self.n_layers,
            });
        }
        if !self.index_source_layers.contains(&layer) {
            return Err(ConfigError::CandidateNotIndexSource { layer });
        }
        if !self.kv_source_layers.contains(&layer) {
            return Err(ConfigError::CandidateNotKvSource { layer });
        }
        Ok(())
    }
}

/// What the layers so far have published for the ones after them: the
/// latest KV source (layer, ratio) and the latest index source (layer, the KV
/// source it selects from).
#[derive(Default)]
struct Published {
    kv_source: Option<(usize, usize)>,
    index_source: Option<(usize, usize)>,
}

fn position(ids: &[usize], layer: usize) -> Option<usize> {
    ids.iter().position(|&id| id == layer)
}
