//! Structured output (`serving.md` §6): a request's `so_args` — a regular
//! expression, a JSON Schema or a Lark/EBNF grammar, as upstream's
//! `{schema_type, schema}` — constrain every sampled token.

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
