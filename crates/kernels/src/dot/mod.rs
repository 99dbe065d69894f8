//! Integer dot products of one quantized weight row with up to [`TILE`]
//! quantized activation rows.
//!
//! A tile function loads each weight block once and applies it to every row
//! of the tile. The arithmetic for a row is the same whatever the tile size,
//! so a row's result does not depend on how the caller grouped rows.

use crate::act::QuantizedRows;
use crate::format::QFormat;
use crate::isa::Isa;

mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;

/// Activation rows handled per weight-block load.
pub(crate) const TILE: usize = 4;

/// `out[i] = w · acts.row(r0 + i)` for `i < t` (`1 <= t <= TILE`).
///
/// # Safety
/// `w` must hold exactly `acts.cols()` elements in the tile's format, rows
/// `r0..r0 + t` must exist, and the CPU must support the tile's ISA.
pub(crate) type TileFn =
    unsafe fn(w: &[u8], acts: &QuantizedRows, r0: usize, t: usize, out: &mut [f32; TILE]);

/// The tile function for `fmt` on `isa`. The caller guarantees `isa.supported()`.
pub(crate) fn tile_fn(isa: Isa, fmt: QFormat) -> TileFn {
    match isa {
        Isa::Scalar => scalar::tile_fn(fmt),
        #[cfg(target_arch = "x86_64")]
        _ => x86::tile_fn(isa, fmt),
        #[cfg(not(target_arch = "x86_64"))]
        _ => scalar::tile_fn(fmt),
    }
}
