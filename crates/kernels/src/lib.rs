//! Compute kernels for the specmesh model runtime: quantized weight formats,
//! activation quantization, matrix multiplication over many rows at once, and
//! the small vector ops of a transformer layer.
//!
//! Two properties drive every kernel here:
//!
//! * **Batch invariance.** The result for one activation row is computed by the
//!   same sequence of floating-point operations whatever other rows share the
//!   call, however rows are tiled and however output columns are split across
//!   threads. Greedy speculative decoding is then bit-identical to plain
//!   decoding, because a token's logits do not depend on the tree around it.
//! * **Weights are read once per call.** A 1-token decode step is bound by
//!   memory bandwidth (the weights), so the kernels load each weight block once
//!   and dot it with every activation row of the call while it sits in L1.
//!   Verifying k draft tokens then costs far less than k single-token steps.
//!
//! The instruction set is chosen once at run time ([`Isa::detect`]): AVX-512
//! VNNI or AVX-VNNI `vpdpbusd`, else AVX2 `vpmaddubsw`, else portable scalar
//! code; where AMX-INT8 runs ([`Isa::AmxInt8`]), tile kernels take the
//! calls a measurement at first use found them faster for ([`tile_plan()`]).
//! All integer paths
//! produce identical integer dot products; only the
//! float accumulation order differs between ISAs (never between calls).
//! Attention's loops follow the same choice ([`attn::AttnKernel::select`]):
//! `Isa::Scalar` runs them in portable Rust too.

mod act;
pub mod attn;
mod format;
pub mod half16;
mod isa;
mod matmul;
pub mod membw;
mod packed;
mod threads;
mod tile_plan;
#[cfg(target_arch = "x86_64")]
mod tiles;
pub mod vec;
mod width_plan;

pub use act::{BlockQ8, BlockQ8K, QuantizedRows};
pub use format::{BLOCK, QFormat, SUPER_BLOCK, WeightLayoutError};
pub use isa::{Isa, UnknownIsa};
pub use matmul::{QMatrix, Weights};
pub use threads::ThreadPool;
pub use tile_plan::{FormatPlan, RowSet, TilePlan, tile_plan};
pub use width_plan::{WidthFormat, WidthPlan, width_plan};
