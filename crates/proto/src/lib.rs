//! The `specmesh.v1` wire contracts and their conversion into validated
//! domain types: the only wire edge. Everything that arrives over the
//! network passes through a `TryFrom` or a `*_from_wire` here before any
//! other code sees it, and every bound of the protocol is defined here
//! once ([`limits`]). Each service then checks the result against its own
//! state (vocabulary, context, configured limits).

#![forbid(unsafe_code)]
#![allow(missing_debug_implementations)]

mod convert;
pub mod field;
pub mod limits;
mod run;
mod sampling;
mod start;
mod structured;

pub use convert::{ConvertError, tree_from_wire, tree_span, tree_to_wire};
pub use field::FieldError;
pub use limits::{MAX_TREE_SPAN, last_step};
pub use run::{CacheKey, RunDraft, RunSpec};
pub use sampling::check_top_k;
pub use start::{
    ANONYMOUS_TENANT, CacheScope, CurveFallback, MAX_MODEL_NAME_BYTES, StartSpec, TargetModel,
    sources_from_wire,
};
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
