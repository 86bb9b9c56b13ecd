//! [`CheckpointError`]: every way a checkpoint is rejected or cannot be
//! written. Invariant: each message names the file, directory or tensor at
//! fault; a structural mismatch counts every problem found and lists the first
//! [`LISTED_PROBLEMS`] of them.

use std::fmt;
use std::path::PathBuf;

use safetensors::SafeTensorError;

use super::param::CheckpointDType;
use crate::model::config::ConfigError;

/// Why a checkpoint could not be loaded, read or written.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("cannot access {}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no *.safetensors shard in {}", .dir.display())]
    NoShards { dir: PathBuf },
    /// `model.safetensors.index.json` is not a weight map.
    #[error("{}: {why}", .path.display())]
    BadIndex { path: PathBuf, why: String },
    /// A shard the index lists is not in the directory.
    #[error("{} lists shard {file}, which is not in {}", .index.display(), .dir.display())]
    MissingShard {
        index: PathBuf,
        dir: PathBuf,
        file: String,
    },
    /// The safetensors header or data layout is invalid: a header length
    /// beyond the file, data offsets beyond the buffer, unparsable JSON, ...
    #[error("shard {} is truncated or corrupt: {source}", .path.display())]
    CorruptShard {
        path: PathBuf,
        #[source]
        source: SafeTensorError,
    },
    /// A shard cut short: its header is readable, but tensor `tensor` (the
    /// first in data order to be cut off) ends at byte `end`, past the
    /// file's `len` bytes.
    #[error(
        "shard {} is truncated: tensor `{tensor}` ends at byte {end}, but the file has {len} bytes",
        .path.display()
    )]
    TruncatedShard {
        path: PathBuf,
        tensor: String,
        end: u64,
        len: u64,
    },
    /// The shards do not match the manifest; `problems` lists all of them.
    #[error("{}", invalid_message(.dir, .problems))]
    Invalid {
        dir: PathBuf,
        problems: Vec<TensorProblem>,
    },
    /// The opt-in finiteness check found NaN or ±Inf values.
    #[error("{}", non_finite_message(.0))]
    NonFinite(Vec<NonFiniteValue>),
    #[error("tensor `{name}` is not in the checkpoint")]
    UnknownTensor { name: String },
    #[error("tensor `{name}` is {found}, not {expected}")]
    WrongDType {
        name: String,
        expected: CheckpointDType,
        found: CheckpointDType,
    },
    /// A derived dimension or byte count does not fit in `usize`.
    #[error("{what} of this config overflows the address space")]
    TooLarge { what: String },
    /// Generating a tensor in memory failed (`RandomWeights`): a thread
    /// could not start or died, or a chunk's bytes did not fit its place.
    #[error("generating `{name}` in memory failed: {why}")]
    Generate { name: String, why: String },
    #[error("cannot write shard {}: {source}", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: SafeTensorError,
    },
    /// The checkpoint would not fit the output's file system.
    #[error(
        "the checkpoint needs {need} bytes ({:.1} GiB) but {} has {free} bytes free",
        *.need as f64 / (1u64 << 30) as f64,
        .dir.display()
    )]
    NoSpace { dir: PathBuf, need: u64, free: u64 },
    /// Generating the checkpoint's largest shard would take more host
    /// memory than is available.
    #[error(
        "generating the checkpoint needs {need} bytes ({:.1} GiB) of host memory at once \
         (its largest shard), but {available} bytes are available",
        *.need as f64 / (1u64 << 30) as f64
    )]
    NoMemory { need: u64, available: u64 },
    #[error(
        "{} already holds *.safetensors shards; write a new checkpoint into an \
         empty directory",
        .dir.display()
    )]
    OutputNotEmpty { dir: PathBuf },
    #[error("model config: {0}")]
    Config(#[from] ConfigError),
}

