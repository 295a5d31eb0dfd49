//! Little-endian encoder/decoder used by every message the transport puts on the wire
//! (connect handle, handshake messages). Decoding never panics: every read is bounds-checked
//! and reports what was being read.

/// A decoding failure; the message says what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("truncated: needed {needed} more bytes for {what}")]
    Truncated { what: &'static str, needed: usize },
    #[error("bad magic {found:#x} (expected {expected:#x}): not an nccl-net-ha message")]
    BadMagic { found: u32, expected: u32 },
    #[error("the peer speaks protocol version {got}, this plugin {ours}: every rank must load the same plugin build")]
    BadVersion { got: u16, ours: u16 },
    #[error("invalid {what}: {value}")]
    BadValue { what: &'static str, value: u64 },
    #[error("checksum mismatch: corrupted or truncated")]
    BadChecksum,
    #[error("{0} trailing bytes after the message")]
    Trailing(usize),
}

/// Appends little-endian fields to a byte vector.
#[derive(Default)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A byte string with a u8 length prefix (at most 255 bytes).
    pub fn bytes8(&mut self, v: &[u8]) -> &mut Self {
        assert!(v.len() <= u8::MAX as usize, "bytes8 field over 255 bytes");
        self.u8(v.len() as u8);
        self.buf.extend_from_slice(v);
        self
    }
    pub fn raw(&mut self, v: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(v);
        self
    }
    pub fn len(&self) -> usize {
        self.buf.len()
    }
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
    pub fn as_slice(&self) -> &[u8] {
        &self.buf
    }
    pub fn into_vec(self) -> Vec<u8> {
        self.buf
    }
}

/// Reads little-endian fields from a byte slice.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], WireError> {
        let left = self.buf.len() - self.pos;
        if left < n {
            return Err(WireError::Truncated {
                what,
                needed: n - left,
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    pub fn u8(&mut self, what: &'static str) -> Result<u8, WireError> {
        Ok(self.take(1, what)?[0])
    }
    pub fn u16(&mut self, what: &'static str) -> Result<u16, WireError> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    pub fn u32(&mut self, what: &'static str) -> Result<u32, WireError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }
    pub fn u64(&mut self, what: &'static str) -> Result<u64, WireError> {
        let b = self.take(8, what)?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }
    pub fn bytes8(&mut self, what: &'static str) -> Result<&'a [u8], WireError> {
        let n = self.u8(what)? as usize;
        self.take(n, what)
    }
    pub fn raw(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], WireError> {
        self.take(n, what)
    }
    pub fn position(&self) -> usize {
        self.pos
    }
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    /// Fails when bytes are left over.
    pub fn finish(self) -> Result<(), WireError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(WireError::Trailing(n)),
        }
    }
}

/// FNV-1a 32-bit: a cheap integrity check for fixed-size handles (not a security measure).
pub fn fnv1a32(data: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &b in data {
        h ^= b as u32;
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_fields() {
        let mut w = Writer::new();
        w.u8(1)
            .u16(0x0203)
            .u32(0x0405_0607)
            .u64(u64::MAX)
            .bytes8(b"abc");
        let v = w.into_vec();
        let mut r = Reader::new(&v);
        assert_eq!(r.u8("a").unwrap(), 1);
        assert_eq!(r.u16("b").unwrap(), 0x0203);
        assert_eq!(r.u32("c").unwrap(), 0x0405_0607);
        assert_eq!(r.u64("d").unwrap(), u64::MAX);
        assert_eq!(r.bytes8("e").unwrap(), b"abc");
        r.finish().unwrap();
    }

    #[test]
    fn truncation_is_reported_with_field() {
        let v = [1u8, 2, 3];
        let mut r = Reader::new(&v);
        assert_eq!(
            r.u32("token"),
            Err(WireError::Truncated {
                what: "token",
                needed: 1
            })
        );
        let mut r = Reader::new(&[5u8, 1, 2]);
        assert!(matches!(
            r.bytes8("endpoint"),
            Err(WireError::Truncated {
                what: "endpoint",
                ..
            })
        ));
    }

    #[test]
    fn trailing_bytes_rejected() {
        let v = [0u8; 3];
        let mut r = Reader::new(&v);
        r.u16("x").unwrap();
        assert_eq!(r.finish(), Err(WireError::Trailing(1)));
    }
}
