//! The drafter service over real gRPC: a real server on 127.0.0.1:0,
//! started in-process, driven by the generated `DrafterClient` the way a
//! verifier drives it.

mod common;
mod invalid;
mod model;
mod ops;
mod prefix;
mod session;
mod tenants;