impl CheckpointError {
    /// The `Io` error of a failed access to `path`, for `map_err`.
    pub fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
        move |source| CheckpointError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// One way a checkpoint's tensors differ from the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TensorProblem {
    /// An expected tensor is in no shard.
    Missing {
        name: String,
        dtype: CheckpointDType,
        shape: Vec<usize>,
    },
    /// A tensor that is neither expected nor ignorable.
    Unexpected { name: String, file: PathBuf },
    /// An expected tensor stored with another dtype (`found` is the
    /// safetensors dtype name).
    WrongDType {
        name: String,
        expected: CheckpointDType,
        found: String,
        file: PathBuf,
    },
    WrongShape {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
        file: PathBuf,
    },
    /// The same name in two shards.
    Duplicate {
        name: String,
        first: PathBuf,
        second: PathBuf,
    },
    /// The index's weight map puts a tensor in another shard than the one
    /// that holds it.
    WrongShard {
        name: String,
        listed: String,
        file: PathBuf,
    },
}

impl TensorProblem {
    /// The tensor the problem is about.
    pub fn name(&self) -> &str {
        match self {
            TensorProblem::Missing { name, .. }
            | TensorProblem::Unexpected { name, .. }
            | TensorProblem::WrongDType { name, .. }
            | TensorProblem::WrongShape { name, .. }
            | TensorProblem::Duplicate { name, .. }
            | TensorProblem::WrongShard { name, .. } => name,
        }
    }
}

impl fmt::Display for TensorProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TensorProblem::Missing { name, dtype, shape } => {
                write!(f, "missing `{name}` ({dtype} {shape:?})")
            }
            TensorProblem::Unexpected { name, file } => {
                write!(f, "unexpected `{name}` in {}", file.display())
            }
            TensorProblem::WrongDType {
                name,
                expected,
                found,
                file,
            } => write!(
                f,
                "`{name}` in {} is {found}, expected {expected}",
                file.display()
            ),
            TensorProblem::WrongShape {
                name,
                expected,
                found,
                file,
            } => write!(
                f,
                "`{name}` in {} has shape {found:?}, expected {expected:?}",
                file.display()
            ),
            TensorProblem::Duplicate {
                name,
                first,
                second,
            } => write!(
                f,
                "`{name}` is in both {} and {}",
                first.display(),
                second.display()
            ),
            TensorProblem::WrongShard { name, listed, file } => write!(
                f,
                "`{name}` is in {}, but the index lists it in {listed}",
                file.display()
            ),
        }
    }
}

/// Problems listed in full in a message; the rest are counted.
pub const LISTED_PROBLEMS: usize = 20;

/// Appends the first [`LISTED_PROBLEMS`] items, one per line, and a count
/// of the others.
fn list<T: fmt::Display>(message: &mut String, items: &[T]) {
    for item in items.iter().take(LISTED_PROBLEMS) {
        message.push_str("\n  - ");
        message.push_str(&item.to_string());
    }
    if items.len() > LISTED_PROBLEMS {
        message.push_str(&format!(
            "\n  ... and {} more",
            items.len() - LISTED_PROBLEMS
        ));
    }
}

/// The first NaN or infinite element of one tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NonFiniteValue {
    pub name: String,
    pub file: PathBuf,
    /// Row-major element index.
    pub index: usize,
    /// The same index per dimension.
    pub position: Vec<usize>,
}

impl fmt::Display for NonFiniteValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` in {} is not finite at index {} (position {:?})",
            self.name,
            self.file.display(),
            self.index,
            self.position
        )
    }
}

fn invalid_message(dir: &std::path::Path, problems: &[TensorProblem]) -> String {
    let count = |pick: fn(&TensorProblem) -> bool| problems.iter().filter(|p| pick(p)).count();
    let mut message = format!(
        "checkpoint {} does not match the config: {} problem(s) ({} missing, {} unexpected, \
         {} wrong dtype, {} wrong shape, {} duplicated, {} in another shard than the index says)",
        dir.display(),
        problems.len(),
        count(|p| matches!(p, TensorProblem::Missing { .. })),
        count(|p| matches!(p, TensorProblem::Unexpected { .. })),
        count(|p| matches!(p, TensorProblem::WrongDType { .. })),
        count(|p| matches!(p, TensorProblem::WrongShape { .. })),
        count(|p| matches!(p, TensorProblem::Duplicate { .. })),
        count(|p| matches!(p, TensorProblem::WrongShard { .. })),
    );
    list(&mut message, problems);
    message
}

fn non_finite_message(values: &[NonFiniteValue]) -> String {
    let mut message = format!("{} tensor(s) hold NaN or infinite values", values.len());
    list(&mut message, values);
    message
}
