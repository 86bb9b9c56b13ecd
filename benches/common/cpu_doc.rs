//! The bench JSON of the CPU benches (`benches/*_cpu.rs`): the machine's
//! name as `device`, the run's date and commit from the environment the
//! bench script sets, then the bench's own fields.

use serde_json::{Map, Value};

/// Writes `fields` (a JSON object) to `out` after `device` (the first
/// CPU's model name from /proc/cpuinfo, "cpu" where it is not readable),
/// `date` ($DEEPINFER_BENCH_DATE) and `commit` ($DEEPINFER_BENCH_COMMIT).
pub fn write(out: &std::ffi::OsStr, fields: Value) {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("model name"))
            .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
    });
    let env = |k: &str| Value::from(std::env::var(k).unwrap_or_default());
    let mut doc = Map::new();
    doc.insert("device".into(), cpu.unwrap_or_else(|| "cpu".into()).into());
    doc.insert("date".into(), env("DEEPINFER_BENCH_DATE"));
    doc.insert("commit".into(), env("DEEPINFER_BENCH_COMMIT"));
    if let Value::Object(f) = fields {
        doc.extend(f);
    }
    std::fs::write(out, serde_json::to_string_pretty(&doc).unwrap_or_default())
        .expect("writing the bench JSON");
}
