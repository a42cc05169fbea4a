//! Casting JSON into an FSM's state type, with errors that name the field path.
//!
//! `#[derive(DurableState)]` implements [`DurableState`] field by field, so that
//! `#[durable(default)]` fields may be absent and an error names the exact path
//! (`state.order: expected u64, found string`). Unknown keys are ignored.

use serde::{de::DeserializeOwned, Serialize};
use serde_json::Value;

/// A state that can be stored as JSON and cast back, field by field.
///
/// Derive it with `#[derive(DurableState)]`. A hand-written impl can rely on the
/// default [`DurableState::cast`], which deserializes with serde and reports the path.
pub trait DurableState: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// A stable name for the type, used in error messages and docs.
    const TYPE_NAME: &'static str;

    /// Casts a JSON value into the state. `path` is where the value sits
    /// (`"state"` at the top); errors extend it (`"state.order"`).
    fn cast_at(value: &Value, path: &str) -> Result<Self, CastError> {
        cast_field(value, path)
    }

    /// Casts a JSON value into the state, naming the failing field on error.
    fn cast(value: &Value) -> Result<Self, CastError> {
        Self::cast_at(value, "state")
    }
}

/// Why a JSON value did not cast into a state: where, what was expected, what was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: expected {expected}, found {found}")]
pub struct CastError {
    /// Dotted path to the failing value, e.g. `state.order` or `state.items[2].sku`.
    pub path: String,
    /// What the type wanted there.
    pub expected: String,
    /// What the JSON held (`string`, `number 3.5`, `missing`, …).
    pub found: String,
}

impl CastError {
    /// A field that must be present is absent.
    pub fn missing(path: impl Into<String>, expected: impl Into<String>) -> Self {
        CastError {
            path: path.into(),
            expected: expected.into(),
            found: "missing".into(),
        }
    }
}

/// The kind of a JSON value, as error messages name it.
pub fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Deserializes any serde type from `value`, turning serde's error into a [`CastError`]
/// whose path is `path` extended by serde's own path inside the value.
pub fn cast_field<T: DeserializeOwned>(value: &Value, path: &str) -> Result<T, CastError> {
    serde_path_to_error::deserialize::<_, T>(value).map_err(|err| {
        let inner = err.path().to_string();
        let full = if inner == "." || inner.is_empty() {
            path.to_string()
        } else if inner.starts_with('[') {
            format!("{path}{inner}")
        } else {
            format!("{path}.{inner}")
        };
        let found = lookup(value, err.path())
            .map(json_kind)
            .unwrap_or("missing");
        let message = err.into_inner().to_string();
        // serde reports a missing field at the object that lacks it; name the field.
        if let Some(field) = message
            .strip_prefix("missing field `")
            .and_then(|rest| rest.strip_suffix('`'))
        {
            return CastError::missing(format!("{full}.{field}"), "a value");
        }
        CastError {
            path: full,
            expected: expected_from(&message),
            found: found.to_string(),
        }
    })
}

/// Follows a serde path into a JSON value.
fn lookup<'v>(value: &'v Value, path: &serde_path_to_error::Path) -> Option<&'v Value> {
    use serde_path_to_error::Segment;
    path.iter().try_fold(value, |v, seg| match seg {
        Segment::Seq { index } => v.get(index),
        Segment::Map { key } | Segment::Enum { variant: key } => v.get(key.as_str()),
        Segment::Unknown => None,
    })
}

/// Pulls "u64" out of serde's "invalid type: string \"x\", expected u64".
fn expected_from(message: &str) -> String {
    if let Some(at) = message.find("expected ") {
        let rest = &message[at + "expected ".len()..];
        rest.split(" at line").next().unwrap_or(rest).to_string()
    } else {
        message.to_string()
    }
}

impl DurableState for Value {
    const TYPE_NAME: &'static str = "serde_json::Value";
    fn cast_at(value: &Value, _path: &str) -> Result<Self, CastError> {
        Ok(value.clone())
    }
}

impl DurableState for () {
    const TYPE_NAME: &'static str = "()";
    fn cast_at(_value: &Value, _path: &str) -> Result<Self, CastError> {
        Ok(())
    }
}
