//! [`RandomWeights`]: the generator's checkpoint without a file — every
//! manifest tensor generated on demand, when the loader reads it, from the
//! same seeded streams and quantisers as [`generate`](super::generate), so a
//! model built from it (`load::random_weights_on`) equals the model loaded
//! from the generator's shards for the same seed, bit for bit. A full-width
//! EP-8 rank is ~80 GB: written out it would not fit the GPU machine's disk,
//! and generated on one thread it would take most of an hour.
//!
//! One parameter at a time: its rows are split into chunks (on FP8 block
//! rows for block-scaled formats) that std threads generate and encode in
//! parallel straight into the parameter's output buffers; the generator's
//! stream is counter-based, so a chunk starts by jumping ahead and the
//! chunks concatenate to exactly [`param_bytes`](super::param_bytes). The
//! host holds one parameter's bytes (plus one f32 chunk per thread); when
//! the loader reads a weight, its `.scale` (generated with it) is kept until
//! the loader asks for it, which it does next.
//!
//! On a GPU the loader asks [`TensorSource::on_device`] instead: the
//! parameter is generated there by `ops::random_param` (the same bytes, no
//! host bytes at all), its other tensor kept on the device until asked for.
//!
//! Invariant: [`TensorSource::read`] of any manifest tensor gives the bytes
//! `param_bytes(param, seed)` gives for it, whatever the thread count and
//! chunk size; a name outside the manifest is an error naming it.

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;
use std::sync::Mutex;

use super::error::CheckpointError;
use super::generate::param_values_range;
use super::manifest::Manifest;
use super::param::{Format, Param};
use super::source::TensorSource;
use super::view::TensorView;
use crate::device::Device;
use crate::model::config::ModelConfig;
use crate::model::error::{Error, Result};
use crate::ops;
use crate::tensor::Tensor;
use crate::weight_rng::encode_rows;

/// Values a chunk holds by default: 4M (16 MB of f32 per thread at once).
const CHUNK_VALUES: usize = 1 << 22;

/// The smallest chunk a parameter is split into for parallelism (64K values).
const MIN_CHUNK_VALUES: usize = 1 << 16;

/// The file name the views of generated tensors report.
const GENERATED: &str = "(generated in memory)";

/// The random-weight checkpoint of one config and seed, generated lazily.
#[derive(Debug)]
pub struct RandomWeights {
    manifest: Manifest,
    seed: u64,
    threads: usize,
    chunk_values: usize,
    /// Stored tensor name → (its parameter, its index in `Param::tensors`).
    owner: HashMap<String, (usize, usize)>,
    /// Tensors generated with a parameter's other tensor, not yet read.
    spare: Mutex<HashMap<String, Vec<u8>>>,
    /// The same for [`TensorSource::on_device`]: device tensors.
    spare_on_device: Mutex<HashMap<String, Tensor>>,
}

impl RandomWeights {
    /// The weights of `config` (validated) for `seed`, generated on all the
    /// host's threads.
    pub fn new(config: &ModelConfig, seed: u64) -> Result<RandomWeights> {
        let manifest = Manifest::new(config)?;
        let owner = manifest
            .params()
            .iter()
            .enumerate()
            .flat_map(|(i, p)| {
                p.tensors()
                    .into_iter()
                    .enumerate()
                    .map(move |(j, t)| (t.name, (i, j)))
            })
            .collect();
        Ok(RandomWeights {
            manifest,
            seed,
            threads: crate::parallel::available_threads(),
            chunk_values: CHUNK_VALUES,
            owner,
            spare: Mutex::new(HashMap::new()),
            spare_on_device: Mutex::new(HashMap::new()),
        })
    }

    /// Generates on `threads` threads (at least 1).
    pub fn with_threads(mut self, threads: usize) -> RandomWeights {
        self.threads = threads.max(1);
        self
    }

