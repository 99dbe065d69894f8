//! IEEE half precision (f16) for the KV cache: rounding f32 rows to f16
//! bits when K and V are stored, and widening them back to f32 when
//! attention reads them.
//!
//! Widening is exact, so attention over widened rows runs the f32 kernels
//! unchanged and stays batch-invariant: every reader of a slot sees the
//! same floats. Rounding is IEEE round-to-nearest-even on every path (the
//! F16C instructions with `_MM_FROUND_TO_NEAREST_INT`, else the `half`
//! crate), so the stored bits do not depend on the build either. x86-64-v3
//! builds (the default, `.cargo/config.toml`) have F16C at compile time;
//! eight lanes per instruction already convert a 16 KiB attention chunk in
//! well under a microsecond, so no 512-bit variant is dispatched.

/// Rounds `src` to f16 bits in `dst` (equal lengths).
pub fn narrow(src: &[f32], dst: &mut [u16]) {
    assert_eq!(src.len(), dst.len(), "one f16 per f32");
    #[cfg(all(target_arch = "x86_64", target_feature = "f16c"))]
    {
        // SAFETY: the build enables F16C (and the AVX it implies); every
        // access is within the 8-lane chunks of equal-length slices.
        unsafe {
            use std::arch::x86_64::*;
            let mut s = src.chunks_exact(8);
            let mut d = dst.chunks_exact_mut(8);
            for (s, d) in (&mut s).zip(&mut d) {
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(s.as_ptr()));
                _mm_storeu_si128(d.as_mut_ptr().cast(), h);
            }
            narrow_portable(s.remainder(), d.into_remainder());
        }
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "f16c")))]
    narrow_portable(src, dst);
}

/// Widens f16 bits `src` to f32 in `dst` (equal lengths); exact.
#[inline]
pub fn widen(src: &[u16], dst: &mut [f32]) {
    widen_ahead(src, dst, 0);
}

/// [`widen`], asking for the source `ahead` bytes on as it goes (a hint:
/// the result is the same; 0 asks for nothing). Attention widens each
/// chunk of an f16 cache just before it uses it; asking for the next chunk
/// line by line while this one converts keeps a steady stream of reads in
/// flight.
pub fn widen_ahead(src: &[u16], dst: &mut [f32], ahead: usize) {
    assert_eq!(src.len(), dst.len(), "one f32 per f16");
    #[cfg(all(target_arch = "x86_64", target_feature = "f16c"))]
    {
        // SAFETY: as in `narrow`; a prefetch never faults, and its address
        // is formed with wrapping arithmetic (it may lie past `src`).
        unsafe {
            use std::arch::x86_64::*;
            // A cache line (32 halves) per step, four conversions of eight.
            let mut s = src.chunks_exact(32);
            let mut d = dst.chunks_exact_mut(32);
            for (s, d) in (&mut s).zip(&mut d) {
                if ahead > 0 {
                    let p = s.as_ptr().cast::<i8>().wrapping_add(ahead);
                    _mm_prefetch::<_MM_HINT_T0>(p);
                }
                for i in 0..4 {
                    let h = _mm_loadu_si128(s.as_ptr().add(8 * i).cast());
                    _mm256_storeu_ps(d.as_mut_ptr().add(8 * i), _mm256_cvtph_ps(h));
                }
            }
            let mut s8 = s.remainder().chunks_exact(8);
            let mut d8 = d.into_remainder().chunks_exact_mut(8);
            for (s, d) in (&mut s8).zip(&mut d8) {
                let f = _mm256_cvtph_ps(_mm_loadu_si128(s.as_ptr().cast()));
                _mm256_storeu_ps(d.as_mut_ptr(), f);
            }
            widen_portable(s8.remainder(), d8.into_remainder());
        }
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "f16c")))]
    {
        let _ = ahead;
        widen_portable(src, dst);
    }
}

/// The portable conversions the SIMD paths must match bit for bit.
pub fn narrow_portable(src: &[f32], dst: &mut [u16]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = half::f16::from_f32(s).to_bits();
    }
}

pub fn widen_portable(src: &[u16], dst: &mut [f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = half::f16::from_bits(s).to_f32();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Finite f32s around every f16 rounding boundary and range edge,
    /// plus subnormals, infinities and signed zeros.
    fn samples() -> Vec<f32> {
        let mut v = vec![
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            65504.0,
            65520.0,
            1e-8,
        ];
        let mut x = 0x1234_5678u32;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            // Exponents within f16's range and a little beyond it.
            let e = 100 + (x >> 24) % 60;
            v.push(f32::from_bits((x & 0x807f_ffff) | (e << 23)));
        }
        for h in (0..=u16::MAX).step_by(7) {
            let f = half::f16::from_bits(h).to_f32();
            if f.is_finite() {
                // Exactly halfway to the next f16 up: ties to even.
                v.push(f);
                v.push(f32::from_bits(f.to_bits() + 0x1000));
            }
        }
        v
    }

    #[test]
    fn narrowing_rounds_like_the_portable_path() {
        let src = samples();
        let (mut simd, mut portable) = (vec![0u16; src.len()], vec![0u16; src.len()]);
        narrow(&src, &mut simd);
        narrow_portable(&src, &mut portable);
        assert_eq!(simd, portable);
    }

    #[test]
    fn widening_is_exact_and_round_trips() {
        let bits: Vec<u16> = (0..=u16::MAX)
            .filter(|&h| !half::f16::from_bits(h).is_nan())
            .collect();
        let (mut simd, mut portable) = (vec![0f32; bits.len()], vec![0f32; bits.len()]);
        widen(&bits, &mut simd);
        widen_portable(&bits, &mut portable);
        assert_eq!(
            simd.iter().map(|f| f.to_bits()).collect::<Vec<_>>(),
            portable.iter().map(|f| f.to_bits()).collect::<Vec<_>>()
        );
        let mut back = vec![0u16; bits.len()];
        narrow(&simd, &mut back);
        assert_eq!(back, bits);
    }

    #[test]
    fn widening_ahead_gives_the_same_floats() {
        let bits: Vec<u16> = (0..=u16::MAX)
            .filter(|&h| !half::f16::from_bits(h).is_nan())
            .collect();
        // Whole lines, a remainder, and reads asked for past the end.
        for (len, ahead) in [(bits.len(), 8192), (1000, 0), (37, 1 << 20), (5, 64)] {
            let (mut a, mut w) = (vec![0f32; len], vec![0f32; len]);
            widen_ahead(&bits[..len], &mut a, ahead);
            widen_portable(&bits[..len], &mut w);
            assert_eq!(
                a.iter().map(|f| f.to_bits()).collect::<Vec<_>>(),
                w.iter().map(|f| f.to_bits()).collect::<Vec<_>>()
            );
        }
    }
}
