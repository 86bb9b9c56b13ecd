//! Loads a directory of `*.safetensors` shards, memory-mapped, against a
//! [`Manifest`], and hands out typed views of its tensors. With a
//! `model.safetensors.index.json`, only the shards it lists are read (a
//! stray shard is ignored with one warning) and every tensor must sit in
//! the shard the index names.
//!
//! Loading maps every shard, parses and checks each header with the
//! safetensors crate (a header length beyond the file or data offsets beyond
//! the buffer is a [`CheckpointError::CorruptShard`] naming the file; a
//! readable header whose data runs past the end of the file is a
//! [`CheckpointError::TruncatedShard`] naming the first tensor cut off), then
//! compares the union of the shards with the manifest and reports every
//! missing, unexpected, wrongly typed, wrongly shaped and duplicated tensor
//! in one [`CheckpointError::Invalid`]. Tensors the manifest declares
//! ignorable are skipped. With [`LoadOptions::check_finite`] every expected
//! tensor is then scanned for NaN/±Inf ([`CheckpointError::NonFinite`] names
//! each bad tensor and its first bad index). A progress bar is drawn on
//! stderr for large loads (see [`Progress`]).
//!
//! Invariant: the views of a [`Checkpoint`] point into shards whose headers
//! were validated, with the manifest's dtype and shape, so their byte length
//! is exactly `numel × dtype size`. The only `unsafe` is the mapping itself.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use half::bf16;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use super::error::{CheckpointError, NonFiniteValue, TensorProblem};
use super::manifest::Manifest;
use super::param::CheckpointDType;
use super::view::TensorView;
use crate::dtype::{E4M3, E8M0, Fp4x2};
use crate::model::config::ModelConfig;
use crate::tensor::Tensor;

/// [`Progress::Auto`] draws a bar from this many shard bytes on.
pub const PROGRESS_THRESHOLD: u64 = 1 << 30;

/// Bytes of the little-endian header-length prefix of a safetensors file.
const HEADER_LEN_BYTES: usize = 8;

/// When to draw the loading progress bar on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Progress {
    /// From [`PROGRESS_THRESHOLD`] bytes on, and only when stderr is a
    /// terminal (indicatif hides the bar otherwise).
    #[default]
    Auto,
    Never,
    /// Whatever the size (still hidden when stderr is not a terminal).
    Always,
}

/// Options of [`Checkpoint::load`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LoadOptions {
    /// Scan every tensor for NaN/±Inf (reads every byte once).
    pub check_finite: bool,
    pub progress: Progress,
    /// Keep the shards' pages in the page cache after the weight loader
    /// converted them ([`Checkpoint::release`] does nothing). Off by
    /// default, so a host holds one copy of a weight, not two.
    pub keep_page_cache: bool,
}

#[derive(Debug)]
struct Shard {
    path: PathBuf,
    /// Open for `posix_fadvise` (the page-cache hint of `release`).
    file: File,
    map: Mmap,
}

/// Where one expected tensor lies.
#[derive(Debug)]
struct Entry {
    shard: usize,
    dtype: CheckpointDType,
    shape: Vec<usize>,
    bytes: Range<usize>,
    /// [`Checkpoint::release`] was called for it (counted once per shard).
    released: AtomicBool,
}

/// A tensor as a shard header declares it.
struct Found {
    shard: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Range<usize>,
}

/// Every shard mapped with the tensors its header declares: each name once
/// (first shard wins), later copies recorded as duplicates.
struct Headers {
    shards: Vec<Shard>,
    found: Vec<(String, Found)>,
    by_name: HashMap<String, usize>,
    duplicates: Vec<TensorProblem>,
}

impl Headers {
    fn read(paths: Vec<PathBuf>, bar: &ProgressBar) -> Result<Headers, CheckpointError> {
        let mut headers = Headers {
            shards: Vec::with_capacity(paths.len()),
            found: Vec::new(),
            by_name: HashMap::new(),
            duplicates: Vec::new(),
        };
        for path in paths {
            let shard = headers.shards.len();
            let (file, map) = map_shard(&path)?;
            for (name, tensor) in read_header(&path, &map, shard)? {
                if let Some(f) = headers
                    .by_name
                    .get(&name)
                    .and_then(|&i| headers.found.get(i))
                {
                    let first = headers.file(&f.1);
                    headers.duplicates.push(TensorProblem::Duplicate {
                        name,
                        first,
                        second: path.clone(),
                    });
                    continue;
                }
                headers.by_name.insert(name.clone(), headers.found.len());
                headers.found.push((name, tensor));
            }
            bar.inc(map.len() as u64);
            headers.shards.push(Shard { path, file, map });
        }
        Ok(headers)
    }

