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
//! Spec-Bench question files is [`specbench`]. The helpers the benchmarks
//! share with `specmesh`'s user commands live here once, and the binary uses
//! them from here: the model flags and loading ([`local`]), prompt encoding
//! and plain decoding ([`generation`]), dialing the gateway ([`grpc`]), and
//! starting the services on loopback ([`launch`], the crate's only unsafe
//! code) and the drafters as a separate host behind a delay ([`link`]). Between the benchmarks: tables (`table`), percentiles
//! (`percentile`) and plots (`svg`).

#![deny(unsafe_code)]

pub mod accept;
pub mod bench;
pub mod bench_draft;
pub mod bench_model;
mod drafters;
pub mod generation;
pub mod grpc;
#[allow(unsafe_code)]
pub mod launch;
pub mod link;
mod llama_cpp;
pub mod local;
mod percentile;
pub mod serve;
pub mod specbench;
mod svg;
mod table;
