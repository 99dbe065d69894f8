//! Capabilities: what a member serves beyond the base protocol, so that a
//! gateway places a request only where it is understood.
//!
//! A protobuf field an older member does not know is silently dropped, so
//! a new request field that changes the output (a grammar) would be
//! ignored by an older verifier rather than refused. Each such feature is
//! therefore reported as a gRPC health service of its own name, SERVING
//! while the member serves; the gateway checks the name once per member
//! (re)connection. An older member answers NOT_FOUND for a name it never
//! registered: version skew fails closed.

/// Structured outputs: `RunRequest.structured` and `logprobs` are honoured.
pub const STRUCTURED: &str = "specmesh.v1.capability.structured";