    /// The shard path of a tensor found in an already-read shard.
    fn file(&self, tensor: &Found) -> PathBuf {
        self.shards
            .get(tensor.shard)
            .map(|s| s.path.clone())
            .unwrap_or_default()
    }

    /// The entries of the expected tensors that match, and every problem:
    /// duplicates, then missing / wrong dtype / wrong shape in manifest
    /// order, then unexpected tensors in shard order.
    fn match_manifest(
        &self,
        manifest: &Manifest,
        index: Option<&WeightMap>,
    ) -> (HashMap<String, Entry>, Vec<TensorProblem>) {
        let mut problems = self.duplicates.clone();
        if let Some(index) = index {
            for (name, tensor) in &self.found {
                let file = self.file(tensor);
                let held = file.file_name().and_then(|f| f.to_str()).unwrap_or("");
                let listed = index.get(name).map(String::as_str).unwrap_or("no shard");
                if listed != held {
                    problems.push(TensorProblem::WrongShard {
                        name: name.clone(),
                        listed: listed.to_string(),
                        file,
                    });
                }
            }
        }
        let mut entries = HashMap::with_capacity(manifest.len());
        for spec in manifest.tensors() {
            let Some((_, tensor)) = self
                .by_name
                .get(&spec.name)
                .and_then(|&i| self.found.get(i))
            else {
                problems.push(TensorProblem::Missing {
                    name: spec.name.clone(),
                    dtype: spec.dtype,
                    shape: spec.shape.clone(),
                });
                continue;
            };
            let dtype_ok = CheckpointDType::from_safetensors(tensor.dtype) == Some(spec.dtype);
            if !dtype_ok {
                problems.push(TensorProblem::WrongDType {
                    name: spec.name.clone(),
                    expected: spec.dtype,
                    found: tensor.dtype.to_string(),
                    file: self.file(tensor),
                });
            }
            if tensor.shape != spec.shape {
                problems.push(TensorProblem::WrongShape {
                    name: spec.name.clone(),
                    expected: spec.shape.clone(),
                    found: tensor.shape.clone(),
                    file: self.file(tensor),
                });
            }
            if dtype_ok && tensor.shape == spec.shape {
                let entry = Entry {
                    shard: tensor.shard,
                    dtype: spec.dtype,
                    shape: spec.shape.clone(),
                    bytes: tensor.bytes.clone(),
                    released: AtomicBool::new(false),
                };
                entries.insert(spec.name.clone(), entry);
            }
        }
        for (name, tensor) in &self.found {
            if manifest.get(name).is_none() && !manifest.is_ignored(name) {
                problems.push(TensorProblem::Unexpected {
                    name: name.clone(),
                    file: self.file(tensor),
                });
            }
        }
        (entries, problems)
    }
}

/// A validated, memory-mapped checkpoint.
#[derive(Debug)]
pub struct Checkpoint {
    dir: PathBuf,
    manifest: Manifest,
    shards: Vec<Shard>,
    entries: HashMap<String, Entry>,
    keep_page_cache: bool,
    /// Per shard, its manifest tensors not yet released.
    unreleased: Vec<AtomicUsize>,
}

impl Checkpoint {
    /// Loads `dir` against the manifest of `config`.
    pub fn load(
        dir: &Path,
        config: &ModelConfig,
        options: &LoadOptions,
    ) -> Result<Checkpoint, CheckpointError> {
        Checkpoint::load_with_manifest(dir, Manifest::new(config)?, options)
    }

    /// Loads `dir` against `manifest`.
    pub fn load_with_manifest(
        dir: &Path,
        manifest: Manifest,
        options: &LoadOptions,
    ) -> Result<Checkpoint, CheckpointError> {
        let (paths, index) = shard_paths(dir)?;
        let mut total = 0u64;
        for path in &paths {
            total += std::fs::metadata(path)
                .map_err(CheckpointError::io(path))?
                .len();
        }
        let passes = if options.check_finite { 2 } else { 1 };
        let bar = progress_bar(options.progress, total, passes);
        let loaded = Checkpoint::map_and_check(dir, manifest, paths, index.as_ref(), options, &bar);
        bar.finish_and_clear();
        loaded
    }

