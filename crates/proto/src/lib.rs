//! The `specmesh.v1` wire contracts (generated code) and the plain
//! conversions every service shares: token trees, sampling, structured
//! outputs and [`sources_from_wire`], each checked on its own, the field
//! errors that name what to fix ([`field`]) and every bound of the
//! protocol, defined here once ([`limits`]).
//!
//! A message as a whole is checked by the service that receives it, in
//! its own `validate` module, its one wire edge: the drafter's
//! `DraftStart` and `StepOutcome`, the verifier's `RunRequest` and
//! `TokenTree`, the gateway's `GenerateRequest`. This crate depends on no
//! speculation crate, only on the value types the wire carries (trees,
//! sampling, grammar constraints).

#![forbid(unsafe_code)]
#![allow(missing_debug_implementations)]

mod convert;
pub mod field;
pub mod limits;
mod sampling;
mod sources;
mod structured;

pub use convert::{ConvertError, tree_from_wire, tree_span, tree_to_wire};
pub use field::FieldError;
pub use limits::{MAX_TREE_SPAN, last_step};
pub use sampling::check_top_k;
pub use sources::sources_from_wire;
pub use structured::{
    MAX_TOP_LOGPROBS, logprobs_from_wire, structured_from_wire, structured_to_wire,
};

/// Generated messages, clients and servers of package `specmesh.v1`.
pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("specmesh.v1");
}

/// The encoded descriptor set of every specmesh proto file, for gRPC server
/// reflection (clients need no proto files).
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/specmesh_descriptor.bin"));
