//! Structured output on the real vocabulary (the tiny-v4vocab model, fresh
//! random weights): 240 constrained generations — JSON Schema, regex and a
//! Lark grammar, greedy and sampled — all parse and validate, checked by
//! code independent of the grammar engine; bad `so_args` fail alone.

mod common;

use common::TempDir;
use deepinfer::engine::{Engine, SamplingParams, SchemaType, StopReason, StructuredOutput};
use rand::Rng;
use serde_json::Value;

const SCHEMA: &str = r#"{
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 6},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "ok": {"type": "boolean"},
    "tag": {"enum": ["red", "green", "blue"]}
  },
  "required": ["name", "age", "ok", "tag"],
  "additionalProperties": false,
  "x-guidance": {"whitespace_flexible": false}
}"#;

const REGEX: &str = "[a-z]{2,6}-[0-9]{1,3}";

const GRAMMAR: &str = r#"start: num " " op " " num
op: "+" | "-" | "*"
num: /[0-9]{1,3}/
"#;

fn valid_json(text: &str) -> Result<(), String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("{e}"))?;
    let m = v.as_object().ok_or("not an object")?;
    if m.len() != 4 {
        return Err(format!("{} keys", m.len()));
    }
    let name = m["name"].as_str().ok_or("name")?;
    if name.chars().count() > 6 {
        return Err(format!("name {name:?} too long"));
    }
    let age = m["age"].as_i64().ok_or("age")?;
    if !(0..=120).contains(&age) {
        return Err(format!("age {age}"));
    }
    m["ok"].as_bool().ok_or("ok")?;
    let tag = m["tag"].as_str().ok_or("tag")?;
    if !["red", "green", "blue"].contains(&tag) {
        return Err(format!("tag {tag}"));
    }
    Ok(())
}

fn valid_regex(text: &str) -> Result<(), String> {
    let (word, num) = text.split_once('-').ok_or("no '-'")?;
    let ok = (2..=6).contains(&word.len())
        && word.bytes().all(|b| b.is_ascii_lowercase())
        && (1..=3).contains(&num.len())
        && num.bytes().all(|b| b.is_ascii_digit());
    ok.then_some(()).ok_or_else(|| "does not match".into())
}

fn valid_grammar(text: &str) -> Result<(), String> {
    let parts: Vec<&str> = text.split(' ').collect();
    let num = |s: &str| (1..=3).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit());
    let ok =
        parts.len() == 3 && num(parts[0]) && ["+", "-", "*"].contains(&parts[1]) && num(parts[2]);
    ok.then_some(()).ok_or_else(|| "does not parse".into())
}

fn run(
    engine: &Engine,
    rng: &mut impl Rng,
    schema_type: SchemaType,
    schema: &str,
    n: usize,
    check: fn(&str) -> Result<(), String>,
) {
    let params: Vec<SamplingParams> = (0..n)
        .map(|i| SamplingParams {
            temperature: if i % 4 == 0 { 0.0 } else { 1.0 },
            max_tokens: 96,
            stop: vec![engine.model.cfg.tokens.eos],
            seq_seed: rng.random(),
            so_args: Some(StructuredOutput {
                schema_type,
                schema: schema.into(),
            }),
            ..SamplingParams::default()
        })
        .collect();
    let prompts: Vec<Vec<u32>> = (0..n)
        .map(|_| {
            (0..rng.random_range(1..8))
                .map(|_| rng.random_range(0..129_280))
                .collect()
        })
        .collect();
    let outs = prompts
        .chunks(48)
        .zip(params.chunks(48))
        .flat_map(|(p, s)| engine.generate(p, s));
    for (i, r) in outs.enumerate() {
        let o = r.unwrap();
        assert!(
            matches!(o.stop, StopReason::Grammar | StopReason::Stop(1)),
            "{schema_type:?} {i}: {:?} after {} tokens",
            o.stop,
            o.tokens.len()
        );
        let text = o.text.unwrap();
        if let Err(e) = check(&text) {
            panic!("{schema_type:?} generation {i}: {text:?}: {e}");
        }
    }
}

#[test]
fn constrained_generations_all_validate() {
    let dir = TempDir::new("structured");
    let mut rng = common::rng("structured");
    let engine = common::tiny::v4vocab_engine(dir.path(), rng.random());
    run(&engine, &mut rng, SchemaType::Json, SCHEMA, 96, valid_json);
    run(&engine, &mut rng, SchemaType::Regex, REGEX, 80, valid_regex);
    run(
        &engine,
        &mut rng,
        SchemaType::Ebnf,
        GRAMMAR,
        64,
        valid_grammar,
    );
}

#[test]
fn bad_so_args_fail_alone_with_typed_errors() {
    let dir = TempDir::new("structured-bad");
    let engine = common::tiny::v4vocab_engine(dir.path(), 5);
    let so = |schema_type, schema: &str| SamplingParams {
        max_tokens: 8,
        so_args: Some(StructuredOutput {
            schema_type,
            schema: schema.into(),
        }),
        ..SamplingParams::default()
    };
    let params = [
        so(SchemaType::Json, "{not json"),
        so(SchemaType::Regex, "(["),
        so(SchemaType::Ebnf, "start: undefined_rule"),
        so(SchemaType::Regex, "[0-9]{4}"),
        SamplingParams::default(),
    ];
    let out = engine.generate(&vec![vec![5u32, 6, 7]; 5], &params);
    for (i, want) in ["not JSON", "does not compile", "does not compile"]
        .iter()
        .enumerate()
    {
        let e = out[i].as_ref().unwrap_err().to_string();
        assert!(e.contains("so_args") && e.contains(want), "{i}: {e}");
    }
    let digits = out[3].as_ref().unwrap();
    assert_eq!(digits.stop, StopReason::Grammar);
    let text = digits.text.as_deref().unwrap();
    assert!(
        text.len() == 4 && text.bytes().all(|b| b.is_ascii_digit()),
        "{text:?}"
    );
    assert!(out[4].is_ok());

    // Without a tokenizer there is no vocabulary to constrain.
    let bare = Engine::new(
        common::tiny::tiny_model(1).0,
        deepinfer::engine::EngineConfig::default(),
    )
    .unwrap();
    let e = bare
        .generate(&[vec![1u32, 2]], &[so(SchemaType::Regex, "a+")])
        .remove(0)
        .unwrap_err();
    assert!(e.to_string().contains("tokenizer"), "{e}");
}
