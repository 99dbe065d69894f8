//! Run-time choice of the instruction set for the integer dot products.

use std::fmt;

/// The instruction set a kernel runs on.
///
/// Binaries are built for x86-64-v3 (AVX2 + FMA); the VNNI variants are only
/// entered after [`Isa::supported`] confirmed the CPU has them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable Rust; the reference and the fallback on non-x86 hosts.
    Scalar,
    /// `vpmaddubsw` + `vpmaddwd` (Haswell and later).
    Avx2,
    /// 256-bit `vpdpbusd` from AVX-VNNI (Alder Lake, Sapphire Rapids, Zen 5).
    AvxVnni,
    /// 256-bit `vpdpbusd` from AVX-512 VNNI + VL (Cascade Lake, Ice Lake, Zen 4).
    Avx512Vnni,
    /// AVX-512 VNNI, plus AMX-INT8 tile kernels for the (format, rows per
    /// call) where a measurement at first use found them faster
    /// ([`crate::tile_plan()`]); Sapphire Rapids and later. Bit-identical to
    /// `Avx512Vnni`.
    AmxInt8,
}

impl Isa {
    pub const ALL: [Isa; 5] = [
        Isa::Scalar,
        Isa::Avx2,
        Isa::AvxVnni,
        Isa::Avx512Vnni,
        Isa::AmxInt8,
    ];

    /// The fastest instruction set this CPU supports.
    pub fn detect() -> Isa {
        [Isa::AmxInt8, Isa::Avx512Vnni, Isa::AvxVnni, Isa::Avx2]
            .into_iter()
            .find(|isa| isa.supported())
            .unwrap_or(Isa::Scalar)
    }

    /// Whether this CPU can run kernels for `self`.
    pub fn supported(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
            match self {
                Isa::Scalar => true,
                Isa::Avx2 => avx2,
                Isa::AvxVnni => avx2 && is_x86_feature_detected!("avxvnni"),
                Isa::Avx512Vnni => {
                    avx2 && is_x86_feature_detected!("avx512vnni")
                        && is_x86_feature_detected!("avx512vl")
                }
                Isa::AmxInt8 => Isa::Avx512Vnni.supported() && amx_available(),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Isa::Scalar
        }
    }

    /// Parses a name as printed by `Display` (`scalar`, `avx2`, `avx-vnni`, `avx512-vnni`).
    pub fn from_name(name: &str) -> Option<Isa> {
        Isa::ALL.into_iter().find(|isa| isa.to_string() == name)
    }
}

/// A name [`Isa::from_name`] does not know; the message lists the names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown instruction set `{0}`: use scalar, avx2, avx-vnni, avx512-vnni or amx-int8")]
pub struct UnknownIsa(pub String);

impl std::str::FromStr for Isa {
    type Err = UnknownIsa;

    fn from_str(s: &str) -> Result<Isa, UnknownIsa> {
        Isa::from_name(s).ok_or_else(|| UnknownIsa(s.to_string()))
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::AvxVnni => "avx-vnni",
            Isa::Avx512Vnni => "avx512-vnni",
            Isa::AmxInt8 => "amx-int8",
        })
    }
}

/// Whether this CPU has AMX-INT8 and the OS lets this process use it.
///
/// Linux keeps the 8 KiB tile state off until a process asks for it
/// (`ARCH_REQ_XCOMP_PERM`); the request is process-wide, so it is made once.
#[cfg(target_arch = "x86_64")]
fn amx_available() -> bool {
    use std::arch::x86_64::__cpuid_count;
    use std::sync::OnceLock;

    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        let leaf7 = __cpuid_count(7, 0);
        let (tile, int8) = (leaf7.edx >> 24 & 1 == 1, leaf7.edx >> 25 & 1 == 1);
        let avx512 = is_x86_feature_detected!("avx512vnni")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl");
        tile && int8 && avx512 && request_tile_data()
    })
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tile_data() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a plain syscall with integer arguments; on kernels without AMX
    // support it fails and we keep the VNNI kernels.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(all(target_arch = "x86_64", not(target_os = "linux")))]
fn request_tile_data() -> bool {
    false
}
