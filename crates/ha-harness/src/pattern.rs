//! Data patterns for verified transfers. Every message gets a pattern seeded by its stream
//! (case and direction), size, iteration and tag, so data that lands in the wrong buffer, is
//! stale from an earlier message or is shifted is caught. Receive buffers are pre-filled with
//! the bitwise complement of the expected pattern ("poison"), so every byte the plugin failed
//! to write is caught too, as is any write past the message end.
//!
//! Word `w` of a pattern is a bijective mix of `seed ^ w`, so no two words of one buffer are
//! equal and patterns with different seeds differ.

use std::fmt;

/// Seed for one message.
pub fn seed(stream: u64, size: usize, iter: u32, tag: i32) -> u64 {
    let mut h = 0x243F_6A88_85A3_08D3u64;
    for v in [stream, size as u64, u64::from(iter), u64::from(tag as u32)] {
        h = mix(h ^ v);
    }
    h
}

/// A bijective 64-bit mixer (splitmix64's finaliser).
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Word `w` of the pattern: cheap (the harness fills and checks up to 64 MiB per message,
/// also in debug builds) and injective in `w`.
fn word(seed: u64, w: u64) -> u64 {
    let z = (seed ^ w).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z ^ (z >> 29)
}

/// Byte `i` of the pattern `seed` (complemented if `poison`).
fn expected_byte(seed: u64, poison: bool, i: usize) -> u8 {
    let b = word(seed, (i / 8) as u64).to_le_bytes()[i % 8];
    if poison {
        !b
    } else {
        b
    }
}

fn fill_impl(buf: &mut [u8], seed: u64, poison: bool) {
    let flip = if poison { u64::MAX } else { 0 };
    for (w, chunk) in buf.chunks_exact_mut(8).enumerate() {
        chunk.copy_from_slice(&(word(seed, w as u64) ^ flip).to_le_bytes());
    }
    let done = buf.len() - buf.len() % 8;
    for (i, b) in buf.iter_mut().enumerate().skip(done) {
        *b = expected_byte(seed, poison, i);
    }
}

/// Compares `buf` with bytes `base..base + buf.len()` of the pattern (or its poison).
fn check_impl(buf: &[u8], seed: u64, poison: bool, base: usize) -> Result<(), Mismatch> {
    let flip = if poison { u64::MAX } else { 0 };
    let byte_check = |from: usize, to: usize| -> Result<(), Mismatch> {
        for (i, &got) in buf.iter().enumerate().take(to).skip(from) {
            let expected = expected_byte(seed, poison, base + i);
            if got != expected {
                return Err(Mismatch {
                    offset: i,
                    expected,
                    got,
                });
            }
        }
        Ok(())
    };
    // Unaligned head, then whole pattern words, then the tail.
    let head = ((8 - base % 8) % 8).min(buf.len());
    byte_check(0, head)?;
    let body = &buf[head..];
    let first_word = ((base + head) / 8) as u64;
    for (w, chunk) in body.chunks_exact(8).enumerate() {
        if chunk != (word(seed, first_word + w as u64) ^ flip).to_le_bytes() {
            let at = head + w * 8;
            return byte_check(at, at + 8);
        }
    }
    byte_check(head + body.len() - body.len() % 8, buf.len())
}

/// Writes the pattern `seed` into `buf` (byte `i` of the pattern at `buf[i]`).
pub fn fill(buf: &mut [u8], seed: u64) {
    fill_impl(buf, seed, false);
}

/// Writes the complement of pattern `seed`: every byte differs from what `fill` would write.
pub fn fill_poison(buf: &mut [u8], seed: u64) {
    fill_impl(buf, seed, true);
}

/// Checks that `buf` holds pattern `seed`; reports the first differing byte.
pub fn verify(buf: &[u8], seed: u64) -> Result<(), Mismatch> {
    check_impl(buf, seed, false, 0)
}

/// Checks that `buf` still holds the poison of `seed` (that nothing was written there).
pub fn verify_poison(buf: &[u8], seed: u64) -> Result<(), Mismatch> {
    check_impl(buf, seed, true, 0)
}

/// Like [`verify_poison`] for a part of a poisoned buffer that starts at byte `base` of it.
/// Offsets in the error are relative to `buf`.
pub fn verify_poison_from(buf: &[u8], seed: u64, base: usize) -> Result<(), Mismatch> {
    check_impl(buf, seed, true, base)
}

/// The first byte that differs from the expected pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch {
    pub offset: usize,
    pub expected: u8,
    pub got: u8,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "byte {} is 0x{:02x}, expected 0x{:02x}",
            self.offset, self.got, self.expected
        )
    }
}

