//! Strategies every service's wire-edge fuzzing shares: what a careless or
//! hostile client may put in a field (non-finite floats, any Unicode,
//! out-of-range integers), and the one check of a refusal.

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use specmesh_proto::v1;
use tonic::Code;

/// A float a client may send: ordinary values in `ordinary`, NaN, ±∞, a
/// negative, or any bit pattern.
pub fn any_float(ordinary: std::ops::Range<f32>) -> impl Strategy<Value = f32> {
    prop_oneof![
        ordinary,
        Just(f32::NAN),
        Just(f32::INFINITY),
        Just(f32::NEG_INFINITY),
        Just(-1.0f32),
        any::<f32>()
    ]
}

/// Text a client may send: empty, matching `plain` (a regex of the
/// ordinary values), any Unicode, or long.
pub fn any_text(plain: &'static str) -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), plain, any::<String>(), "\\PC{100,300}"]
}

/// A `u32` that is usually small (below `small`) and sometimes anything.
pub fn any_u32(small: u32) -> impl Strategy<Value = u32> {
    prop_oneof![0..small, any::<u32>()]
}

/// Sampling parameters a client may send: any of the floats above, a
/// top-k of any size, any seed.
pub fn any_sampling() -> impl Strategy<Value = v1::SamplingParams> {
    (
        any_float(0.0..2.0),
        any_float(0.0..1.0),
        any_u32(64),
        any::<u64>(),
    )
        .prop_map(|(temperature, top_p, top_k, seed)| v1::SamplingParams {
            temperature,
            top_p,
            top_k,
            seed,
        })
}

/// A refusal as a wire edge must give it: INVALID_ARGUMENT, with a message
/// that says what to fix.
pub fn refused_with_a_reason(status: &tonic::Status) -> Result<(), TestCaseError> {
    prop_assert_eq!(status.code(), Code::InvalidArgument, "{:?}", status);
    prop_assert!(!status.message().is_empty(), "{:?}", status);
    Ok(())
}
