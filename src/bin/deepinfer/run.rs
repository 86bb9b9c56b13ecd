//! `deepinfer run` and `deepinfer score` on the engine: prompts from flags
//! (ids or text) or a JSONL file of requests, output streamed as it is
//! sampled or written as JSONL, and teacher-forced scoring with a logits
//! dump.
//!
//! Invariant: a bad request line fails alone (its output line carries the
//! error, naming the line and key); malformed flags fail the command
//! before any model is loaded.

use crate::engine_args::EngineArgs;
use clap::Args;
use deepinfer::Error;
use deepinfer::engine::request::{parse_ids, parse_request_line};
use deepinfer::engine::{
    Engine, Output, Prompt, SamplingParams, SchemaType, StopReason, StructuredOutput, TokenEvent,
};
use deepinfer::model::Result;
use deepinfer::model::checkpoint::CheckpointError;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{Map, Value, json};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The default prompt of the tiny model: BOS then a fixed run of token ids.
pub const DEFAULT_PROMPT: &str = "0,17,42,7,99,3,250,11,64,5,128,31";

#[derive(Args, Clone, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Comma-separated prompt token ids (default: a fixed prompt for the
    /// tiny model).
    #[arg(long, conflicts_with_all = ["prompt_text", "prompts"])]
    pub prompt: Option<String>,
    /// Prompt text, encoded with the model's tokenizer.
    #[arg(long, conflicts_with = "prompts")]
    pub prompt_text: Option<String>,
    /// A JSONL file of requests, one per line: `prompt` (text) or
    /// `prompt_ids`, and any of `max_tokens`, `temperature`, `top_p`,
    /// `top_k`, `seed`, `stop`, `stop_ids`, `logprobs`, `so_args`
    /// (`{"schema_type": "json"|"regex"|"ebnf", "schema": ...}`); the
    /// flags give the defaults.
    #[arg(long)]
    pub prompts: Option<PathBuf>,
    /// Write the results as JSONL here (default: stream to stdout).
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Tokens to generate at most.
    #[arg(long, alias = "max-tokens", default_value_t = 32)]
    pub max_new: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Nucleus mass in (0, 1].
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Candidates kept by logit; 0 keeps all.
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// The request's seed (same seed, same tokens).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// A stop string (repeatable; needs a tokenizer).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Report each generated token's log-probability.
    #[arg(long)]
    pub logprobs: bool,
    /// Constrain the output to this JSON Schema (a file, or inline JSON).
    #[arg(long, conflicts_with_all = ["regex", "grammar"])]
    pub json_schema: Option<String>,
    /// Constrain the output to this regular expression.
    #[arg(long, conflicts_with = "grammar")]
    pub regex: Option<String>,
    /// Constrain the output to this Lark/EBNF grammar (a file, or inline).
    #[arg(long)]
    pub grammar: Option<String>,
}

fn bad(arg: &'static str, value: String, why: &'static str) -> deepinfer::model::Error {
    Error::Argument {
        op: "deepinfer",
        arg,
        value,
        why,
    }
    .into()
}

/// The prompt of an `--X IDS` / `--X-text TEXT` flag pair (text wins; they
/// conflict in clap), else the ids of `default` (none when it is empty).
fn prompt_flags(
    flag: &'static str,
    ids: &Option<String>,
    text: &Option<String>,
    default: &str,
) -> Result<Prompt> {
    Ok(match (ids, text) {
        (_, Some(t)) => Prompt::Text(t.clone()),
        (Some(ids), None) => Prompt::Ids(parse_ids(flag, ids)?),
        (None, None) if default.is_empty() => Prompt::Ids(Vec::new()),
        (None, None) => Prompt::Ids(parse_ids(flag, default)?),
    })
}

