//! Structured output (`serving.md` §6) with llguidance: a request's
//! `so_args` — a regular expression, a JSON Schema or a Lark/EBNF grammar,
//! as upstream's `{schema_type, schema}` — becomes a [`Constraint`] whose
//! token mask is computed on the CPU before every sampling step.
//!
//! Invariant: a constrained request only ever samples a token its mask
//! allows (masked logits are NaN, which the sampler never picks); every
//! sampled token is consumed by the constraint, and a constraint that
//! allows nothing more stops its request.

use crate::error::Error as OpError;
use crate::model::Result;
use crate::model::tokenizer::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use std::sync::Arc;

/// Which language `schema` is written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchemaType {
    Regex,
    Json,
    Ebnf,
}

/// One request's output constraint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StructuredOutput {
    pub schema_type: SchemaType,
    pub schema: String,
}

fn bad(value: String, why: &'static str) -> crate::model::Error {
    OpError::Argument {
        op: "structured output",
        arg: "so_args",
        value,
        why,
    }
    .into()
}

/// The tokenizer's token trie and the grammar compiler over it (built once
/// per engine, on first use: 0.6 s for the V4 vocabulary on the 2-core
/// development machine, `benches/structured_cpu.rs`).
pub struct Grammars {
    factory: ParserFactory,
    vocab: usize,
}

impl Grammars {
    /// Over `tok`'s byte-level vocabulary, with `eos` ending an accepted
    /// output.
    pub fn new(tok: &Tokenizer, eos: u32, bos: u32) -> Result<Grammars> {
        let words = tok.token_bytes(TokTrie::SPECIAL_TOKEN_MARKER)?;
        if eos as usize >= words.len() {
            return Err(bad(
                format!("EOS id {eos} for a {}-id tokenizer", words.len()),
                "the end-of-sequence id is not a token of the tokenizer",
            ));
        }
        let info = TokRxInfo {
            vocab_size: u32::try_from(words.len()).map_err(|_| {
                bad(
                    format!("{} tokens", words.len()),
                    "token ids are 32-bit: a vocabulary holds at most 2^32 words",
                )
            })?,
            tok_eos: eos,
            tok_bos: Some(bos),
            tok_pad: None,
            tok_unk: None,
            tok_end_of_turn: None,
        };
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(TokTrie::from(&info, &words)));
        let factory = ParserFactory::new_simple(&env)
            .map_err(|e| bad(e.to_string(), "could not build the grammar compiler"))?;
        Ok(Grammars {
            factory,
            vocab: words.len(),
        })
    }

    /// Compiles one request's constraint; a bad schema is an error naming
    /// the compiler's complaint.
    pub fn compile(&self, so: &StructuredOutput) -> Result<Constraint> {
        let grammar = match so.schema_type {
            SchemaType::Regex => TopLevelGrammar::from_regex(&so.schema),
            SchemaType::Json => {
                let schema = serde_json::from_str(&so.schema)
                    .map_err(|e| bad(format!("{e}"), "the JSON Schema is not JSON"))?;
                TopLevelGrammar::from_json_schema(schema)
            }
            SchemaType::Ebnf => TopLevelGrammar::from_lark(so.schema.clone()),
        };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| bad(e.to_string(), "the schema does not compile"))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(bad(e, "the schema does not compile"));
        }
        Ok(Constraint {
            matcher,
            vocab: self.vocab,
        })
    }
}

/// One request's grammar state.
pub struct Constraint {
    matcher: Matcher,
    vocab: usize,
}

impl Constraint {
    /// Sets every logit the grammar does not allow next to NaN (ids past
    /// the tokenizer's included); an empty mask is an error.
    pub fn mask(&mut self, row: &mut [f32]) -> Result<()> {
        let allowed = self
            .matcher
            .compute_mask()
            .map_err(|e| bad(e.to_string(), "the grammar failed to compute a mask"))?;
        // Word by word (bit i of word w is id 32w + i): whole words of
        // masked ids are filled at once.
        let words = allowed.as_slice();
        let mut any = false;
        let (known, beyond) = row.split_at_mut(self.vocab.min(row.len()));
        for (w, chunk) in known.chunks_mut(32).enumerate() {
            let bits = words.get(w).copied().unwrap_or(0);
            if bits == 0 {
                chunk.fill(f32::NAN);
                continue;
            }
            any = true;
            if bits != u32::MAX {
                for (i, x) in chunk.iter_mut().enumerate() {
                    if bits >> i & 1 == 0 {
                        *x = f32::NAN;
                    }
                }
            }
        }
        beyond.fill(f32::NAN);
        if any {
            Ok(())
        } else {
            Err(bad(
                "no token".into(),
                "the grammar allows no token of the vocabulary here",
            ))
        }
    }

    /// Advances over a sampled token; true when the grammar is complete and
    /// allows nothing more.
    pub fn consume(&mut self, token: u32) -> Result<bool> {
        self.matcher
            .consume_token(token)
            .map_err(|e| bad(e.to_string(), "the grammar rejected a sampled token"))?;
        Ok(self.matcher.is_stopped())
    }
}
