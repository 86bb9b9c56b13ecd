//! Structured-output mask time per token on the real V4 vocabulary
//! (129,280 ids): llguidance's mask for the next token plus applying it to a
//! logits row, along walks that pick a random allowed token each step
//! (seeded), for a JSON Schema, a regex and a Lark grammar. llguidance's
//! published figure is about 50 µs per token for JSON schemas.
//!
//! Writes `benches/results/<date>-cpu-structured.json` (the gpu.md record
//! format, `device` = this host's CPU) when `DEEPINFER_BENCH_OUT` names the
//! file; prints a table either way.

#[path = "common/cpu_doc.rs"]
mod cpu_doc;

use deepinfer::engine::{Grammars, SchemaType, StructuredOutput};
use deepinfer::model::runner::v4_tokenizer_path;
use deepinfer::model::tokenizer::Tokenizer;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use std::time::Instant;

const SCHEMA: &str = r#"{"type": "object", "properties": {
  "id": {"type": "integer"}, "title": {"type": "string", "maxLength": 40},
  "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
  "score": {"type": "number"}, "done": {"type": "boolean"},
  "owner": {"type": "object", "properties": {"name": {"type": "string"}, "email": {"type": "string"}},
            "required": ["name"]}},
  "required": ["id", "title", "tags", "done", "owner"]}"#;

fn walk(g: &Grammars, so: &StructuredOutput, rng: &mut StdRng, steps: usize) -> Vec<f64> {
    let mut c = g.compile(so).expect("the bench grammar compiles");
    let mut row = vec![0f32; 129_280];
    let mut times = Vec::with_capacity(steps);
    for _ in 0..steps {
        row.fill(0.0);
        let t = Instant::now();
        if c.mask(&mut row).is_err() {
            break;
        }
        times.push(t.elapsed().as_secs_f64() * 1e6);
        let allowed: Vec<usize> = (0..row.len()).filter(|&i| !row[i].is_nan()).collect();
        let tok = allowed[rng.random_range(0..allowed.len())] as u32;
        if tok == 1 || c.consume(tok).unwrap_or(true) {
            break;
        }
    }
    times
}

fn main() {
    let tok =
        Tokenizer::from_file(&v4_tokenizer_path().expect("scripts/setup installs the tokenizer"))
            .expect("the V4 tokenizer loads");
    let t = Instant::now();
    let g = Grammars::new(&tok, 1, 0).expect("the token trie builds");
    let build_ms = t.elapsed().as_secs_f64() * 1e3;
    let cases = [
        ("json_schema", SchemaType::Json, SCHEMA.to_string()),
        ("regex", SchemaType::Regex, "[a-z]{1,12}(-[a-z0-9]{1,8}){0,6}@[a-z]{2,10}\\.(com|org|net)".into()),
        ("lark", SchemaType::Ebnf, "start: expr\nexpr: term ((\"+\" | \"-\") term)*\nterm: NUM | \"(\" expr \")\"\nNUM: /[0-9]{1,4}/\n".into()),
    ];
    let mut rng = StdRng::seed_from_u64(7);
    let mut records = Vec::new();
    println!("trie + compiler build: {build_ms:.1} ms");
    println!(
        "{:12} {:>7} {:>9} {:>9} {:>9}",
        "grammar", "tokens", "mean µs", "p50 µs", "p99 µs"
    );
    for (name, kind, schema) in cases {
        let so = StructuredOutput {
            schema_type: kind,
            schema,
        };
        let mut times: Vec<f64> = (0..20).flat_map(|_| walk(&g, &so, &mut rng, 200)).collect();
        times.sort_by(f64::total_cmp);
        let mean = times.iter().sum::<f64>() / times.len() as f64;
        let q = |p: f64| times[((times.len() - 1) as f64 * p) as usize];
        println!(
            "{name:12} {:>7} {mean:>9.1} {:>9.1} {:>9.1}",
            times.len(),
            q(0.5),
            q(0.99)
        );
        records.push(json!({
            "op": "structured_mask", "shape": {"grammar": name, "vocab": 129_280, "tokens": times.len()},
            "ours_us": q(0.5), "mean_us": mean, "p99_us": q(0.99),
            "what": "llguidance compute_mask + applying it to one f32 logits row, per token",
            // llguidance publishes ~50 µs per token for JSON schemas only.
            "peers": if name == "json_schema" {
                json!([{"name": "llguidance_published_json", "us": 50.0}])
            } else {
                json!([])
            }
        }));
    }
    if let Some(out) = std::env::var_os("DEEPINFER_BENCH_OUT") {
        let fields = json!({
            "trie_build_ms": build_ms,
            "records": records,
        });
        cpu_doc::write(&out, fields);
    }
}