/// A flag that names a file or holds the text itself: an existing file is
/// read; text ending in a file extension (`.json`, `.lark`, `.ebnf`,
/// `.gbnf`, `.txt`) that names no file is an error, not a schema.
fn file_or_inline(arg: &'static str, text: &str) -> Result<String> {
    let p = Path::new(text);
    if text.len() < 4096 && p.is_file() {
        return Ok(std::fs::read_to_string(p).map_err(CheckpointError::io(p))?);
    }
    let looks_like_a_file = [".json", ".lark", ".ebnf", ".gbnf", ".txt"]
        .iter()
        .any(|ext| text.ends_with(ext));
    if looks_like_a_file {
        return Err(bad(arg, text.to_string(), "no such file"));
    }
    Ok(text.to_string())
}

impl RunArgs {
    fn defaults(&self, eos: u32) -> Result<SamplingParams> {
        let so_args = match (&self.json_schema, &self.regex, &self.grammar) {
            (Some(s), _, _) => Some(StructuredOutput {
                schema_type: SchemaType::Json,
                schema: file_or_inline("--json-schema", s)?,
            }),
            (_, Some(r), _) => Some(StructuredOutput {
                schema_type: SchemaType::Regex,
                schema: r.clone(),
            }),
            (_, _, Some(g)) => Some(StructuredOutput {
                schema_type: SchemaType::Ebnf,
                schema: file_or_inline("--grammar", g)?,
            }),
            _ => None,
        };
        Ok(SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            max_tokens: self.max_new,
            stop: vec![eos],
            stop_strings: self.stop.clone(),
            seq_seed: self.seed,
            logprobs: self.logprobs,
            so_args,
        })
    }
}

fn stop_json(s: &StopReason) -> Value {
    match s {
        StopReason::Length => json!({"reason": "length"}),
        StopReason::Stop(t) => json!({"reason": "stop_token", "token": t}),
        StopReason::StopString(s) => json!({"reason": "stop_string", "string": s}),
        StopReason::Grammar => json!({"reason": "grammar"}),
    }
}

fn output_json(index: usize, r: &Result<Output>) -> Value {
    match r {
        Ok(o) => {
            let mut m = Map::new();
            m.insert("index".into(), json!(index));
            m.insert("prompt_tokens".into(), json!(o.prompt.len()));
            m.insert("tokens".into(), json!(o.tokens));
            if let Some(t) = &o.text {
                m.insert("text".into(), json!(t));
            }
            m.insert("stop".into(), stop_json(&o.stop));
            if let Some(l) = &o.logprobs {
                m.insert("logprobs".into(), json!(l));
            }
            m.insert("prefill_s".into(), json!(o.prefill.as_secs_f64()));
            m.insert("decode_s".into(), json!(o.decode.as_secs_f64()));
            Value::Object(m)
        }
        Err(e) => json!({"index": index, "error": e.to_string()}),
    }
}

/// Streams one request's text (or ids) to stdout as it is sampled. Text is
/// printed once it no longer ends in a split character, holding back as
/// many bytes as the longest stop string (the final text may end before
/// one); stop tokens and EOS are not text. [`Streamer::finish`] prints what
/// was held back of the final text.
struct Streamer<'a> {
    engine: &'a Engine,
    skip: Vec<u32>,
    holdback: usize,
    tokens: Vec<u32>,
    printed: usize,
}

impl Streamer<'_> {
    fn push(&mut self, e: TokenEvent) {
        let mut out = std::io::stdout().lock();
        if e.index == 0 {
            let _ = write!(out, "output: ");
        }
        match &self.engine.tokenizer {
            Some(_) if self.skip.contains(&e.token) => {}
            Some(t) => {
                self.tokens.push(e.token);
                if let Ok(text) = t.decode(&self.tokens)
                    && !text.ends_with('\u{FFFD}')
                {
                    let mut end = text.len().saturating_sub(self.holdback);
                    while !text.is_char_boundary(end) {
                        end -= 1;
                    }
                    if end > self.printed && text.is_char_boundary(self.printed) {
                        let _ = write!(out, "{}", &text[self.printed..end]);
                        self.printed = end;
                    }
                }
            }
            None => {
                let _ = write!(out, "{}{}", if e.index == 0 { "" } else { "," }, e.token);
            }
        }
        let _ = out.flush();
    }

    fn finish(&mut self, o: &Output) {
        if let Some(text) = &o.text
            && text.len() > self.printed
            && text.is_char_boundary(self.printed)
        {
            print!("{}", &text[self.printed..]);
        }
        println!();
    }
}

