//! The DeepSeek-V4.1-Flash model on top of the op API: its configuration,
//! checkpoint format and (later) layers and runner. See
//! `shared/spec/v41-flash.md`; every structural fact is derived from the
//! config, never hard-coded, so small configs of the same shape work.

pub mod attention;
pub mod checkpoint;
pub mod config;
pub mod dspark;
pub mod ffn;
pub mod forward;
pub mod load;
pub mod runner;
pub mod state;
pub mod weights;
