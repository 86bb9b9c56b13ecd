//! The model's error: a bad config, checkpoint, tokenizer or Engram map, or an error of the op
//! API underneath (bad input to an op, an unavailable device, a pool out of
//! pages). The crate's root [`crate::Error`] knows nothing of the model.
//!
//! Invariant: every fallible function under `crate::model` returns
//! [`Result`]; nothing panics on bad input.

use super::checkpoint::CheckpointError;
use super::config::ConfigError;
use super::engram_map::MapError;
use super::tokenizer::TokenizerError;

/// Errors of the model runner.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A model configuration is unreadable or inconsistent.
    #[error("model config: {0}")]
    Config(#[from] ConfigError),
    /// A checkpoint is unreadable, inconsistent with its config, or unwritable.
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] CheckpointError),
    /// A tokenizer is missing or unreadable, or its Engram map disagrees
    /// with the config.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// An Engram token-map file is missing, corrupt or the wrong length.
    #[error("engram token map: {0}")]
    EngramMap(#[from] MapError),
    /// An op, tensor, device or pool error.
    #[error(transparent)]
    Op(#[from] crate::Error),
}

impl Error {
    /// The op-level error inside, if this is one.
    pub fn op(&self) -> Option<&crate::Error> {
        match self {
            Error::Op(e) => Some(e),
            _ => None,
        }
    }
}

/// Shorthand for the model's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;