pub fn run(a: &RunArgs) -> Result<()> {
    let prompt = prompt_flags("--prompt", &a.prompt, &a.prompt_text, DEFAULT_PROMPT)?;
    let engine = a.engine.engine()?;
    let defaults = a.defaults(engine.model.cfg.tokens.eos)?;
    let secs = |d: std::time::Duration| d.as_secs_f64().max(1e-9);
    let Some(path) = &a.prompts else {
        let mut skip = defaults.stop.clone();
        skip.push(engine.model.cfg.tokens.eos);
        let mut streamer = Streamer {
            engine: &engine,
            skip,
            holdback: defaults
                .stop_strings
                .iter()
                .map(String::len)
                .max()
                .unwrap_or(0),
            tokens: Vec::new(),
            printed: 0,
        };
        let stream = a.output.is_none();
        if stream {
            println!(
                "prompt: {}",
                match &prompt {
                    Prompt::Text(t) => format!("{t:?}"),
                    Prompt::Ids(ids) => format!("{ids:?}"),
                }
            );
        }
        let r = engine
            .generate_streaming(std::slice::from_ref(&prompt), &[defaults], &mut |e| {
                if stream {
                    streamer.push(e)
                }
            })
            .remove(0);
        if let Some(out) = &a.output {
            write_jsonl(out, &[output_json(0, &r)])?;
        }
        let o = r?;
        if stream {
            streamer.finish(&o);
        }
        println!(
            "prompt {} tokens, generated {} tokens ({:?}); prefill {:.1} tokens/s, decode {:.1} tokens/s ({})",
            o.prompt.len(),
            o.tokens.len(),
            o.stop,
            o.prompt.len() as f64 / secs(o.prefill),
            o.tokens.len().saturating_sub(1) as f64 / secs(o.decode),
            engine.model.device()
        );
        return Ok(());
    };
    let text = std::fs::read_to_string(path).map_err(CheckpointError::io(path))?;
    let mut results: Vec<Option<Result<Output>>> = Vec::new();
    let mut reqs = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match parse_request_line(n + 1, line, &defaults) {
            Ok(r) => {
                reqs.push((results.len(), r));
                results.push(None);
            }
            Err(e) => results.push(Some(Err(e))),
        }
    }
    let bar = ProgressBar::with_draw_target(
        Some(reqs.iter().map(|(_, (_, p))| p.max_tokens as u64).sum()),
        ProgressDrawTarget::stderr(),
    )
    .with_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} tokens ({per_sec})")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(format!("{} requests", reqs.len()));
    let t0 = std::time::Instant::now();
    let mut generated = 0usize;
    for chunk in reqs.chunks(engine.config.max_seqs.max(1)) {
        let (prompts, params): (Vec<Prompt>, Vec<SamplingParams>) =
            chunk.iter().map(|(_, r)| r.clone()).unzip();
        let outs = engine.generate_streaming(&prompts, &params, &mut |_| bar.inc(1));
        for ((i, _), r) in chunk.iter().zip(outs) {
            if let Ok(o) = &r {
                generated += o.tokens.len();
            }
            if let Some(slot) = results.get_mut(*i) {
                *slot = Some(r);
            }
        }
    }
    bar.finish_and_clear();
    let lines: Vec<Value> = results
        .iter()
        .enumerate()
        .map(|(i, r)| match r {
            Some(r) => output_json(i, r),
            None => json!({"index": i, "error": "the request was left unanswered"}),
        })
        .collect();
    match &a.output {
        Some(out) => write_jsonl(out, &lines)?,
        None => {
            for l in &lines {
                println!("{l}");
            }
        }
    }
    let failed = results.iter().filter(|r| matches!(r, Some(Err(_)))).count();
    eprintln!(
        "{} requests ({failed} failed), {generated} tokens in {:.2} s: {:.1} tokens/s",
        results.len(),
        t0.elapsed().as_secs_f64(),
        generated as f64 / secs(t0.elapsed())
    );
    if failed > 0 {
        return Err(bad(
            "--prompts",
            format!("{failed} of {} requests", results.len()),
            "requests failed (their lines carry the errors)",
        ));
    }
    Ok(())
}

