//! What goes into and comes out of [`super::Engine::generate`]: a prompt
//! (text, or token ids — a chat renderer's output is ids), and a finished
//! request with its tokens, text, stop reason, logprobs and timings.
//!
//! The CLI's request syntax lives here too, as pure functions over text
//! (so the fuzzers reach it): comma-separated ids ([`parse_ids`]) and one
//! JSONL request line ([`parse_request_line`]).
//!
//! Invariant: a text prompt is encoded without BOS/EOS and with special
//! tokens recognised, exactly as [`Tokenizer::encode`] does; ids are taken
//! as given. The parsers never panic: bad text is an
//! [`crate::Error::Argument`] naming the flag, the line and the key.
//!
//! [`Tokenizer::encode`]: crate::model::tokenizer::Tokenizer::encode

use super::{SamplingParams, SchemaType, StructuredOutput};
use crate::model::Result;
use serde_json::Value;
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
    /// The run's prefill steps and decode loop (shared by its requests,
    /// summed over the admissions of waiting requests).
    pub prefill: Duration,
    pub decode: Duration,
    /// What speculative decoding did for this request (`None` without it).
    pub spec: Option<super::SpecStats>,
}

fn bad(arg: &'static str, value: String, why: &'static str) -> crate::model::Error {
    crate::Error::Argument {
        op: "deepinfer",
        arg,
        value,
        why,
    }
    .into()
}

/// Comma-separated token ids (the CLI's `--prompt`), or a typed error
/// naming flag `arg` and the bad id.
pub fn parse_ids(arg: &'static str, text: &str) -> Result<Vec<u32>> {
    text.split(',')
        .map(|t| {
            t.trim()
                .parse()
                .map_err(|_| bad(arg, t.into(), "expected comma-separated token ids"))
        })
        .collect()
}

/// One JSONL request line (the CLI's `--prompts`, numbered `line_no`) over
/// the defaults `d`: `prompt` (text) or `prompt_ids`, and any of
/// `max_tokens`, `temperature`, `top_p`, `top_k`, `seed`, `stop`,
/// `stop_ids`, `logprobs`, `so_args`. Errors name the line and key. The
/// values are parsed, not checked against a model
/// ([`SamplingParams::validate`] does that).
pub fn parse_request_line(
    line_no: usize,
    line: &str,
    d: &SamplingParams,
) -> Result<(Prompt, SamplingParams)> {
    let at = |key: &str, why: &'static str| {
        bad("--prompts", format!("line {line_no}, key {key:?}"), why)
    };
    let v: Value = serde_json::from_str(line).map_err(|e| {
        bad(
            "--prompts",
            format!("line {line_no}: {e}"),
            "not a JSON object",
        )
    })?;
    let Value::Object(m) = v else {
        return Err(bad(
            "--prompts",
            format!("line {line_no}"),
            "not a JSON object",
        ));
    };
    let ids = |key: &str, v: &Value| -> Result<Vec<u32>> {
        v.as_array()
            .and_then(|a| {
                a.iter()
                    .map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok()))
                    .collect()
            })
            .ok_or_else(|| at(key, "expected an array of token ids"))
    };
    let count = |key: &str, v: &Value| -> Result<usize> {
        v.as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| at(key, "expected a count"))
    };
    // A finite number beyond f32's range is refused, not rounded to ±inf.
    let number = |key: &str, v: &Value| -> Result<f32> {
        let x = v.as_f64().ok_or_else(|| at(key, "expected a number"))?;
        // A finite f64 outside f32's range rounds to ±inf: refused below.
        let y = crate::numerics::round_f32(x);
        if y.is_finite() {
            Ok(y)
        } else {
            Err(at(key, "expected a number within f32's range"))
        }
    };
    let mut p = d.clone();
    let mut prompt = None;
    for (k, v) in &m {
        match k.as_str() {
            "prompt" | "prompt_ids" if prompt.is_some() => {
                return Err(at(k, "give prompt or prompt_ids, not both"));
            }
            "prompt" => {
                prompt = Some(Prompt::Text(
                    v.as_str()
                        .ok_or_else(|| at(k, "expected a string"))?
                        .to_string(),
                ))
            }
            "prompt_ids" => prompt = Some(Prompt::Ids(ids(k, v)?)),
            "max_tokens" => p.max_tokens = count(k, v)?,
            "temperature" => p.temperature = number(k, v)?,
            "top_p" => p.top_p = number(k, v)?,
            "top_k" => p.top_k = count(k, v)?,
            "seed" => p.seq_seed = v.as_u64().ok_or_else(|| at(k, "expected a u64"))?,
            "logprobs" => p.logprobs = v.as_bool().ok_or_else(|| at(k, "expected a bool"))?,
            "stop" => {
                p.stop_strings = v
                    .as_array()
                    .and_then(|a| a.iter().map(|s| s.as_str().map(String::from)).collect())
                    .ok_or_else(|| at(k, "expected an array of strings"))?
            }
            "stop_ids" => p.stop.extend(ids(k, v)?),
            "so_args" => p.so_args = Some(so_args(v).map_err(|why| at(k, why))?),
            _ => return Err(at(k, "unknown key")),
        }
    }
    let prompt = prompt.ok_or_else(|| at("prompt", "each line needs prompt or prompt_ids"))?;
    Ok((prompt, p))
}

/// `{"schema_type": ..., "schema": ...}` as upstream's `so_args`.
fn so_args(v: &Value) -> std::result::Result<StructuredOutput, &'static str> {
    let m = v.as_object().ok_or("expected {schema_type, schema}")?;
    let schema_type = match m.get("schema_type").and_then(Value::as_str) {
        Some("json") => SchemaType::Json,
        Some("regex") => SchemaType::Regex,
        Some("ebnf") => SchemaType::Ebnf,
        _ => return Err("schema_type must be json, regex or ebnf"),
    };
    let schema = match m.get("schema") {
        Some(Value::String(s)) => s.clone(),
        Some(o @ Value::Object(_)) if schema_type == SchemaType::Json => o.to_string(),
        _ => return Err("schema must be a string (or a JSON Schema object)"),
    };
    Ok(StructuredOutput {
        schema_type,
        schema,
    })
}