/// A deterministic permutation of `0..n` derived from `seed` (Fisher-Yates).
pub fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    let mut state = mix(seed ^ 0x5851_F42D_4C95_7F2D);
    for i in (1..n).rev() {
        state = mix(state.wrapping_add(0x9E37_79B9_7F4A_7C15));
        let j = (state % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn fill_then_verify() {
        for len in [0, 1, 7, 8, 9, 4096, 4099] {
            let mut b = vec![0u8; len];
            let s = seed(1, len, 0, 0);
            fill(&mut b, s);
            assert_eq!(verify(&b, s), Ok(()), "len {len}");
            if len > 0 {
                assert_ne!(verify_poison(&b, s), Ok(()));
            }
        }
    }

    #[test]
    fn poison_differs_in_every_byte() {
        let s = seed(3, 100, 2, 5);
        let mut p = vec![0u8; 100];
        let mut q = vec![0u8; 100];
        fill(&mut p, s);
        fill_poison(&mut q, s);
        assert!(p.iter().zip(&q).all(|(a, b)| a != b));
        assert_eq!(verify_poison(&q, s), Ok(()));
    }

    #[test]
    fn reports_first_bad_byte() {
        let s = seed(0, 64, 0, 0);
        let mut b = vec![0u8; 64];
        fill(&mut b, s);
        b[13] ^= 0x40;
        b[40] ^= 1;
        let m = verify(&b, s).unwrap_err();
        assert_eq!(m.offset, 13);
        assert_eq!(m.got ^ m.expected, 0x40);
        assert!(m.to_string().starts_with("byte 13 is 0x"));
        // A bad byte in the tail after the last full word.
        let mut t = vec![0u8; 11];
        fill(&mut t, s);
        t[10] = !t[10];
        assert_eq!(verify(&t, s).unwrap_err().offset, 10);
    }

    #[test]
    fn seeds_separate_size_iteration_tag_and_stream() {
        let base = seed(1, 4096, 0, 0);
        for other in [
            seed(2, 4096, 0, 0),
            seed(1, 4097, 0, 0),
            seed(1, 4096, 1, 0),
            seed(1, 4096, 0, 1),
            seed(1, 4096, 0, -1),
        ] {
            assert_ne!(base, other);
            let mut b = vec![0u8; 64];
            fill(&mut b, other);
            assert!(verify(&b, base).is_err());
        }
    }

    #[test]
    fn shifted_data_is_caught() {
        let s = seed(9, 1024, 0, 0);
        let mut b = vec![0u8; 1100];
        fill(&mut b, s);
        for shift in [1, 4, 8, 64] {
            assert!(verify(&b[shift..shift + 1000], s).is_err(), "shift {shift}");
        }
    }

    #[test]
    fn shuffle_is_a_permutation_and_depends_on_seed() {
        for n in 0..10 {
            let mut p = shuffled(n, 77);
            p.sort_unstable();
            assert_eq!(p, (0..n).collect::<Vec<_>>());
        }
        let orders: std::collections::HashSet<Vec<usize>> =
            (0..20).map(|s| shuffled(8, s)).collect();
        assert!(orders.len() > 10, "only {} distinct orders", orders.len());
        assert_eq!(shuffled(8, 5), shuffled(8, 5));
    }

    #[test]
    fn poison_checked_from_any_offset() {
        let s = seed(4, 50, 0, 0);
        let mut b = vec![0u8; 50];
        fill_poison(&mut b, s);
        for base in 0..50 {
            assert_eq!(
                verify_poison_from(&b[base..], s, base),
                Ok(()),
                "base {base}"
            );
        }
        b[37] ^= 0x10;
        for base in 0..=37 {
            let m = verify_poison_from(&b[base..], s, base).unwrap_err();
            assert_eq!(m.offset, 37 - base);
        }
        assert_eq!(verify_poison_from(&b[38..], s, 38), Ok(()));
    }

    proptest! {
        #[test]
        fn any_single_corruption_is_found(len in 1usize..300, pos in 0usize..300, flip in 1u8..=255, s in any::<u64>()) {
            let pos = pos % len;
            let mut b = vec![0u8; len];
            fill(&mut b, s);
            b[pos] ^= flip;
            prop_assert_eq!(verify(&b, s).unwrap_err().offset, pos);
        }
    }
}
