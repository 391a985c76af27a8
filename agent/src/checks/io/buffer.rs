//! Page-aligned I/O buffers (O_DIRECT needs the memory aligned as well as the offsets).

/// Alignment of O_DIRECT offsets, sizes and memory.
pub const ALIGN: usize = 4096;

/// A heap buffer whose usable part starts on an [`ALIGN`] boundary (for O_DIRECT).
pub struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    pub fn new(len: usize) -> Self {
        let raw = vec![0u8; len + ALIGN];
        let start = raw.as_ptr().align_offset(ALIGN).min(ALIGN);
        Self { raw, start, len }
    }

    pub fn as_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffers_are_aligned() {
        for len in [4096, 8 << 20, 12288] {
            let mut b = AlignedBuf::new(len);
            let s = b.as_mut();
            assert_eq!(s.len(), len);
            assert_eq!(s.as_ptr() as usize % ALIGN, 0);
        }
    }
}
