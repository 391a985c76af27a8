//! The data the check writes: every 8-byte word depends on the run's seed, the file, the block
//! and the word's place in the block, so a flipped bit, a stale block, or a block that landed at
//! the wrong offset or in the wrong file all read back wrong.
//!
//! Cheap by design: one base block of splitmix64 words per run, and each block on disk is that
//! base XORed with a per-(file, block) key. Filling and checking a block is one XOR per word, at
//! memory speed, so pattern work costs about what `dd` pays to read `/dev/zero`.

/// splitmix64's output function: a bijective mix of a 64-bit value.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A run's pattern.
pub struct Pattern {
    seed: u64,
    base: Vec<u64>,
}

impl Pattern {
    /// A pattern for blocks of `block_bytes` (a multiple of 8).
    pub fn new(seed: u64, block_bytes: usize) -> Self {
        let words = block_bytes / 8;
        let base = (0..words as u64)
            .map(|i| mix(seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
            .collect();
        Self { seed, base }
    }

    /// The key of block `block` of file `file`.
    fn key(&self, file: u32, block: u64) -> u64 {
        mix(self.seed.rotate_left(17) ^ (u64::from(file) << 40) ^ block)
    }

    /// The expected word `word` of block `block` of file `file`.
    #[cfg(test)]
    pub fn word(&self, file: u32, block: u64, word: usize) -> u64 {
        self.base.get(word).copied().unwrap_or(0) ^ self.key(file, block)
    }

    /// Fills `buf` (at most one block, a multiple of 8 bytes) with block `block` of file `file`.
    pub fn fill(&self, file: u32, block: u64, buf: &mut [u8]) {
        let key = self.key(file, block);
        for (out, b) in buf.chunks_exact_mut(8).zip(&self.base) {
            out.copy_from_slice(&(b ^ key).to_le_bytes());
        }
    }

    /// Checks `buf` against block `block` of file `file`; calls `bad(word_index, expected,
    /// actual)` for each word that differs and returns how many did.
    pub fn check(
        &self,
        file: u32,
        block: u64,
        buf: &[u8],
        mut bad: impl FnMut(usize, u64, u64),
    ) -> u64 {
        const RUN: usize = 512; // words per fast-path run (4 KiB)
        let key = self.key(file, block);
        let mut count = 0;
        for (run, (bytes, base)) in buf.chunks(RUN * 8).zip(self.base.chunks(RUN)).enumerate() {
            let diff = bytes
                .chunks_exact(8)
                .zip(base)
                .fold(0u64, |acc, (w, b)| acc | (le_word(w) ^ b ^ key));
            if diff == 0 {
                continue;
            }
            for (i, (w, b)) in bytes.chunks_exact(8).zip(base).enumerate() {
                let (actual, expected) = (le_word(w), b ^ key);
                if actual != expected {
                    count += 1;
                    bad(run * RUN + i, expected, actual);
                }
            }
        }
        count
    }
}

fn le_word(w: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(w);
    u64::from_le_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_then_check_is_clean_and_words_match() {
        let p = Pattern::new(7, 64 * 1024);
        let mut buf = vec![0u8; 64 * 1024];
        p.fill(3, 5, &mut buf);
        assert_eq!(p.check(3, 5, &buf, |_, _, _| panic!("clean block")), 0);
        assert_eq!(le_word(&buf[8 * 100..8 * 101]), p.word(3, 5, 100));
    }

    #[test]
    fn a_flipped_bit_is_found_at_its_word() {
        let p = Pattern::new(7, 64 * 1024);
        let mut buf = vec![0u8; 64 * 1024];
        p.fill(0, 0, &mut buf);
        buf[8 * 4000 + 3] ^= 0x10;
        let mut seen = Vec::new();
        let n = p.check(0, 0, &buf, |i, e, a| seen.push((i, e ^ a)));
        assert_eq!(n, 1);
        assert_eq!(seen, vec![(4000, 0x10u64 << 24)]);
    }

    #[test]
    fn blocks_from_another_place_do_not_pass() {
        let p = Pattern::new(7, 4096);
        let mut buf = vec![0u8; 4096];
        p.fill(1, 2, &mut buf);
        // same file, other block; other file, same block; other seed
        assert_eq!(p.check(1, 3, &buf, |_, _, _| {}), 512);
        assert_eq!(p.check(2, 2, &buf, |_, _, _| {}), 512);
        assert_eq!(Pattern::new(8, 4096).check(1, 2, &buf, |_, _, _| {}), 512);
        // all zeros
        assert_eq!(p.check(1, 2, &[0u8; 4096], |_, _, _| {}), 512);
    }

    #[test]
    fn swapped_sectors_inside_a_block_are_found() {
        let p = Pattern::new(9, 16384);
        let mut buf = vec![0u8; 16384];
        p.fill(0, 0, &mut buf);
        let (a, b) = buf.split_at_mut(4096);
        a.swap_with_slice(&mut b[..4096]);
        assert_eq!(p.check(0, 0, &buf, |_, _, _| {}), 1024);
    }
}
