//! What the `specmesh` command runs on this machine, shared by its user
//! commands (`up`, `generate`, `tokenize`, `token-ranking`) and by the
//! benchmarks (`specmesh-bench`), declared once:
//!
//! * [`model`]: the `--model`, `--threads` and `--isa` flags and loading
//!   the model and its tokenizer in-process;
//! * [`prompt`]: a prompt's token ids, chat template applied;
//! * [`layout`]: the mesh's flags ([`MeshArgs`](layout::MeshArgs), one
//!   struct for `up`, `bench --up` and `bench-serve --up`) and the
//!   [`Layout`](layout::Layout) they build;
//! * [`launch`]: the services started from a layout as child processes on
//!   loopback, and stopped (the crate's only unsafe code);
//! * [`link`]: the drafters as a separate host, behind a delay proxy;
//! * [`grpc`]: the gateway's gRPC API as a client dials and streams it.
//!
//! Plain decoding, the reference every speculative path reproduces, is the
//! engine's (`specmesh_engine::plain`).

#![deny(unsafe_code)]

pub mod grpc;
#[allow(unsafe_code)]
pub mod launch;
pub mod layout;
pub mod link;
pub mod model;
pub mod prompt;
