//! The hello that opens every `sock` stream: which queue pair (and which of its lanes) the
//! requester wants; the listener hands the stream over only on a match.

use super::wire::{u32_at, u64_at, WireError, MAX_LANES};

/// Bytes of the stream hello.
pub const HELLO_LEN: usize = 24;
/// First 8 bytes of every main stream ("HASOCK1\0").
pub const HELLO_MAGIC: u64 = u64::from_le_bytes(*b"HASOCK1\0");
/// First 7 bytes of a lane's stream; the 8th is the lane's index (1 ..= MAX_LANES - 1).
pub const LANE_MAGIC: &[u8; 7] = b"HASOCKL";

/// First bytes a requester sends on a new stream: which queue pair it wants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    pub target_qpn: u32,
    pub source_qpn: u32,
    pub target_nonce: u64,
    /// 0 = the main stream; 1 .. MAX_LANES = one of its lanes.
    pub lane: u8,
}

impl Hello {
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        if self.lane == 0 {
            b[0..8].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
        } else {
            b[0..7].copy_from_slice(LANE_MAGIC);
            b[7] = self.lane;
        }
        b[8..12].copy_from_slice(&self.target_qpn.to_le_bytes());
        b[12..16].copy_from_slice(&self.source_qpn.to_le_bytes());
        b[16..24].copy_from_slice(&self.target_nonce.to_le_bytes());
        b
    }

    /// Whether `prefix`, the first bytes read of a stream, can still be a hello (a main
    /// stream's or a lane's): the listener drops a stream as soon as this is false.
    pub fn may_start(prefix: &[u8]) -> bool {
        let m = prefix.len().min(8);
        if prefix[..m] == HELLO_MAGIC.to_le_bytes()[..m] {
            return true;
        }
        let l = prefix.len().min(7);
        prefix[..l] == LANE_MAGIC[..l]
            && (prefix.len() < 8 || (prefix[7] >= 1 && u16::from(prefix[7]) < MAX_LANES))
    }

    pub fn decode(b: &[u8]) -> Result<Hello, WireError> {
        if b.len() < HELLO_LEN {
            return Err(WireError::Short {
                got: b.len(),
                need: HELLO_LEN,
            });
        }
        let magic = u64_at(b, 0);
        let lane = if magic == HELLO_MAGIC {
            0
        } else if &b[0..7] == LANE_MAGIC && b[7] >= 1 && u16::from(b[7]) < MAX_LANES {
            b[7]
        } else {
            return Err(WireError::BadMagic(magic));
        };
        Ok(Hello {
            target_qpn: u32_at(b, 8),
            source_qpn: u32_at(b, 12),
            target_nonce: u64_at(b, 16),
            lane,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(h) = Hello::decode(&bytes) {
                prop_assert_eq!(&h.encode()[..], &bytes[..HELLO_LEN]);
            }
        }
    }

    /// Finding: the listener checked every partial read against the main stream's magic only,
    /// so a lane hello split after its 7th byte was dropped (and its queue pair failed).
    #[test]
    fn every_prefix_of_a_hello_may_start_one_and_strangers_do_not() {
        for lane in [0u8, 1, 7] {
            let h = Hello {
                target_qpn: 3,
                source_qpn: 4,
                target_nonce: 5,
                lane,
            };
            let b = h.encode();
            for n in 1..=HELLO_LEN {
                assert!(
                    Hello::may_start(&b[..n]),
                    "lane {lane}: prefix of {n} bytes"
                );
            }
        }
        assert!(!Hello::may_start(b"GET / HT"));
        assert!(!Hello::may_start(b"HASOCK2"));
        // A lane index out of range is refused as soon as it arrives.
        assert!(!Hello::may_start(b"HASOCKL\0"));
        assert!(!Hello::may_start(b"HASOCKL\x08"));
    }

    #[test]
    fn hello_roundtrip_and_magic() {
        let h = Hello {
            target_qpn: 3,
            source_qpn: 9,
            target_nonce: 0x0102_0304_0506_0708,
            lane: 0,
        };
        assert_eq!(Hello::decode(&h.encode()), Ok(h));
        let mut b = h.encode();
        b[0] ^= 1;
        assert!(matches!(Hello::decode(&b), Err(WireError::BadMagic(_))));
        // Lanes 1 ..= 7 have their own magic; lane 0 and 8 do not exist.
        for lane in 1..MAX_LANES as u8 {
            let l = Hello { lane, ..h };
            assert_eq!(&l.encode()[..7], LANE_MAGIC);
            assert_eq!(Hello::decode(&l.encode()), Ok(l));
        }
        let mut b = Hello { lane: 1, ..h }.encode();
        for bad in [0, MAX_LANES as u8] {
            b[7] = bad;
            assert!(
                matches!(Hello::decode(&b), Err(WireError::BadMagic(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            Hello::decode(&b[..5]),
            Err(WireError::Short { .. })
        ));
    }
}
