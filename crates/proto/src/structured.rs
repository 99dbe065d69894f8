//! The output's constraint and log-probabilities from the wire.

use specmesh_grammar::Structured;

use crate::field::FieldError;
use crate::v1;

/// Most alternatives per token a request may ask for (OpenAI's bound).
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// `Structured` from the wire: `None` when unset or when no kind is set.
/// Its size and grammar are checked where it is compiled.
pub fn structured_from_wire(s: Option<v1::Structured>) -> Option<Structured> {
    use v1::structured::Kind;
    match s?.kind? {
        Kind::JsonObject(true) => Some(Structured::JsonObject),
        Kind::JsonObject(false) => None,
        Kind::JsonSchema(t) => Some(Structured::JsonSchema(t)),
        Kind::Regex(t) => Some(Structured::Regex(t)),
        Kind::Lark(t) => Some(Structured::Lark(t)),
    }
}

/// `Structured` for the wire.
pub fn structured_to_wire(s: &Structured) -> v1::Structured {
    use v1::structured::Kind;
    let kind = match s {
        Structured::JsonObject => Kind::JsonObject(true),
        Structured::JsonSchema(t) => Kind::JsonSchema(t.clone()),
        Structured::Regex(t) => Kind::Regex(t.clone()),
        Structured::Lark(t) => Kind::Lark(t.clone()),
    };
    v1::Structured { kind: Some(kind) }
}

/// `logprobs` and `top_logprobs` as the alternatives to report per token
/// (`None`: no log-probabilities).
pub fn logprobs_from_wire(on: bool, top: u32) -> Result<Option<usize>, FieldError> {
    if top > MAX_TOP_LOGPROBS {
        return Err(FieldError::new(
            "top_logprobs",
            format!("must be at most {MAX_TOP_LOGPROBS}, got {top}"),
        ));
    }
    if !on && top > 0 {
        return Err(FieldError::new("top_logprobs", "needs `logprobs` set"));
    }
    Ok(on.then_some(top as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_and_bounds_are_named() {
        for s in [
            Structured::JsonObject,
            Structured::JsonSchema("{}".into()),
            Structured::Regex("a+".into()),
            Structured::Lark("start: /a/".into()),
        ] {
            assert_eq!(structured_from_wire(Some(structured_to_wire(&s))), Some(s));
        }
        assert_eq!(structured_from_wire(Some(v1::Structured::default())), None);
        assert_eq!(logprobs_from_wire(true, 20), Ok(Some(20)));
        assert_eq!(logprobs_from_wire(false, 0), Ok(None));
        assert_eq!(
            logprobs_from_wire(true, 21).unwrap_err().to_string(),
            "`top_logprobs` must be at most 20, got 21"
        );
        assert_eq!(
            logprobs_from_wire(false, 2).unwrap_err().to_string(),
            "`top_logprobs` needs `logprobs` set"
        );
    }
}
