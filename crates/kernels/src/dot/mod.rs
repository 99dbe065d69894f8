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
/// Weight rows handled per tile at most.
pub(crate) const WROWS: usize = 4;

/// Results of one tile: `out[j][i]` for weight row j and activation row i.
pub(crate) type Out = [[f32; TILE]; WROWS];

/// Weight rows per tile for `t` activation rows: enough independent FMA
/// chains to hide their latency without spilling registers.
pub(crate) fn wrows_for(t: usize) -> usize {
    if t <= 2 { 4 } else { 2 }
}

/// `out[j][i] = w_j · acts.row(r0 + i)` for `j < r`, `i < t`, where `w_j`
/// is the `rb`-byte row starting at `w[j * rb]` and `(r, t)` is `(1, 1..=4)`
/// or `(wrows_for(t), t)`.
///
/// # Safety
/// `w` must hold `r` rows of exactly `acts.cols()` elements in the tile's
/// format, rows `r0..r0 + t` must exist, and the CPU must support the ISA.
pub(crate) type TileFn = unsafe fn(
    w: &[u8],
    rb: usize,
    r: usize,
    acts: &QuantizedRows,
    r0: usize,
    t: usize,
    out: &mut Out,
);

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
