//! Message content and its verification. A message is keyed by the run's seed, its sequence
//! number and its size:
//! - size >= 8: an 8-byte header (`seq` as `u32` LE, then a 32-bit check of run, seq and
//!   size), then the body, pattern `body_seed(run, seq, size)` from its byte 0;
//! - size < 8: the first `size` bytes of that pattern.
//!
//! The receiver poisons each receive slot (the posted size plus [`GUARD`] bytes) with the
//! bitwise complement of what the expected message puts at each byte, so every byte the
//! plugin fails to write differs from the expected value, and any write past the message is
//! seen. A slot that does not hold its expected message is identified by its header when it
//! holds another intact message of the stream (duplicate, reorder), else it is corrupt.

use crate::pattern;

/// Bytes after each receive slot that must stay untouched.
pub const GUARD: usize = 64;
/// Header length (messages shorter than this have none).
pub const HEADER: usize = 8;

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Pattern seed of the body of message `seq` of `size` bytes in run `run`.
pub fn body_seed(run: u64, seq: u64, size: usize) -> u64 {
    pattern::seed(
        run ^ 0x5354_5245_414D,
        size,
        (seq & 0xFFFF_FFFF) as u32,
        0x51,
    )
}

/// The 8-byte header of a message of at least `HEADER` bytes.
pub fn header(run: u64, seq: u64, size: usize) -> [u8; HEADER] {
    let seq32 = (seq & 0xFFFF_FFFF) as u32;
    let mut h = [0u8; HEADER];
    h[..4].copy_from_slice(&seq32.to_le_bytes());
    h[4..].copy_from_slice(&check(run, seq32, size).to_le_bytes());
    h
}

fn check(run: u64, seq32: u32, size: usize) -> u32 {
    (mix(mix(run ^ 0xC0FF_EE00) ^ ((u64::from(seq32) << 32) | (size as u64 & 0xFFFF_FFFF))) >> 16)
        as u32
}

/// The sequence number in `h`, if it is a valid header of a `size`-byte message of `run`.
pub fn decode_header(run: u64, h: &[u8], size: usize) -> Option<u64> {
    let seq32 = u32::from_le_bytes(h.get(..4)?.try_into().ok()?);
    let c = u32::from_le_bytes(h.get(4..8)?.try_into().ok()?);
    (c == check(run, seq32, size)).then_some(u64::from(seq32))
}

/// Writes message `seq` into `buf` (its whole length is the message).
pub fn fill(buf: &mut [u8], run: u64, seq: u64) {
    let size = buf.len();
    let seed = body_seed(run, seq, size);
    if size < HEADER {
        pattern::fill(buf, seed);
    } else {
        buf[..HEADER].copy_from_slice(&header(run, seq, size));
        pattern::fill(&mut buf[HEADER..], seed);
    }
}

/// Poisons a receive slot for message `seq` of `size` bytes: `slot` is `size + GUARD` long.
pub fn poison(slot: &mut [u8], run: u64, seq: u64, size: usize) {
    let seed = body_seed(run, seq, size);
    if size < HEADER {
        pattern::fill_poison(slot, seed);
    } else {
        let h = header(run, seq, size);
        for (d, s) in slot[..HEADER].iter_mut().zip(h) {
            *d = !s;
        }
        pattern::fill_poison(&mut slot[HEADER..], seed);
    }
}