fn write_jsonl(path: &Path, lines: &[Value]) -> Result<()> {
    let mut text = String::new();
    for l in lines {
        text.push_str(&l.to_string());
        text.push('\n');
    }
    std::fs::write(path, text).map_err(CheckpointError::io(path))?;
    Ok(())
}

#[derive(Args, Clone, Debug)]
pub struct ScoreArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Comma-separated prompt token ids.
    #[arg(long, conflicts_with = "prompt_text")]
    pub prompt: Option<String>,
    /// Prompt text.
    #[arg(long)]
    pub prompt_text: Option<String>,
    /// Comma-separated continuation token ids.
    #[arg(
        long,
        conflicts_with = "continuation_text",
        required_unless_present = "continuation_text"
    )]
    pub continuation: Option<String>,
    /// Continuation text.
    #[arg(long)]
    pub continuation_text: Option<String>,
    /// Temperature of the scored distribution.
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f32,
    /// Write the logits that predicted each continuation token (F32
    /// `logits` [C, V]) and the scored ids (I64 `tokens` [C]) as safetensors.
    #[arg(long)]
    pub dump_logits: Option<PathBuf>,
}

pub fn score(a: &ScoreArgs) -> Result<()> {
    let prompt = prompt_flags("--prompt", &a.prompt, &a.prompt_text, DEFAULT_PROMPT)?;
    // No continuation: the engine's own error says scoring needs one.
    let continuation = prompt_flags("--continuation", &a.continuation, &a.continuation_text, "")?;
    let engine = a.engine.engine()?;
    let (prompt, continuation) = (engine.encode(&prompt)?, engine.encode(&continuation)?);
    let scored = engine.score(&prompt, &continuation, a.temperature)?;
    for (t, l) in continuation.iter().zip(&scored.logprobs) {
        println!("{t}\t{l}");
    }
    println!(
        "sum\t{}",
        scored.logprobs.iter().map(|&l| f64::from(l)).sum::<f64>()
    );
    if let Some(path) = &a.dump_logits {
        dump_logits(path, &scored.logits, &continuation)?;
        eprintln!(
            "logits [{}, {}] written to {}",
            continuation.len(),
            engine.model.cfg.vocab_size,
            path.display()
        );
    }
    Ok(())
}

fn dump_logits(path: &Path, logits: &deepinfer::Tensor, tokens: &[u32]) -> Result<()> {
    use safetensors::tensor::{Dtype, TensorView};
    let bytes: Vec<u8> = logits
        .to_vec::<f32>()?
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let ids: Vec<u8> = tokens
        .iter()
        .flat_map(|&t| i64::from(t).to_le_bytes())
        .collect();
    fn view(dtype: Dtype, shape: Vec<usize>, data: &[u8]) -> Result<TensorView<'_>> {
        TensorView::new(dtype, shape, data).map_err(|e| {
            bad(
                "--dump-logits",
                e.to_string(),
                "could not describe the tensor",
            )
        })
    }
    let tensors = [
        ("logits", view(Dtype::F32, logits.shape().to_vec(), &bytes)?),
        ("tokens", view(Dtype::I64, vec![tokens.len()], &ids)?),
    ];
    let data = safetensors::serialize(tensors, None).map_err(|e| {
        bad(
            "--dump-logits",
            e.to_string(),
            "could not serialise the logits",
        )
    })?;
    std::fs::write(path, data).map_err(CheckpointError::io(path))?;
    Ok(())
}
