//! What goes into and comes out of [`super::Engine::generate`]: a prompt
//! (text, or token ids — a chat renderer's output is ids), and a finished
//! request with its tokens, text, stop reason, logprobs and timings.
//!
//! Invariant: a text prompt is encoded without BOS/EOS and with special
//! tokens recognised, exactly as [`Tokenizer::encode`] does; ids are taken
//! as given.
//!
//! [`Tokenizer::encode`]: crate::model::tokenizer::Tokenizer::encode

use std::time::Duration;

/// One request's prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Prompt {
    /// Token ids, used as given (e.g. a chat template's rendering).
    Ids(Vec<u32>),
    /// Text, encoded with the model's tokenizer.
    Text(String),
}

impl From<Vec<u32>> for Prompt {
    fn from(ids: Vec<u32>) -> Prompt {
        Prompt::Ids(ids)
    }
}

impl From<&[u32]> for Prompt {
    fn from(ids: &[u32]) -> Prompt {
        Prompt::Ids(ids.to_vec())
    }
}

impl From<&Vec<u32>> for Prompt {
    fn from(ids: &Vec<u32>) -> Prompt {
        Prompt::Ids(ids.clone())
    }
}

impl From<&str> for Prompt {
    fn from(text: &str) -> Prompt {
        Prompt::Text(text.to_string())
    }
}

impl From<String> for Prompt {
    fn from(text: String) -> Prompt {
        Prompt::Text(text)
    }
}

/// Why a request stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// `max_tokens` were generated.
    Length,
    /// This stop token was generated (it is the last output token).
    Stop(u32),
    /// The decoded output reached this stop string (the output text ends
    /// before it; the tokens include the one that completed it).
    StopString(String),
    /// The structured-output grammar accepted a complete output and allows
    /// nothing more.
    Grammar,
}

/// A finished request.
#[derive(Clone, Debug, PartialEq)]
pub struct Output {
    /// The prompt's ids (a text prompt as encoded).
    pub prompt: Vec<u32>,
    pub tokens: Vec<u32>,
    /// The generated text, when the model has a tokenizer: the tokens
    /// decoded with special tokens kept, less a final stop token, and cut
    /// before a stop string.
    pub text: Option<String>,
    pub stop: StopReason,
    /// Per generated token, when asked for.
    pub logprobs: Option<Vec<f32>>,
    /// The batch's prefill step and decode loop (shared by its requests).
    pub prefill: Duration,
    pub decode: Duration,
}
