//! The `specmesh.v1` wire contracts and their conversion into validated
//! domain types. Everything that arrives over the network passes through a
//! `TryFrom`/`to_domain` here before any other code sees it.

#![allow(missing_debug_implementations)]

mod convert;

pub use convert::{ConvertError, MAX_TREE_SPAN, tree_from_wire, tree_span, tree_to_wire};

/// Generated messages, clients and servers of package `specmesh.v1`.
pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("specmesh.v1");
}

/// The encoded descriptor set of every specmesh proto file, for gRPC server
/// reflection (clients need no proto files).
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/specmesh_descriptor.bin"));
