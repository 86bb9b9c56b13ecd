//! Typed access to the keys of one parsed config file: [`Reader`] looks a
//! [`Key`] up in the spelling of its [`ConfigForm`], and a [`Kind`] parses
//! the value and names its expected type in errors.
//!
//! Invariant: an absent key and a `null` one are the same; a present value
//! of the wrong type is an error ([`ConfigError::WrongType`]), never a
//! default.

use serde_json::{Map, Value};

use super::error::ConfigError;
use super::keys::{ConfigForm, Key};

/// A JSON value type: how to parse it and how to name it in errors.
pub(super) struct Kind<T> {
    parse: fn(&Value) -> Option<T>,
    expected: &'static str,
}

pub(super) const UINT: Kind<usize> = Kind {
    parse: |v| v.as_u64().and_then(|n| usize::try_from(n).ok()),
    expected: "a non-negative integer",
};
pub(super) const UINT64: Kind<u64> = Kind {
    parse: Value::as_u64,
    expected: "a non-negative integer",
};
pub(super) const TOKEN: Kind<u32> = Kind {
    parse: |v| v.as_u64().and_then(|n| u32::try_from(n).ok()),
    expected: "a token id",
};
pub(super) const INT: Kind<i64> = Kind {
    parse: Value::as_i64,
    expected: "an integer",
};
pub(super) const FLOAT: Kind<f64> = Kind {
    parse: Value::as_f64,
    expected: "a number",
};
pub(super) const BOOL: Kind<bool> = Kind {
    parse: Value::as_bool,
    expected: "a boolean",
};
pub(super) const TEXT: Kind<String> = Kind {
    parse: |v| v.as_str().map(str::to_owned),
    expected: "a string",
};
pub(super) const UINTS: Kind<Vec<usize>> = Kind {
    parse: |v| v.as_array()?.iter().map(UINT.parse).collect(),
    expected: "a list of non-negative integers",
};
pub(super) const UINT64S: Kind<Vec<u64>> = Kind {
    parse: |v| v.as_array()?.iter().map(Value::as_u64).collect(),
    expected: "a list of non-negative integers",
};
pub(super) const PAIR: Kind<[usize; 2]> = Kind {
    parse: |v| (UINTS.parse)(v)?.try_into().ok(),
    expected: "a pair of non-negative integers",
};

/// Reads keys of one form from a parsed file.
pub(super) struct Reader<'a> {
    pub(super) root: &'a Map<String, Value>,
    pub(super) form: ConfigForm,
}

impl Reader<'_> {
    /// The key's value; absent and `null` are the same.
    pub(super) fn optional<T>(&self, key: Key, kind: Kind<T>) -> Result<Option<T>, ConfigError> {
        let name = key.name(self.form);
        let mut parts = name.split('.');
        let first = parts.next().and_then(|part| self.root.get(part));
        let value = parts.fold(first, |value, part| value?.get(part));
        match value.filter(|v| !v.is_null()) {
            None => Ok(None),
            Some(v) => (kind.parse)(v)
                .map(Some)
                .ok_or_else(|| ConfigError::WrongType {
                    form: self.form,
                    key: name,
                    value: shown(v),
                    expected: kind.expected,
                }),
        }
    }

    pub(super) fn required<T>(&self, key: Key, kind: Kind<T>) -> Result<T, ConfigError> {
        self.optional(key, kind)?
            .ok_or_else(|| ConfigError::MissingKey {
                form: self.form,
                key: key.name(self.form),
            })
    }
}

/// A JSON value for an error message, cut to a readable length.
pub(super) fn shown(value: &Value) -> String {
    const MAX: usize = 60;
    let text = value.to_string();
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}
