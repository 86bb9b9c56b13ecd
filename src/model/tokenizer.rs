//! The model's tokenizer: the `tokenizer.json` beside its config, read with
//! the Hugging Face `tokenizers` crate (the V4 series ships a byte-level BPE
//! with 128,000 entries and added tokens up to id 129,279), and the Engram
//! compressed-token map derived from it (`v41-flash.md` §8.1).
//!
//! Invariant: encoding never adds BOS/EOS (callers and chat renderers add
//! them as ids) and decoding keeps special tokens, so `decode(encode(s)) ==
//! s` for any text; the map has one class per tokenizer id, numbered by
//! first occurrence of its key in id order.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tokenizers::normalizers::{
    NFD, NFKC, Sequence, Strip, StripAccents, replace::Replace, utils::Lowercase,
};
use tokenizers::{NormalizedString, Normalizer, NormalizerWrapper};

/// The tokenizer's file name inside a model directory.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// Errors of the tokenizer and of the Engram map built from it.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// The model directory has no tokenizer file.
    #[error("no tokenizer: {path} does not exist")]
    Missing { path: PathBuf },
    /// The tokenizer file is unreadable or not a tokenizer.
    #[error("tokenizer {path}: {message}")]
    Parse { path: PathBuf, message: String },
    /// Encoding or decoding failed (the message is the library's).
    #[error("tokenizer {what}: {message}")]
    Codec { what: &'static str, message: String },
    /// A token id the tokenizer does not know.
    #[error("token id {id} is outside the tokenizer's {len} ids")]
    UnknownId { id: u32, len: usize },
    /// The Engram map's class count disagrees with the config.
    #[error(
        "engram token map: the tokenizer gives {found} compressed classes, the config's \
         engram_compressed_vocab_size is {expected}; first classes: {first}"
    )]
    ClassCount {
        expected: usize,
        found: usize,
        first: String,
    },
}

/// A loaded `tokenizer.json`.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    len: usize,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer").field("len", &self.len).finish()
    }
}

impl Tokenizer {
    /// Reads a `tokenizer.json` file.
    pub fn from_file(path: &Path) -> Result<Tokenizer, TokenizerError> {
        if !path.is_file() {
            return Err(TokenizerError::Missing {
                path: path.to_path_buf(),
            });
        }
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| TokenizerError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let len = inner.get_vocab_size(true);
        Ok(Tokenizer { inner, len })
    }

    /// The tokenizer of a model directory.
    pub fn from_dir(dir: &Path) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_file(&dir.join(TOKENIZER_FILE))
    }

    /// Ids the tokenizer knows (`len(tokenizer)`: entries plus added tokens).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The ids of `text`, special-token strings included as their ids, no
    /// BOS/EOS added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let enc = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| TokenizerError::Codec {
                what: "encode",
                message: e.to_string(),
            })?;
        Ok(enc.get_ids().to_vec())
    }

    /// The text of `ids`, special tokens kept. An id outside the tokenizer
    /// is an error.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.len) {
            return Err(TokenizerError::UnknownId { id, len: self.len });
        }
        self.inner
            .decode(ids, false)
            .map_err(|e| TokenizerError::Codec {
                what: "decode",
                message: e.to_string(),
            })
    }

    /// The id of a token string (an added token such as `<｜User｜>`).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The raw vocabulary string of an id (byte-level symbols, not text).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The bytes each id stands for, for byte-level BPE vocabularies (the
    /// V4 series'): a vocabulary entry's symbols mapped back through the
    /// GPT-2 byte alphabet; an added token's content, prefixed with
    /// `special_marker` when it is special. A symbol outside the alphabet
    /// (not a byte-level tokenizer) is an error.
    pub fn token_bytes(&self, special_marker: u8) -> Result<Vec<Vec<u8>>, TokenizerError> {
        let alphabet = byte_alphabet();
        let added = self.inner.get_added_tokens_decoder();
        (0..u32::try_from(self.len).unwrap_or(u32::MAX))
            .map(|id| {
                if let Some(t) = added.get(&id) {
                    let mut b = Vec::with_capacity(t.content.len() + 1);
                    if t.special {
                        b.push(special_marker);
                    }
                    b.extend_from_slice(t.content.as_bytes());
                    return Ok(b);
                }
                let sym = self.inner.id_to_token(id).unwrap_or_default();
                sym.chars()
                    .map(|c| {
                        alphabet.get(&c).copied().ok_or(TokenizerError::Codec {
                            what: "token bytes",
                            message: format!("id {id} ({sym:?}) is not a byte-level BPE symbol"),
                        })
                    })
                    .collect()
            })
            .collect()
    }
}

/// The GPT-2 byte alphabet: printable bytes stand for themselves, the rest
/// for U+0100 onwards in byte order.
fn byte_alphabet() -> HashMap<char, u8> {
    let mut next = 0x100u32;
    (0..=255u8)
        .map(|b| {
            let own = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
            let c = if own {
                b as char
            } else {
                next += 1;
                char::from_u32(next - 1).unwrap_or('\0')
            };
            (c, b)
        })
        .collect()
}

/// The private-use sentinel that protects a lone space from `Strip`.
const SENTINEL: &str = "\u{E000}";

/// The §8.1 normaliser sequence: NFKC, NFD, strip accents, lowercase,
/// whitespace runs → one space, a lone space → sentinel, strip, sentinel →
/// space.
fn engram_normalizer() -> Result<Sequence, TokenizerError> {
    let replace = |pattern: tokenizers::normalizers::replace::ReplacePattern, content: &str| {
        Replace::new(pattern, content).map_err(|e| TokenizerError::Codec {
            what: "engram normaliser",
            message: e.to_string(),
        })
    };
    use tokenizers::normalizers::replace::ReplacePattern::{Regex, String as Literal};
    let steps: Vec<NormalizerWrapper> = vec![
        NFKC.into(),
        NFD.into(),
        StripAccents.into(),
        Lowercase.into(),
        replace(Regex("[ \t\r\n]+".into()), " ")?.into(),
        replace(Regex("^ $".into()), SENTINEL)?.into(),
        Strip::new(true, true).into(),
        replace(Literal(SENTINEL.into()), " ")?.into(),
    ];
    Ok(Sequence::new(steps))
}

/// The Engram compressed-token map of `tok` (§8.1): for each id, the class
/// of its key — the raw token string when the id decodes to text holding
/// U+FFFD, else the normalised decoded text (the decoded text itself when
/// that is empty) — with classes numbered on first occurrence. Returns the
/// map and the class count.
pub fn engram_token_map(tok: &Tokenizer) -> Result<(Vec<i64>, usize), TokenizerError> {
    let norm = engram_normalizer()?;
    let mut classes: HashMap<String, i64> = HashMap::new();
    let mut map = Vec::with_capacity(tok.len());
    // Ids are u32: a tokenizer holds at most 2^32 of them.
    for id in 0..u32::try_from(tok.len()).unwrap_or(u32::MAX) {
        let text = tok.decode(&[id])?;
        let key = if text.contains('\u{FFFD}') {
            tok.id_to_token(id)
                .ok_or(TokenizerError::UnknownId { id, len: tok.len() })?
        } else {
            let mut n = NormalizedString::from(text.as_str());
            norm.normalize(&mut n).map_err(|e| TokenizerError::Codec {
                what: "engram normaliser",
                message: e.to_string(),
            })?;
            let n = n.get().to_string();
            if n.is_empty() { text } else { n }
        };
        let next = classes.len() as i64;
        map.push(*classes.entry(key).or_insert(next));
    }
    Ok((map, classes.len()))
}
