//! Typed access to GGUF metadata values, with errors that name the key and
//! say what type or value was found instead.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;

use super::KEY_TOKENS;
use crate::TokenizerError;

pub(super) fn type_name(value: &Value) -> String {
    match value {
        Value::U8(_) => "u8".into(),
        Value::I8(_) => "i8".into(),
        Value::U16(_) => "u16".into(),
        Value::I16(_) => "i16".into(),
        Value::U32(_) => "u32".into(),
        Value::I32(_) => "i32".into(),
        Value::U64(_) => "u64".into(),
        Value::I64(_) => "i64".into(),
        Value::F32(_) => "f32".into(),
        Value::F64(_) => "f64".into(),
        Value::Bool(_) => "bool".into(),
        Value::String(_) => "string".into(),
        Value::Array(items) => match items.first() {
            Some(first) => format!("array of {}", type_name(first)),
            None => "empty array".into(),
        },
    }
}

pub(super) fn int_value(value: &Value) -> Option<i128> {
    Some(match value {
        Value::U8(v) => i128::from(*v),
        Value::I8(v) => i128::from(*v),
        Value::U16(v) => i128::from(*v),
        Value::I16(v) => i128::from(*v),
        Value::U32(v) => i128::from(*v),
        Value::I32(v) => i128::from(*v),
        Value::U64(v) => i128::from(*v),
        Value::I64(v) => i128::from(*v),
        _ => return None,
    })
}

/// Typed access to the metadata map with errors that name the key.
pub(super) struct Meta<'a>(pub(super) &'a HashMap<String, Value>);

impl<'a> Meta<'a> {
    pub(super) fn wrong(key: &str, expected: &'static str, found: &Value) -> TokenizerError {
        TokenizerError::WrongType {
            key: key.to_owned(),
            expected,
            found: type_name(found),
        }
    }

    pub(super) fn str(&self, key: &str) -> Result<Option<&'a str>, TokenizerError> {
        match self.0.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(Self::wrong(key, "string", other)),
        }
    }

    pub(super) fn bool(&self, key: &str) -> Result<Option<bool>, TokenizerError> {
        match self.0.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(Self::wrong(key, "bool", other)),
        }
    }

    pub(super) fn array(&self, key: &str) -> Result<Option<&'a [Value]>, TokenizerError> {
        match self.0.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => Ok(Some(items)),
            Some(other) => Err(Self::wrong(key, "array", other)),
        }
    }

    pub(super) fn element_error(
        key: &str,
        index: usize,
        expected: &str,
        found: &Value,
    ) -> TokenizerError {
        TokenizerError::InvalidValue {
            key: key.to_owned(),
            reason: format!(
                "element {index} has type {}, expected {expected}",
                type_name(found)
            ),
        }
    }

    pub(super) fn strings(&self, key: &str) -> Result<Option<Vec<&'a str>>, TokenizerError> {
        let Some(items) = self.array(key)? else {
            return Ok(None);
        };
        items
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) => Ok(s.as_str()),
                other => Err(Self::element_error(key, i, "string", other)),
            })
            .collect::<Result<_, _>>()
            .map(Some)
    }

    /// A token id; `-1` / `u32::MAX` are the "no such token" sentinels.
    pub(super) fn token_id(
        &self,
        key: &str,
        vocab_size: usize,
    ) -> Result<Option<u32>, TokenizerError> {
        let Some(value) = self.0.get(key) else {
            return Ok(None);
        };
        let id = int_value(value).ok_or_else(|| Self::wrong(key, "integer", value))?;
        if id == -1 || id == i128::from(u32::MAX) {
            return Ok(None);
        }
        match u32::try_from(id) {
            Ok(id) if (id as usize) < vocab_size => Ok(Some(id)),
            _ => Err(TokenizerError::InvalidValue {
                key: key.to_owned(),
                reason: format!("token id {id} is outside the vocabulary of {vocab_size} tokens"),
            }),
        }
    }

    /// A per-token array that, when present, must match the vocabulary length.
    pub(super) fn per_token<'s>(
        &'s self,
        key: &str,
        vocab_size: usize,
    ) -> Result<Option<&'a [Value]>, TokenizerError> {
        let Some(items) = self.array(key)? else {
            return Ok(None);
        };
        if items.len() != vocab_size {
            return Err(TokenizerError::InvalidValue {
                key: key.to_owned(),
                reason: format!(
                    "has {} entries but `{KEY_TOKENS}` has {vocab_size}",
                    items.len()
                ),
            });
        }
        Ok(Some(items))
    }
}
