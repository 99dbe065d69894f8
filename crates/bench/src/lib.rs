//! The benchmarks of specmesh, behind the `specmesh` subcommands that run
//! them (the binary only wires them in):
//!
//! * [`bench`] (`specmesh bench`): Spec-Bench through the gateway,
//!   speculation against plain decoding, with the concurrency sweep, the
//!   in-process loop and llama.cpp as an optional peer;
//! * [`serve`] (`specmesh bench-serve`): open-loop arrivals at request
//!   rates through the gateway's gRPC or HTTP API, speculation off against
//!   auto, with vllm bench serve's latency metrics and goodput;
//! * [`bench_model`] (`specmesh bench-model`): the model runtime's prefill,
//!   decode and verify cost curve;
//! * [`accept`] (`specmesh accept`): the drafters' acceptance (τ), replayed
//!   offline against recorded greedy outputs;
//! * [`bench_draft`] (`specmesh bench-draft`): drafting and verification
//!   cost per call.
//!
//! Each has its `clap` [`Args`](bench::Args) and a `run` function. Reading
//! Spec-Bench question files is [`specbench`]. What the benchmarks run the
//! product with is the product's own, not theirs: the model flags, the mesh
//! launcher and its flags, the gRPC client and the delay link are
//! `specmesh-harness`'s (shared with `specmesh up` and `generate`), plain
//! decoding is `specmesh-engine`'s. Between the benchmarks: tables
//! (`table`), percentiles (`percentile`) and plots (`svg`).

#![forbid(unsafe_code)]

pub mod accept;
mod agentic;
pub mod bench;
pub mod bench_draft;
pub mod bench_model;
mod client;
mod conversation;
mod drafters;
mod llama_cpp;
mod percentile;
pub mod serve;
pub mod specbench;
mod svg;
mod table;
