//! The data the check writes: every 8-byte word depends on the run's seed, the file, its
//! 64 KiB chunk of the file and the word's place in the chunk, so a flipped bit, a stale
//! chunk, a 4 KiB sector out of place, or data that landed at the wrong offset or in the wrong
//! file all read back wrong.
//!
//! Cheap by design: one 64 KiB base chunk of splitmix64 words per run (it stays in the CPU's
//! cache), and each chunk on disk is that base XORed with a per-(file, chunk) key. Filling and
//! checking is one XOR per word at memory speed, about what `dd` pays to read `/dev/zero`.

/// Bytes per chunk: the granularity of the per-place key.
pub const CHUNK: usize = 64 * 1024;
const CHUNK_WORDS: usize = CHUNK / 8;

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
    pub fn new(seed: u64) -> Self {
        let base = (0..CHUNK_WORDS as u64)
            .map(|i| mix(seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
            .collect();
        Self { seed, base }
    }

    /// The key of chunk `chunk` (byte offset / [`CHUNK`]) of file `file`.
    fn key(&self, file: u32, chunk: u64) -> u64 {
        mix(self.seed.rotate_left(17) ^ (u64::from(file) << 40) ^ chunk)
    }

    /// The expected word at byte `offset` (a multiple of 8) of file `file`.
    #[cfg(test)]
    pub fn word(&self, file: u32, offset: u64) -> u64 {
        let w = (offset as usize % CHUNK) / 8;
        self.base[w] ^ self.key(file, offset / CHUNK as u64)
    }

    /// Fills `buf` with file `file`'s bytes from `offset` (a multiple of [`CHUNK`]; the length
    /// a multiple of 8).
    pub fn fill(&self, file: u32, offset: u64, buf: &mut [u8]) {
        let first = offset / CHUNK as u64;
        for (c, chunk) in buf.chunks_mut(CHUNK).enumerate() {
            let key = self.key(file, first + c as u64);
            for (out, b) in chunk.chunks_exact_mut(8).zip(&self.base) {
                out.copy_from_slice(&(b ^ key).to_le_bytes());
            }
        }
    }

    /// Checks `buf`, read from file `file` at `offset` (a multiple of [`CHUNK`]); calls
    /// `bad(byte_offset_in_buf, expected, actual)` for each word that differs and returns how
    /// many did.
    pub fn check(
        &self,
        file: u32,
        offset: u64,
        buf: &[u8],
        mut bad: impl FnMut(usize, u64, u64),
    ) -> u64 {
        const RUN: usize = 512; // words per fast-path run (4 KiB)
        let first = offset / CHUNK as u64;
        let mut count = 0;
        for (c, chunk) in buf.chunks(CHUNK).enumerate() {
            let key = self.key(file, first + c as u64);
            for (r, (bytes, base)) in chunk.chunks(RUN * 8).zip(self.base.chunks(RUN)).enumerate() {
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
                        bad(c * CHUNK + (r * RUN + i) * 8, expected, actual);
                    }
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
        let p = Pattern::new(7);
        let mut buf = vec![0u8; 3 * CHUNK + 4096];
        p.fill(3, 5 * CHUNK as u64, &mut buf);
        assert_eq!(
            p.check(3, 5 * CHUNK as u64, &buf, |_, _, _| panic!("clean")),
            0
        );
        let at = CHUNK + 800;
        assert_eq!(
            le_word(&buf[at..at + 8]),
            p.word(3, (6 * CHUNK + 800) as u64)
        );
    }

    #[test]
    fn a_flipped_bit_is_found_at_its_word() {
        let p = Pattern::new(7);
        let mut buf = vec![0u8; 2 * CHUNK];
        p.fill(0, 0, &mut buf);
        buf[CHUNK + 8 * 4000 + 3] ^= 0x10;
        let mut seen = Vec::new();
        let n = p.check(0, 0, &buf, |at, e, a| seen.push((at, e ^ a)));
        assert_eq!(n, 1);
        assert_eq!(seen, vec![(CHUNK + 8 * 4000, 0x10u64 << 24)]);
    }

    #[test]
    fn data_from_another_place_does_not_pass() {
        let p = Pattern::new(7);
        let mut buf = vec![0u8; 4096];
        p.fill(1, 2 * CHUNK as u64, &mut buf);
        let at = |off: usize| off as u64;
        // same file, other chunk; other file, same chunk; other seed; all zeros
        assert_eq!(p.check(1, at(3 * CHUNK), &buf, |_, _, _| {}), 512);
        assert_eq!(p.check(2, at(2 * CHUNK), &buf, |_, _, _| {}), 512);
        assert_eq!(
            Pattern::new(8).check(1, at(2 * CHUNK), &buf, |_, _, _| {}),
            512
        );
        assert_eq!(p.check(1, at(2 * CHUNK), &[0u8; 4096], |_, _, _| {}), 512);
    }

    #[test]
    fn swapped_sectors_inside_a_chunk_are_found() {
        let p = Pattern::new(9);
        let mut buf = vec![0u8; 16384];
        p.fill(0, 0, &mut buf);
        let (a, b) = buf.split_at_mut(4096);
        a.swap_with_slice(&mut b[..4096]);
        assert_eq!(p.check(0, 0, &buf, |_, _, _| {}), 1024);
    }
}

#[cfg(test)]
mod speed {
    use super::*;

    /// Fill and check rates on this CPU: `cargo test --release -p gpuval-agent --lib
    /// pattern_speed -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn pattern_speed() {
        let p = Pattern::new(1);
        let mut buf = vec![0u8; 8 << 20];
        let rounds = 100u64;
        let t = std::time::Instant::now();
        for r in 0..rounds {
            p.fill(0, r * buf.len() as u64, &mut buf);
        }
        let fill = rounds as f64 * buf.len() as f64 / t.elapsed().as_secs_f64() / 1e9;
        let t = std::time::Instant::now();
        let mut bad = 0;
        for _ in 0..rounds {
            bad += p.check(0, 99 * buf.len() as u64, &buf, |_, _, _| {});
        }
        let check = rounds as f64 * buf.len() as f64 / t.elapsed().as_secs_f64() / 1e9;
        assert_eq!(bad, 0);
        println!("fill {fill:.1} GB/s, check {check:.1} GB/s (one core)");
    }
}
