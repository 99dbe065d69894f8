//! `SamplingParams` from the wire.

use specmesh_sampling::{SamplingError, SamplingParams};

use crate::field::FieldError;
use crate::v1;

impl TryFrom<v1::SamplingParams> for SamplingParams {
    type Error = FieldError;

    /// proto3 cannot tell an unset `top_p` from 0: both mean 1 (keep all).
    /// `top_k` against the vocabulary is [`check_top_k`]'s, which knows it.
    fn try_from(wire: v1::SamplingParams) -> Result<SamplingParams, FieldError> {
        let top_p = if wire.top_p == 0.0 { 1.0 } else { wire.top_p };
        SamplingParams::new(wire.temperature, top_p, wire.top_k as usize, wire.seed).map_err(|e| {
            match e {
                SamplingError::Temperature(t) => FieldError::new(
                    "sampling.temperature",
                    format!("must be a finite number >= 0, got {t}"),
                ),
                SamplingError::TopP(p) => {
                    FieldError::new("sampling.top_p", format!("must be in (0, 1], got {p}"))
                }
            }
        })
    }
}

impl From<&SamplingParams> for v1::SamplingParams {
    fn from(p: &SamplingParams) -> v1::SamplingParams {
        v1::SamplingParams {
            temperature: p.temperature,
            top_p: p.top_p,
            top_k: u32::try_from(p.top_k).unwrap_or(u32::MAX),
            seed: p.seed,
        }
    }
}

/// Refuses a `sampling.top_k` above the vocabulary size.
pub fn check_top_k(params: &SamplingParams, vocab: usize) -> Result<(), FieldError> {
    if params.top_k > vocab {
        return Err(FieldError::new(
            "sampling.top_k",
            format!(
                "must be at most the vocabulary size ({vocab}), got {}",
                params.top_k
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_top_p_keeps_all_and_bad_values_name_their_field() {
        let p = SamplingParams::try_from(v1::SamplingParams::default()).unwrap();
        assert_eq!((p.temperature, p.top_p, p.top_k), (0.0, 1.0, 0));
        let e = SamplingParams::try_from(v1::SamplingParams {
            temperature: -1.0,
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "`sampling.temperature` must be a finite number >= 0, got -1"
        );
        let e = SamplingParams::try_from(v1::SamplingParams {
            top_p: 1.5,
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(e.field, "sampling.top_p");
        let p = SamplingParams::try_from(v1::SamplingParams {
            top_k: 9,
            ..Default::default()
        })
        .unwrap();
        assert!(check_top_k(&p, 9).is_ok());
        let back = SamplingParams::try_from(v1::SamplingParams::from(&p)).unwrap();
        assert_eq!(back, p);
        assert_eq!(check_top_k(&p, 8).unwrap_err().field, "sampling.top_k");
    }
}
