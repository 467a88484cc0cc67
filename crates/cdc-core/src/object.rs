//! Reading a JSON config object with paths in its messages (`config.operations[1]`): the
//! helpers every config parser shares (capture configs here, sink configs in `cdc-sinks`).
use serde_json::{Map, Value};

use crate::error::{did_you_mean, CdcError, CdcResult, ErrorKind};

/// A JSON object being read, with the path for messages and the keys already used.
pub struct Obj<'a> {
    /// Its JSON path (`config.compliance`).
    pub path: String,
    /// Its keys and values.
    pub map: &'a Map<String, Value>,
}

/// The JSON type of a value, for messages.
pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// A 22023 error.
pub fn invalid(msg: impl Into<String>) -> CdcError {
    CdcError::new(ErrorKind::InvalidParameter, msg)
}

/// A 22023 error: `path` holds the wrong JSON type.
pub fn wrong_type(path: &str, expected: &str, got: &Value) -> CdcError {
    invalid(format!("{path} must be {expected}, not {}", type_name(got)))
}

impl<'a> Obj<'a> {
    /// The object `v`, named `name` in messages; an error when it is not an object.
    pub fn root(name: &str, v: &'a Value) -> CdcResult<Self> {
        match v {
            Value::Object(map) => Ok(Obj { path: name.to_string(), map }),
            other => Err(wrong_type(name, "a JSON object", other)),
        }
    }

    /// The path of one of its keys.
    pub fn child_path(&self, key: &str) -> String {
        format!("{}.{}", self.path, key)
    }

    /// Refuses a key not in `known`, with a "did you mean" hint.
    pub fn check_keys(&self, known: &[&str]) -> CdcResult<()> {
        for k in self.map.keys() {
            if !known.contains(&k.as_str()) {
                let mut e = invalid(format!("unknown key \"{k}\" in {}", self.path));
                e = match did_you_mean(k, known.iter().copied()) {
                    Some(s) => e.hint(format!("Did you mean \"{s}\"?")),
                    None => e.hint(format!("Valid keys: {}.", known.join(", "))),
                };
                return Err(e);
            }
        }
        Ok(())
    }

    /// A key's value; JSON null counts as absent.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// A boolean key.
    pub fn bool(&self, key: &str) -> CdcResult<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(wrong_type(&self.child_path(key), "true or false", v)),
        }
    }

    /// A non-empty string key.
    pub fn string(&self, key: &str) -> CdcResult<Option<&'a str>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) if !s.is_empty() => Ok(Some(s)),
            Some(Value::String(_)) => Err(invalid(format!("{} must not be empty", self.child_path(key)))),
            Some(v) => Err(wrong_type(&self.child_path(key), "a string", v)),
        }
    }

    /// An integer key within `min..=max`.
    pub fn int(&self, key: &str, min: i64, max: i64) -> CdcResult<Option<i64>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => match n.as_i64() {
                Some(i) if (min..=max).contains(&i) => Ok(Some(i)),
                _ => Err(invalid(format!(
                    "{} must be an integer between {min} and {max}, not {n}",
                    self.child_path(key)
                ))),
            },
            Some(v) => Err(wrong_type(&self.child_path(key), "an integer", v)),
        }
    }

    /// An array of distinct non-empty strings.
    pub fn strings(&self, key: &str) -> CdcResult<Option<Vec<String>>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => {
                let mut out = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    match item {
                        Value::String(s) if !s.is_empty() => {
                            if out.contains(s) {
                                return Err(invalid(format!("{}[{i}]: \"{s}\" is listed twice", self.child_path(key))));
                            }
                            out.push(s.clone())
                        }
                        Value::String(_) => {
                            return Err(invalid(format!("{}[{i}] must not be an empty string", self.child_path(key))))
                        }
                        other => return Err(wrong_type(&format!("{}[{i}]", self.child_path(key)), "a string", other)),
                    }
                }
                Ok(Some(out))
            }
            Some(v) => Err(wrong_type(&self.child_path(key), "an array of strings", v)),
        }
    }

    /// An object key.
    pub fn object(&self, key: &str) -> CdcResult<Option<Obj<'a>>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(map)) => Ok(Some(Obj { path: self.child_path(key), map })),
            Some(v) => Err(wrong_type(&self.child_path(key), "a JSON object", v)),
        }
    }
}

/// A 0A000 error: `path` asks for a feature that is planned, not built.
pub fn planned(path: &str, what: &str) -> CdcError {
    CdcError::new(ErrorKind::FeatureNotSupported, format!("{path} is not supported yet: {what} is planned"))
        .hint("See the README's configuration table for what works in this version.")
}
