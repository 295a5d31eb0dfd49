//! A cursor over fuzz input that never fails: reads past the end give zeros, so every
//! byte string drives a target somewhere.

/// Reads little-endian values from the fuzz input.
pub struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Input { data, pos: 0 }
    }
    /// Whether every byte was consumed.
    pub fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }
    /// The unread bytes.
    pub fn rest(&self) -> &'a [u8] {
        &self.data[self.pos.min(self.data.len())..]
    }
    /// Up to `n` bytes (fewer at the end).
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let start = self.pos.min(self.data.len());
        let end = start.saturating_add(n).min(self.data.len());
        self.pos = end;
        &self.data[start..end]
    }
    pub fn u8(&mut self) -> u8 {
        self.take(1).first().copied().unwrap_or(0)
    }
    pub fn u32(&mut self) -> u32 {
        let mut b = [0u8; 4];
        let s = self.take(4);
        b[..s.len()].copy_from_slice(s);
        u32::from_le_bytes(b)
    }
    pub fn u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        let s = self.take(8);
        b[..s.len()].copy_from_slice(s);
        u64::from_le_bytes(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_past_the_end_are_zero() {
        let mut i = Input::new(&[1, 2, 3]);
        assert_eq!(i.u8(), 1);
        assert_eq!(i.u32(), 0x0302);
        assert!(i.is_empty());
        assert_eq!(i.u64(), 0);
        assert_eq!(i.take(5), &[] as &[u8]);
    }
}