    /// Splits a parameter into chunks of about `values` values (at least
    /// one row, or one block row, each).
    pub fn with_chunk_values(mut self, values: usize) -> RandomWeights {
        self.chunk_values = values.max(1);
        self
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The stored bytes of `param`: exactly
    /// [`param_bytes`](super::param_bytes)`(param, seed)`, generated in
    /// parallel chunks of rows.
    pub fn param_bytes(&self, param: &Param) -> Result<Vec<Vec<u8>>> {
        let (rows, cols) = param.matrix();
        let align = match param.format {
            Format::Fp8Block([br, _]) => br.max(1),
            _ => 1,
        };
        // At least two chunks per thread where the parameter allows, so a
        // parameter of a few chunk sizes (an expert's 8M values) still
        // keeps every thread busy; never below MIN_CHUNK_VALUES.
        let per_thread = rows
            .saturating_mul(cols)
            .div_ceil(self.threads.saturating_mul(2).max(1));
        let values = self
            .chunk_values
            .min(per_thread.max(MIN_CHUNK_VALUES.min(self.chunk_values)));
        let chunk_rows = ((values / cols.max(1)) / align).max(1) * align;
        let chunks: Vec<Range<usize>> = (0..rows)
            .step_by(chunk_rows)
            .map(|r| r..r.saturating_add(chunk_rows).min(rows))
            .collect();
        // A chunk's stored sizes are those of a parameter of its rows.
        let sizes = |n: usize| -> Vec<usize> {
            let part = Param {
                shape: vec![n, cols],
                ..param.clone()
            };
            part.tensors().iter().map(|t| t.bytes()).collect()
        };
        let mut outputs = param
            .tensors()
            .iter()
            .map(|t| zeroed(t.bytes()))
            .collect::<Result<Vec<_>>>()?;
        let mut jobs: Vec<(Range<usize>, Vec<&mut [u8]>)> =
            chunks.into_iter().map(|r| (r, Vec::new())).collect();
        for (t, out) in outputs.iter_mut().enumerate() {
            let mut rest: &mut [u8] = out.as_mut_slice();
            for (range, slices) in &mut jobs {
                let n = sizes(range.len()).get(t).copied().unwrap_or(0);
                let (head, tail) = std::mem::take(&mut rest)
                    .split_at_mut_checked(n)
                    .ok_or_else(|| internal(param, "a chunk past the end of its tensor"))?;
                slices.push(head);
                rest = tail;
            }
            if !rest.is_empty() {
                return Err(internal(param, "chunks that do not cover the tensor"));
            }
        }
        crate::parallel::try_for_each(
            jobs,
            self.threads,
            |(range, slices)| self.fill(param, cols, range, slices),
            || internal(param, "a generating thread panicked"),
        )?;
        Ok(outputs)
    }

    /// Generates and encodes rows `range` into their slices of the outputs.
    fn fill(
        &self,
        param: &Param,
        cols: usize,
        range: Range<usize>,
        slices: Vec<&mut [u8]>,
    ) -> Result<()> {
        let flat = range.start.saturating_mul(cols)..range.end.saturating_mul(cols);
        let values = param_values_range(param, self.seed, flat);
        let encoded = encode_rows(param.format, range.len(), cols, &values);
        if encoded.len() != slices.len() {
            return Err(internal(param, "an encoding with the wrong tensor count"));
        }
        for (dst, src) in slices.into_iter().zip(encoded) {
            if dst.len() != src.len() {
                return Err(internal(param, "a chunk encoded to the wrong size"));
            }
            dst.copy_from_slice(&src);
        }
        Ok(())
    }

    /// Lock on the spare host tensors.
    fn spare(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<u8>>> {
        lock(&self.spare)
    }
}

impl TensorSource for RandomWeights {
    fn read<R>(&self, name: &str, f: impl FnOnce(TensorView<'_>) -> Result<R>) -> Result<R> {
        let unknown = || CheckpointError::UnknownTensor {
            name: name.to_string(),
        };
        let &(p, t) = self.owner.get(name).ok_or_else(unknown)?;
        let param = self.manifest.params().get(p).ok_or_else(unknown)?;
        let spec = self.manifest.get(name).ok_or_else(unknown)?;
        let spared = self.spare().remove(name);
        let bytes = match spared {
            Some(bytes) => bytes,
            None => {
                let mut all = self.param_bytes(param)?;
                let specs = param.tensors();
                let mut mine = None;
                for (j, (bytes, other)) in all.drain(..).zip(specs).enumerate() {
                    if j == t {
                        mine = Some(bytes);
                    } else {
                        self.spare().insert(other.name, bytes);
                    }
                }
                mine.ok_or_else(unknown)?
            }
        };
        f(TensorView {
            name,
            dtype: spec.dtype,
            shape: &spec.shape,
            bytes: &bytes,
            file: Path::new(GENERATED),
        })
    }

    /// Drops the spare copy of `name`, if one is kept.
    fn release(&self, name: &str) {
        self.spare().remove(name);
        lock(&self.spare_on_device).remove(name);
    }

    fn release_all(&self) {
        self.spare().clear();
        lock(&self.spare_on_device).clear();
    }

    /// On a GPU, the parameter owning `name` generated there
    /// ([`ops::random_param`], the same bytes as the host generator); its
    /// other tensor is kept until the loader asks for it. `None` on the
    /// CPU, where [`TensorSource::read`] already builds the tensor in place.
    fn on_device(&self, name: &str, device: &Device) -> Result<Option<Tensor>> {
        if matches!(device, Device::Cpu) {
            return Ok(None);
        }
        if let Some(t) = lock(&self.spare_on_device).remove(name) {
            return Ok(Some(t));
        }
        let unknown = || CheckpointError::UnknownTensor {
            name: name.to_string(),
        };
        let &(p, t) = self.owner.get(name).ok_or_else(unknown)?;
        let param = self.manifest.params().get(p).ok_or_else(unknown)?;
        let made = ops::random_param(device, &param.random(self.seed))?;
        let mut mine = None;
        for (j, (tensor, spec)) in made.into_iter().zip(param.tensors()).enumerate() {
            if j == t {
                mine = Some(tensor);
            } else {
                lock(&self.spare_on_device).insert(spec.name, tensor);
            }
        }
        Ok(Some(mine.ok_or_else(unknown)?))
    }
}

/// A lock on a map of whole entries (a poisoned lock still holds them:
/// inserts and removals are single calls).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A zeroed host buffer, reserved fallibly (a size the host cannot hold is
/// a typed out-of-memory error).
fn zeroed(bytes: usize) -> Result<Vec<u8>> {
    Ok(crate::device::host_alloc(
        "generating random weights",
        bytes,
        || {
            let mut v = Vec::new();
            v.try_reserve_exact(bytes).ok()?;
            v.resize(bytes, 0u8);
            Some(v)
        },
    )?)
}

fn internal(param: &Param, why: &str) -> Error {
    Error::Checkpoint(CheckpointError::Generate {
        name: param.name.clone(),
        why: why.to_string(),
    })
}