/// Checks that bytes `from..` of a slot poisoned for (`seq`, `size`) are still poison.
fn untouched(slot: &[u8], run: u64, seq: u64, size: usize, from: usize) -> Result<(), String> {
    let seed = body_seed(run, seq, size);
    let bad = |m: pattern::Mismatch, base: usize| {
        Err(format!(
            "byte {} is 0x{:02x}, expected untouched 0x{:02x}",
            m.offset + base,
            m.got,
            m.expected
        ))
    };
    if size < HEADER {
        return match pattern::verify_poison_from(&slot[from..], seed, from) {
            Ok(()) => Ok(()),
            Err(m) => bad(m, from),
        };
    }
    if from < HEADER {
        let h = header(run, seq, size);
        for (i, &b) in slot.iter().enumerate().take(HEADER).skip(from) {
            if b != !h[i] {
                return Err(format!(
                    "byte {i} is 0x{b:02x}, expected untouched 0x{:02x}",
                    !h[i]
                ));
            }
        }
    }
    let from = from.max(HEADER);
    match pattern::verify_poison_from(&slot[from..], seed, from - HEADER) {
        Ok(()) => Ok(()),
        Err(m) => bad(m, from),
    }
}

/// Whether `data` is exactly message `seq` of `run` (its length is the message size).
fn is_message(data: &[u8], run: u64, seq: u64) -> Result<(), String> {
    let size = data.len();
    let seed = body_seed(run, seq, size);
    if size < HEADER {
        return pattern::verify(data, seed).map_err(|m| m.to_string());
    }
    let h = header(run, seq, size);
    if let Some(i) = (0..HEADER).find(|&i| data[i] != h[i]) {
        return Err(format!(
            "byte {i} is 0x{:02x}, expected 0x{:02x} (header)",
            data[i], h[i]
        ));
    }
    pattern::verify(&data[HEADER..], seed).map_err(|m| {
        pattern::Mismatch {
            offset: m.offset + HEADER,
            ..m
        }
        .to_string()
    })
}

/// What a completed receive slot held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// Message `seq`, intact (its own or another slot's message).
    Message(u64),
    /// Nothing recognisable: wrong size, wrong bytes, or bytes written past the message.
    Corrupt(String),
}

