//! The Engram compressed-token map a model directory uses (`v41-flash.md`
//! §8.1): `engram_token_map.json` beside the config when present and
//! current, else built from the directory's `tokenizer.json` and cached
//! there. A checkpoint without a tokenizer (a generated test model) ships
//! its own map file.
//!
//! Invariant: a map handed to the model has exactly `vocab_size` entries,
//! each a class below `engram_compressed_vocab_size`, and exactly that many
//! classes occur; a map cached from a tokenizer is rebuilt when the
//! tokenizer file's bytes change (FNV-1a 64 of the file is recorded).

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::config::ModelConfig;
use super::tokenizer::{TOKENIZER_FILE, Tokenizer, TokenizerError, engram_token_map};
use crate::model::checkpoint::CheckpointError;
use crate::model::error::{Error, Result};
use crate::numerics::fnv1a64;

/// The map's file name inside a model directory.
pub const MAP_FILE: &str = "engram_token_map.json";
const FORMAT: &str = "deepinfer engram token map 1";

/// Errors of a map file.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    /// The model has Engram layers but neither a map nor a tokenizer.
    #[error(
        "the model has Engram layers but {dir} holds neither {MAP_FILE} nor {TOKENIZER_FILE} \
         (the compressed-token map is built from the tokenizer)"
    )]
    Missing { dir: PathBuf },
    /// The map file is not a map.
    #[error("{path}: {why}")]
    Corrupt { path: PathBuf, why: String },
    /// The map does not cover the vocabulary.
    #[error("{path}: {found} entries, the config's vocab_size is {expected}")]
    Length {
        path: PathBuf,
        found: usize,
        expected: usize,
    },
}

/// A parsed map file.
struct MapFile {
    tokenizer_hash: Option<u64>,
    classes: usize,
    map: Vec<i64>,
}

fn read_map(path: &Path) -> Result<MapFile> {
    let corrupt = |why: String| {
        Error::EngramMap(MapError::Corrupt {
            path: path.to_path_buf(),
            why,
        })
    };
    let text = std::fs::read_to_string(path).map_err(CheckpointError::io(path))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| corrupt(e.to_string()))?;
    if v.get("format").and_then(Value::as_str) != Some(FORMAT) {
        return Err(corrupt(format!("\"format\" is not \"{FORMAT}\"")));
    }
    let tokenizer_hash = match v.get("tokenizer_fnv1a64") {
        None | Some(Value::Null) => None,
        Some(h) => Some(
            h.as_str()
                .and_then(|s| u64::from_str_radix(s, 16).ok())
                .ok_or_else(|| corrupt("\"tokenizer_fnv1a64\" is not a hex string".into()))?,
        ),
    };
    let classes = v
        .get("classes")
        .and_then(Value::as_u64)
        .and_then(|c| usize::try_from(c).ok())
        .ok_or_else(|| corrupt("\"classes\" is not a count".into()))?;
    let map = v
        .get("map")
        .and_then(Value::as_array)
        .ok_or_else(|| corrupt("\"map\" is not an array".into()))?
        .iter()
        .enumerate()
        .map(|(i, c)| {
            c.as_i64()
                .filter(|&c| usize::try_from(c).is_ok_and(|c| c < classes))
                .ok_or_else(|| corrupt(format!("map[{i}] = {c} is not a class below {classes}")))
        })
        .collect::<Result<Vec<i64>>>()?;
    Ok(MapFile {
        tokenizer_hash,
        classes,
        map,
    })
}

/// Writes a map file (`tokenizer_hash` None for a map not derived from a
/// tokenizer).
pub fn write_map(
    dir: &Path,
    map: &[i64],
    classes: usize,
    tokenizer_hash: Option<u64>,
) -> Result<()> {
    let path = dir.join(MAP_FILE);
    let v = json!({
        "format": FORMAT,
        "tokenizer_fnv1a64": tokenizer_hash.map(|h| format!("{h:016x}")),
        "classes": classes,
        "map": map,
    });
    let tmp = dir.join(format!("{MAP_FILE}.tmp{}", std::process::id()));
    std::fs::write(&tmp, v.to_string()).map_err(CheckpointError::io(&tmp))?;
    Ok(std::fs::rename(&tmp, &path).map_err(CheckpointError::io(&path))?)
}

/// Checks a map against the config (entry count, class count).
fn check(cfg: &ModelConfig, path: &Path, map: &[i64], classes: usize) -> Result<()> {
    if map.len() != cfg.vocab_size {
        return Err(Error::EngramMap(MapError::Length {
            path: path.to_path_buf(),
            found: map.len(),
            expected: cfg.vocab_size,
        }));
    }
    let expected = cfg.engram.compressed_vocab;
    if classes != expected {
        let first = map
            .iter()
            .enumerate()
            .filter(|&(_, &c)| usize::try_from(c).is_ok_and(|c| c >= expected))
            .take(8)
            .map(|(id, c)| format!("id {id} -> class {c}"))
            .collect::<Vec<_>>();
        let first = if first.is_empty() {
            format!("all ids fall in {classes} classes")
        } else {
            first.join(", ")
        };
        return Err(Error::Tokenizer(TokenizerError::ClassCount {
            expected,
            found: classes,
            first,
        }));
    }
    Ok(())
}

/// The map for the model in `dir`; empty when the config has no Engram
/// layers. A map built from the tokenizer is cached in `dir` (a read-only
/// directory only costs the rebuild next time, with a warning).
pub fn load_or_build(dir: &Path, cfg: &ModelConfig) -> Result<Vec<i64>> {
    if cfg.engram.layer_ids.is_empty() {
        return Ok(Vec::new());
    }
    let (map_path, tok_path) = (dir.join(MAP_FILE), dir.join(TOKENIZER_FILE));
    let tok_hash = if tok_path.is_file() {
        Some(fnv1a64(
            &std::fs::read(&tok_path).map_err(CheckpointError::io(&tok_path))?,
        ))
    } else {
        None
    };
    if map_path.is_file() {
        let f = read_map(&map_path)?;
        if tok_hash.is_none() || f.tokenizer_hash == tok_hash {
            check(cfg, &map_path, &f.map, f.classes)?;
            return Ok(f.map);
        }
        tracing::info!(path = %map_path.display(), "tokenizer changed; rebuilding the Engram token map");
    }
    let Some(hash) = tok_hash else {
        return Err(Error::EngramMap(MapError::Missing {
            dir: dir.to_path_buf(),
        }));
    };
    let tok = Tokenizer::from_file(&tok_path)?;
    let (map, classes) = engram_token_map(&tok)?;
    check(cfg, &tok_path, &map, classes)?;
    if let Err(e) = write_map(dir, &map, classes, Some(hash)) {
        tracing::warn!(dir = %dir.display(), error = %e, "could not cache the Engram token map");
    }
    Ok(map)
}
