//! The DeepSeek-V4.1-Flash model on top of the op API: its configuration,
//! checkpoint format, layers (each owning its parameters), the paged state
//! of many sequences, the batched forward and the runner. See
//! `shared/spec/v41-flash.md`; every structural fact is derived from the
//! config, never hard-coded, so small configs of the same shape work.
//!
//! The data path: config → checkpoint → `load` → `layers` → `crate::ops` →
//! backend. Nothing here calls a backend directly (`tests/layering.rs`).

pub mod batch;
pub mod checkpoint;
pub mod config;
pub mod dspark;
pub mod engram_map;
pub mod error;
pub mod forward;
pub mod graph;
pub mod inputs;
pub mod layers;
pub mod load;
mod marks;
pub mod pool;
pub mod runner;
pub mod tokenizer;
pub mod truncate;

pub use error::{Error, Result};
