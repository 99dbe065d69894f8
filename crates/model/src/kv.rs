//! The element type of the KV cache and one layer's K or V plane in it.
//!
//! f16 halves what a session's context holds in memory and what attention
//! reads per step, which at long contexts is a large share of a step; f32
//! keeps the activations' own values. Either way every reader of a slot
//! sees the same floats (f16 is rounded once, when the slot is written,
//! and widened exactly when read), so a token's logits still do not depend
//! on whether it was committed earlier or staged in the current tree.

use specmesh_kernels::half16;

/// What the KV cache stores K and V as. f32 is the default: on the CPUs
/// measured so far attention is bound by arithmetic, not by reading the
/// cache, so f16's widening costs about what its halved reads save
/// (docs/lab/kernels.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvDtype {
    /// IEEE half precision: 2 bytes per element, rounded to nearest even
    /// when written (llama.cpp's default, `--cache-type-k f16`).
    F16,
    /// The activations' own f32 values: 4 bytes per element.
    #[default]
    F32,
}

impl KvDtype {
    pub const ALL: [KvDtype; 2] = [KvDtype::F16, KvDtype::F32];

    /// Bytes per stored element.
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F16 => 2,
            KvDtype::F32 => 4,
        }
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KvDtype::F16 => "f16",
            KvDtype::F32 => "f32",
        })
    }
}

/// A KV element type name that is not one of [`KvDtype::ALL`].
#[derive(Debug, thiserror::Error)]
#[error("unknown KV cache type `{0}`: expected f16 or f32")]
pub struct UnknownKvDtype(String);

impl std::str::FromStr for KvDtype {
    type Err = UnknownKvDtype;

    fn from_str(s: &str) -> Result<KvDtype, UnknownKvDtype> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Ok(KvDtype::F16),
            "f32" => Ok(KvDtype::F32),
            _ => Err(UnknownKvDtype(s.to_string())),
        }
    }
}

/// One layer's K (or V) of a sequence, slot-major (`slot × kv_dim`).
#[derive(Clone, Debug)]
pub(crate) enum Plane {
    F16(Vec<u16>),
    F32(Vec<f32>),
}

/// A read-only view of a [`Plane`].
#[derive(Clone, Copy)]
pub(crate) enum PlaneRef<'a> {
    F16(&'a [u16]),
    F32(&'a [f32]),
}

impl Plane {
    pub(crate) fn new(dtype: KvDtype) -> Plane {
        match dtype {
            KvDtype::F16 => Plane::F16(Vec::new()),
            KvDtype::F32 => Plane::F32(Vec::new()),
        }
    }

    /// Grows (or shrinks) to `elements`, new ones zero.
    pub(crate) fn resize(&mut self, elements: usize) {
        match self {
            Plane::F16(v) => v.resize(elements, 0),
            Plane::F32(v) => v.resize(elements, 0.0),
        }
    }

    /// Stores `row` at element `at`, rounded to the plane's type.
    pub(crate) fn write(&mut self, at: usize, row: &[f32]) {
        match self {
            Plane::F16(v) => half16::narrow(row, &mut v[at..at + row.len()]),
            Plane::F32(v) => v[at..at + row.len()].copy_from_slice(row),
        }
    }

    pub(crate) fn copy_within(&mut self, src: std::ops::Range<usize>, dst: usize) {
        match self {
            Plane::F16(v) => v.copy_within(src, dst),
            Plane::F32(v) => v.copy_within(src, dst),
        }
    }

    /// Appends elements `range` to `out` in native byte order.
    pub(crate) fn export(&self, range: std::ops::Range<usize>, out: &mut Vec<u8>) {
        match self {
            Plane::F16(v) => out.extend(v[range].iter().flat_map(|x| x.to_ne_bytes())),
            Plane::F32(v) => out.extend(v[range].iter().flat_map(|x| x.to_ne_bytes())),
        }
    }

    /// Overwrites the elements from `at` with `bytes` as [`Plane::export`]
    /// wrote them (a whole number of elements).
    pub(crate) fn import(&mut self, at: usize, bytes: &[u8]) {
        match self {
            Plane::F16(v) => {
                for (d, b) in v[at..].iter_mut().zip(bytes.chunks_exact(2)) {
                    *d = u16::from_ne_bytes([b[0], b[1]]);
                }
            }
            Plane::F32(v) => {
                for (d, b) in v[at..].iter_mut().zip(bytes.chunks_exact(4)) {
                    *d = f32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
        }
    }

    pub(crate) fn view(&self) -> PlaneRef<'_> {
        match self {
            Plane::F16(v) => PlaneRef::F16(v),
            Plane::F32(v) => PlaneRef::F32(v),
        }
    }
}