/// Identifies what a slot posted for message `seq` (`size` bytes; `slot` is `size + GUARD`
/// bytes, poisoned by [`poison`]) holds after `test()` reported `reported` bytes.
pub fn identify(slot: &[u8], reported: i32, run: u64, seq: u64, size: usize) -> Identity {
    let r = match usize::try_from(reported) {
        Ok(r) if r <= size => r,
        _ => {
            return Identity::Corrupt(format!(
                "test() reported size {reported} for a {size}-byte receive"
            ))
        }
    };
    if let Err(why) = untouched(slot, run, seq, size, r) {
        return Identity::Corrupt(format!("wrote past the {r}-byte message: {why}"));
    }
    let data = &slot[..r];
    let own = if r == size {
        is_message(data, run, seq)
    } else {
        Err(format!("test() reported size {r}, expected {size}"))
    };
    match own {
        Ok(()) => Identity::Message(seq),
        Err(why) => {
            // Another message of the stream, intact?
            if r >= HEADER {
                if let Some(other) = decode_header(run, data, r) {
                    if other != seq && is_message(data, run, other).is_ok() {
                        return Identity::Message(other);
                    }
                }
            }
            Identity::Corrupt(why)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUN: u64 = 99;

    /// A slot for (`seq`, `size`), poisoned, with message `(msg_seq, msg_size)` delivered.
    fn delivered(seq: u64, size: usize, msg_seq: u64, msg_size: usize) -> Vec<u8> {
        let mut slot = vec![0u8; size + GUARD];
        poison(&mut slot, RUN, seq, size);
        fill(&mut slot[..msg_size], RUN, msg_seq);
        slot
    }

    #[test]
    fn intact_messages_are_recognised_at_every_size() {
        for size in [0, 1, 7, 8, 9, 15, 16, 100, 4096] {
            let slot = delivered(5, size, 5, size);
            assert_eq!(
                identify(&slot, size as i32, RUN, 5, size),
                Identity::Message(5),
                "size {size}"
            );
        }
    }

    #[test]
    fn poison_differs_from_the_message_in_every_byte() {
        for size in [0, 3, 8, 200] {
            let mut msg = vec![0u8; size];
            fill(&mut msg, RUN, 7);
            let mut slot = vec![0u8; size + GUARD];
            poison(&mut slot, RUN, 7, size);
            assert!(msg.iter().zip(&slot).all(|(a, b)| a != b), "size {size}");
        }
    }

    #[test]
    fn unwritten_or_flipped_bytes_are_corrupt() {
        for size in [1, 7, 8, 9, 300] {
            // Nothing written at all.
            let mut slot = vec![0u8; size + GUARD];
            poison(&mut slot, RUN, 3, size);
            assert!(matches!(
                identify(&slot, size as i32, RUN, 3, size),
                Identity::Corrupt(_)
            ));
            // One byte flipped, anywhere in the message.
            for at in [0, size / 2, size - 1] {
                let mut s = delivered(3, size, 3, size);
                s[at] ^= 0x20;
                match identify(&s, size as i32, RUN, 3, size) {
                    Identity::Corrupt(why) => {
                        assert!(why.contains(&format!("byte {at} ")), "{why}")
                    }
                    other => panic!("size {size} at {at}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn writes_past_the_message_are_corrupt() {
        let mut s = delivered(4, 100, 4, 100);
        s[100 + GUARD - 1] ^= 1;
        match identify(&s, 100, RUN, 4, 100) {
            Identity::Corrupt(why) => {
                assert!(
                    why.starts_with("wrote past the 100-byte message: byte 163"),
                    "{why}"
                )
            }
            other => panic!("{other:?}"),
        }
        // A short report over a full write: the bytes after the report are not poison.
        let s = delivered(4, 100, 4, 100);
        assert!(matches!(
            identify(&s, 50, RUN, 4, 100),
            Identity::Corrupt(_)
        ));
    }

    #[test]
    fn wrong_sizes_are_corrupt() {
        let s = delivered(4, 100, 4, 100);
        for r in [-1, 101, i32::MAX] {
            match identify(&s, r, RUN, 4, 100) {
                Identity::Corrupt(why) => assert!(why.contains("reported size"), "{why}"),
                other => panic!("{other:?}"),
            }
        }
        // An empty message reported for a non-empty slot.
        let mut slot = vec![0u8; 10 + GUARD];
        poison(&mut slot, RUN, 2, 10);
        assert!(matches!(
            identify(&slot, 0, RUN, 2, 10),
            Identity::Corrupt(_)
        ));
    }

    #[test]
    fn another_intact_message_is_identified_by_its_header() {
        // Message 6 (80 bytes) landed in the slot posted for message 9 (100 bytes).
        let s = delivered(9, 100, 6, 80);
        assert_eq!(identify(&s, 80, RUN, 9, 100), Identity::Message(6));
        // Same size, different sequence number.
        let s = delivered(9, 100, 8, 100);
        assert_eq!(identify(&s, 100, RUN, 9, 100), Identity::Message(8));
        // ... but not if a byte of it is wrong, nor from another run.
        let mut s = delivered(9, 100, 8, 100);
        s[50] ^= 1;
        assert!(matches!(
            identify(&s, 100, RUN, 9, 100),
            Identity::Corrupt(_)
        ));
        let mut s = vec![0u8; 100 + GUARD];
        poison(&mut s, RUN, 9, 100);
        fill(&mut s[..100], RUN + 1, 8);
        assert!(matches!(
            identify(&s, 100, RUN, 9, 100),
            Identity::Corrupt(_)
        ));
    }

    #[test]
    fn headers_round_trip_and_reject_garbage() {
        let h = header(RUN, 123_456, 4096);
        assert_eq!(decode_header(RUN, &h, 4096), Some(123_456));
        assert_eq!(decode_header(RUN, &h, 4095), None);
        assert_eq!(decode_header(RUN + 1, &h, 4096), None);
        assert_eq!(decode_header(RUN, &[0u8; 8], 4096), None);
        assert_eq!(decode_header(RUN, &h[..7], 4096), None);
    }
}