    fn map_and_check(
        dir: &Path,
        manifest: Manifest,
        paths: Vec<PathBuf>,
        index: Option<&WeightMap>,
        options: &LoadOptions,
        bar: &ProgressBar,
    ) -> Result<Checkpoint, CheckpointError> {
        bar.set_message("mapping shards");
        let headers = Headers::read(paths, bar)?;
        let (entries, problems) = headers.match_manifest(&manifest, index);
        if !problems.is_empty() {
            return Err(CheckpointError::Invalid {
                dir: dir.to_path_buf(),
                problems,
            });
        }
        let mut unreleased: Vec<usize> = vec![0; headers.shards.len()];
        for e in entries.values() {
            if let Some(n) = unreleased.get_mut(e.shard) {
                *n += 1;
            }
        }
        let checkpoint = Checkpoint {
            dir: dir.to_path_buf(),
            manifest,
            shards: headers.shards,
            entries,
            keep_page_cache: options.keep_page_cache,
            unreleased: unreleased.into_iter().map(AtomicUsize::new).collect(),
        };
        if options.check_finite {
            bar.set_message("checking values");
            checkpoint.check_finite(bar)?;
        }
        Ok(checkpoint)
    }

    fn check_finite(&self, bar: &ProgressBar) -> Result<(), CheckpointError> {
        let mut bad = Vec::new();
        for spec in self.manifest.tensors() {
            let view = self.get(&spec.name)?;
            if let Some(index) = first_non_finite(view.dtype, view.bytes) {
                bad.push(NonFiniteValue {
                    name: spec.name.clone(),
                    file: view.file.to_path_buf(),
                    index,
                    position: unravel(index, view.shape),
                });
            }
            bar.inc(view.bytes.len() as u64);
        }
        if bad.is_empty() {
            Ok(())
        } else {
            Err(CheckpointError::NonFinite(bad))
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The shard files, in name order.
    pub fn shard_paths(&self) -> impl Iterator<Item = &Path> {
        self.shards.iter().map(|s| s.path.as_path())
    }

    /// Drops tensor `name`'s pages from the mapping and the page cache
    /// (`pages.rs`), and the whole shard's once every manifest tensor in it
    /// was released, unless [`LoadOptions::keep_page_cache`]: the weight
    /// loader calls it once it holds its own copy of the tensor. A later
    /// [`Checkpoint::get`] of it still reads the same bytes (from the file).
    /// An unknown name does nothing.
    pub fn release(&self, name: &str) {
        if self.keep_page_cache {
            return;
        }
        let Some((entry, shard)) = self
            .entries
            .get(name)
            .and_then(|e| Some((e, self.shards.get(e.shard)?)))
        else {
            return;
        };
        super::pages::release(&shard.map, &shard.file, entry.bytes.clone());
        let first_release = !entry.released.swap(true, Ordering::Relaxed);
        let left = self.unreleased.get(entry.shard);
        if first_release && left.is_some_and(|n| n.fetch_sub(1, Ordering::Relaxed) == 1) {
            super::pages::release_all(&shard.map, &shard.file);
        }
    }

    /// Drops every shard's pages (unless [`LoadOptions::keep_page_cache`]):
    /// the weight loader's last step, for the tensors it does not load.
    pub fn release_all(&self) {
        if !self.keep_page_cache {
            for s in &self.shards {
                super::pages::release_all(&s.map, &s.file);
            }
        }
    }

    /// Bytes of the shards resident in the page cache (`mincore`).
    pub fn resident_bytes(&self) -> Result<usize, CheckpointError> {
        self.shards.iter().try_fold(0usize, |sum, s| {
            let r = super::pages::resident(&s.map).map_err(CheckpointError::io(&s.path))?;
            Ok(sum.saturating_add(r))
        })
    }

    /// The view of one manifest tensor.
    pub fn get(&self, name: &str) -> Result<TensorView<'_>, CheckpointError> {
        let (name, entry) =
            self.entries
                .get_key_value(name)
                .ok_or_else(|| CheckpointError::UnknownTensor {
                    name: name.to_string(),
                })?;
        // The entry's shard and byte range were checked against the
        // shard's header when the checkpoint was opened.
        let unknown = || CheckpointError::UnknownTensor {
            name: name.to_string(),
        };
        let shard = self.shards.get(entry.shard).ok_or_else(unknown)?;
        Ok(TensorView {
            name,
            dtype: entry.dtype,
            shape: &entry.shape,
            bytes: shard.map.get(entry.bytes.clone()).ok_or_else(unknown)?,
            file: &shard.path,
        })
    }

    pub fn bf16(&self, name: &str) -> Result<Vec<bf16>, CheckpointError> {
        self.get(name)?.to_bf16()
    }

    pub fn f32(&self, name: &str) -> Result<Vec<f32>, CheckpointError> {
        self.get(name)?.to_f32()
    }

    pub fn e4m3(&self, name: &str) -> Result<Vec<E4M3>, CheckpointError> {
        self.get(name)?.to_e4m3()
    }

    pub fn e8m0(&self, name: &str) -> Result<Vec<E8M0>, CheckpointError> {
        self.get(name)?.to_e8m0()
    }

    pub fn fp4x2(&self, name: &str) -> Result<Vec<Fp4x2>, CheckpointError> {
        self.get(name)?.to_fp4x2()
    }

    /// The tensor copied into a host [`Tensor`] (see [`TensorView::to_tensor`]).
    pub fn tensor(&self, name: &str) -> crate::model::Result<Tensor> {
        self.get(name)?.to_tensor()
    }
}

/// The Hugging Face index's file name inside a checkpoint directory.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// Tensor name → the shard file the index lists it in.
type WeightMap = HashMap<String, String>;

/// The index's weight map; `None` when the directory has no index.
fn read_index(dir: &Path) -> Result<Option<WeightMap>, CheckpointError> {
    let path = dir.join(INDEX_FILE);
    if !path.is_file() {
        return Ok(None);
    }
    let bad = |why: String| CheckpointError::BadIndex {
        path: path.clone(),
        why,
    };
    let text = std::fs::read_to_string(&path).map_err(CheckpointError::io(&path))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let map = v
        .get("weight_map")
        .and_then(serde_json::Value::as_object)
        .ok_or_else(|| bad("no \"weight_map\" object".into()))?;
    map.iter()
        .map(|(name, file)| {
            let file = file
                .as_str()
                .filter(|f| {
                    f.ends_with(".safetensors") && !f.contains(['/', '\\'])
                })
                .ok_or_else(|| {
                    bad(format!(
                        "weight_map[{name:?}] = {file} is not a *.safetensors file name in the directory"
                    ))
                })?;
            Ok((name.clone(), file.to_string()))
        })
        .collect::<Result<WeightMap, _>>()
        .map(Some)
}

/// The shards of `dir`, sorted by name: the files that
/// `model.safetensors.index.json` lists when there is one (every listed
/// file must exist; other `*.safetensors` files are ignored with one
/// warning), else every `*.safetensors` file. Returns the index too.
fn shard_paths(dir: &Path) -> Result<(Vec<PathBuf>, Option<WeightMap>), CheckpointError> {
    let mut present = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(CheckpointError::io(dir))? {
        let path = entry.map_err(CheckpointError::io(dir))?.path();
        if path.extension() == Some("safetensors".as_ref()) && path.is_file() {
            present.push(path);
        }
    }
    present.sort();
    let index = read_index(dir)?;
    let paths = match &index {
        None => present,
        Some(map) => {
            let mut listed: Vec<&String> = map.values().collect();
            listed.sort();
            listed.dedup();
            let mut paths = Vec::with_capacity(listed.len());
            for file in listed {
                let path = dir.join(file);
                if !path.is_file() {
                    return Err(CheckpointError::MissingShard {
                        index: dir.join(INDEX_FILE),
                        dir: dir.to_path_buf(),
                        file: file.clone(),
                    });
                }
                paths.push(path);
            }
            let stray: Vec<String> = present
                .iter()
                .filter(|p| !paths.contains(p))
                .map(|p| p.display().to_string())
                .collect();
            if !stray.is_empty() {
                tracing::warn!(
                    "ignoring {} shard(s) that {INDEX_FILE} does not list: {}",
                    stray.len(),
                    stray.join(", ")
                );
            }
            paths
        }
    };
    if paths.is_empty() {
        return Err(CheckpointError::NoShards {
            dir: dir.to_path_buf(),
        });
    }
    Ok((paths, index))
}

fn map_shard(path: &Path) -> Result<(File, Mmap), CheckpointError> {
    let file = File::open(path).map_err(CheckpointError::io(path))?;
    // SAFETY: `Mmap::map` is unsafe because the file could be modified or
    // truncated by someone else while mapped. The invariant callers uphold:
    // a checkpoint's shards are not modified while a `Checkpoint` maps them
    // (they are read-only model files; the generator writes through a
    // temporary file and a rename, never in place). The mapping is read-only
    // and lives exactly as long as the `Checkpoint`, which only lends borrows
    // of it. Views index it with byte ranges validated against its length at
    // load time, so a broken invariant could change values or raise SIGBUS,
    // never produce an out-of-bounds slice.
    let map = unsafe { Mmap::map(&file) }.map_err(CheckpointError::io(path))?;
    Ok((file, map))
}

/// The tensors a shard's header declares, in data order, with absolute byte
/// ranges into the mapping.
fn read_header(
    path: &Path,
    map: &[u8],
    shard: usize,
) -> Result<Vec<(String, Found)>, CheckpointError> {
    let (header_len, metadata) =
        SafeTensors::read_metadata(map).map_err(|source| match first_tensor_past_end(map) {
            Some((tensor, end)) => CheckpointError::TruncatedShard {
                path: path.to_path_buf(),
                tensor,
                end,
                len: map.len() as u64,
            },
            None => CheckpointError::CorruptShard {
                path: path.to_path_buf(),
                source,
            },
        })?;
    let data_start = HEADER_LEN_BYTES + header_len;
    Ok(metadata
        .offset_keys()
        .into_iter()
        .filter_map(|name| {
            let info = metadata.info(&name)?;
            let (start, end) = info.data_offsets;
            let tensor = Found {
                shard,
                dtype: info.dtype,
                shape: info.shape.clone(),
                bytes: data_start + start..data_start + end,
            };
            Some((name, tensor))
        })
        .collect())
}

/// For a shard the safetensors crate refused: when its header is readable
/// JSON, the tensor with the lowest data offset whose bytes end past the end
/// of `map`, and that end (absolute, in bytes). `None` when the header is
/// unreadable or every tensor fits (the shard is corrupt in another way).
fn first_tensor_past_end(map: &[u8]) -> Option<(String, u64)> {
    let len_bytes: [u8; HEADER_LEN_BYTES] = map.get(..HEADER_LEN_BYTES)?.try_into().ok()?;
    let header_len = usize::try_from(u64::from_le_bytes(len_bytes)).ok()?;
    let data_start = HEADER_LEN_BYTES.checked_add(header_len)?;
    let header = map.get(HEADER_LEN_BYTES..data_start)?;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(header).ok()?;
    let file_len = map.len() as u64;
    header
        .iter()
        .filter(|(name, _)| name.as_str() != "__metadata__")
        .filter_map(|(name, info)| {
            let offsets = info.get("data_offsets")?.as_array()?;
            let start = offsets.first()?.as_u64()?;
            let end = (data_start as u64).saturating_add(offsets.get(1)?.as_u64()?);
            (end > file_len).then(|| (start, name.clone(), end))
        })
        .min()
        .map(|(_, name, end)| (name, end))
}

fn progress_bar(progress: Progress, total: u64, passes: u64) -> ProgressBar {
    let show = match progress {
        Progress::Never => false,
        Progress::Auto => total >= PROGRESS_THRESHOLD,
        Progress::Always => true,
    };
    if !show {
        return ProgressBar::hidden();
    }
    let style = ProgressStyle::with_template(
        "{msg:16} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    ProgressBar::with_draw_target(Some(total * passes), ProgressDrawTarget::stderr())
        .with_style(style)
}

/// The index of the first NaN/±Inf element; packed FP4 has none.
fn first_non_finite(dtype: CheckpointDType, bytes: &[u8]) -> Option<usize> {
    match dtype {
        CheckpointDType::F32 => bytes
            .as_chunks::<4>()
            .0
            .iter()
            .position(|&b| !f32::from_le_bytes(b).is_finite()),
        CheckpointDType::BF16 => bytes
            .as_chunks::<2>()
            .0
            .iter()
            .position(|&b| u16::from_le_bytes(b) & 0x7F80 == 0x7F80),
        // e4m3 "fn": no infinities, NaN is S.1111.111.
        CheckpointDType::F8E4M3 => bytes.iter().position(|&b| b & 0x7F == 0x7F),
        // E8M0: 0xFF is NaN.
        CheckpointDType::F8E8M0 => bytes.iter().position(|&b| b == 0xFF),
        CheckpointDType::I8 => None,
    }
}

/// Row-major flat index → per-dimension index.
fn unravel(mut index: usize, shape: &[usize]) -> Vec<usize> {
    let mut position = vec![0; shape.len()];
    for (p, &d) in position.iter_mut().zip(shape).rev() {
        if d > 0 {
            *p = index % d;
            index /= d;
        }
    }
    position
}
