//! The V4.1 checkpoint format (spec §12): which tensors a model of a given
//! [`ModelConfig`](crate::model::config::ModelConfig) has, loading a directory
//! of safetensors shards against that list, and writing random weights in the
//! same format for any config.
//!
//! - [`manifest`]: the expected tensors (name, dtype, shape), every dim
//!   derived from the config and its layer plans; `param` defines how one
//!   parameter is stored ([`Param`], [`CheckpointDType`]).
//! - [`loader`]: memory-maps `*.safetensors` shards, validates them against
//!   the manifest (every problem reported in one [`CheckpointError`]) and hands
//!   out typed [`TensorView`]s (`view`); `pages` drops a converted tensor's
//!   pages from the page cache.
//! - [`generate`](mod@generate): a seeded, platform-independent random-weight generator
//!   writing every manifest tensor with the real quantisers; [`RandomWeights`]
//!   (`random`) generates the same bytes in memory, on demand and in
//!   parallel, for models too large to write out.
//! - [`TensorSource`] (`source`): what the weight loader reads from, a
//!   [`Checkpoint`] or [`RandomWeights`].
//!
//! Invariant: a [`Checkpoint`] exists only for a directory whose tensors match
//! the manifest exactly (names, dtypes, shapes, no duplicates), apart from the
//! tensors the manifest declares ignorable; every view it hands out lies inside
//! its shard's mapping.

mod error;
pub mod generate;
pub mod loader;
pub mod manifest;
mod pages;
mod param;
mod random;
mod source;
mod view;

pub use error::{CheckpointError, LISTED_PROBLEMS, NonFiniteValue, TensorProblem};
pub use generate::{GenerateOptions, Generated, generate, generate_from_dir, param_bytes};
pub use loader::{Checkpoint, INDEX_FILE, LoadOptions, PROGRESS_THRESHOLD, Progress};
pub use manifest::Manifest;
pub use param::{CheckpointDType, Format, Param, Role, TensorSpec};
pub use random::RandomWeights;
pub use source::TensorSource;
pub use view::TensorView;
