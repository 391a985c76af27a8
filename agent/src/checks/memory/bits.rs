//! Which bits of the wrong words flipped, and which way: the device kernels count them per bit
//! position (`tally_bits` in `kernels.cu`, 64 counters: bit b read as 1 where 0 was written at
//! `2b`, read as 0 where 1 was written at `2b + 1`); [`BitTally::add_word`] is the same rule in
//! Rust, for the simulator and the tests.

use gpuval_crds::{BitFlipCount, BitFlips};

use crate::judge::to_i64;

/// Flip counts per bit position of the 32-bit words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BitTally {
    /// Bit read as 1 where 0 was written.
    pub to_one: [u64; 32],
    /// Bit read as 0 where 1 was written.
    pub to_zero: [u64; 32],
}

impl BitTally {
    /// The tally of the 64 device counters, in the kernels' layout.
    pub fn from_device(counters: &[u64]) -> Self {
        let mut t = Self::default();
        for (b, pair) in counters.chunks_exact(2).take(32).enumerate() {
            t.to_one[b] = pair[0];
            t.to_zero[b] = pair[1];
        }
        t
    }

    /// Counts the bits of `got` that differ from `want`.
    pub fn add_word(&mut self, want: u32, got: u32) {
        let mut diff = want ^ got;
        while diff != 0 {
            let b = diff.trailing_zeros() as usize;
            diff &= diff - 1;
            if got >> b & 1 == 1 {
                self.to_one[b] += 1;
            } else {
                self.to_zero[b] += 1;
            }
        }
    }

    /// Adds another tally (another pass or pattern).
    pub fn add(&mut self, other: &BitTally) {
        for b in 0..32 {
            self.to_one[b] += other.to_one[b];
            self.to_zero[b] += other.to_zero[b];
        }
    }

    pub fn is_empty(&self) -> bool {
        self.to_one.iter().chain(&self.to_zero).all(|n| *n == 0)
    }

    /// The report's view: totals each way and every bit that flipped, most flips first.
    pub fn report(&self) -> Option<BitFlips> {
        if self.is_empty() {
            return None;
        }
        let mut bits: Vec<BitFlipCount> = (0..32)
            .filter(|b| self.to_one[*b] + self.to_zero[*b] > 0)
            .map(|b| BitFlipCount {
                bit: b as i32,
                to_one: to_i64(self.to_one[b]),
                to_zero: to_i64(self.to_zero[b]),
            })
            .collect();
        bits.sort_by_key(|c| (std::cmp::Reverse(c.to_one + c.to_zero), c.bit));
        Some(BitFlips {
            stuck_at_one: to_i64(self.to_one.iter().sum()),
            stuck_at_zero: to_i64(self.to_zero.iter().sum()),
            bits,
        })
    }
}

/// `bit 13 read 1 where 0 was written 5 times (stuck at 1)`, for the first few bits: what a
/// reason says of the flips. A bit that only ever flipped one way, more than once, is called
/// stuck.
pub fn describe(flips: &BitFlips) -> String {
    const SHOWN: usize = 3;
    let mut parts: Vec<String> = flips
        .bits
        .iter()
        .take(SHOWN)
        .map(|c| {
            let stuck = match (c.to_one, c.to_zero) {
                (n, 0) if n > 1 => " (stuck at 1)",
                (0, n) if n > 1 => " (stuck at 0)",
                _ => "",
            };
            let ways = [(c.to_one, "0→1"), (c.to_zero, "1→0")]
                .iter()
                .filter(|(n, _)| *n > 0)
                .map(|(n, way)| format!("{n}× {way}"))
                .collect::<Vec<_>>()
                .join(", ");
            format!("bit {} {ways}{stuck}", c.bit)
        })
        .collect();
    if flips.bits.len() > SHOWN {
        parts.push(format!("{} more bits", flips.bits.len() - SHOWN));
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flips_are_counted_by_position_and_direction() {
        let mut t = BitTally::default();
        // bit 13 reads 1 twice, bit 0 reads 0 once
        t.add_word(0x0000_0000, 0x0000_2000);
        t.add_word(0xffff_dfff, 0xffff_ffff);
        t.add_word(0x0000_0001, 0x0000_0000);
        t.add_word(0x1234_5678, 0x1234_5678);
        assert_eq!((t.to_one[13], t.to_zero[13]), (2, 0));
        assert_eq!((t.to_one[0], t.to_zero[0]), (0, 1));
        let r = t.report().expect("flips");
        assert_eq!((r.stuck_at_one, r.stuck_at_zero), (2, 1));
        assert_eq!(r.bits[0].bit, 13);
        assert_eq!(describe(&r), "bit 13 2× 0→1 (stuck at 1); bit 0 1× 1→0");
    }

    #[test]
    fn device_counters_map_to_bits() {
        let mut counters = [0u64; 64];
        counters[2 * 5] = 7;
        counters[2 * 31 + 1] = 3;
        let t = BitTally::from_device(&counters);
        assert_eq!(t.to_one[5], 7);
        assert_eq!(t.to_zero[31], 3);
        let mut sum = t;
        sum.add(&t);
        assert_eq!(sum.to_one[5], 14);
        assert!(BitTally::default().report().is_none());
        let many = BitFlips {
            bits: (0..5)
                .map(|b| BitFlipCount {
                    bit: b,
                    to_one: 1,
                    to_zero: 1,
                })
                .collect(),
            ..Default::default()
        };
        assert!(
            describe(&many).ends_with("; 2 more bits"),
            "{}",
            describe(&many)
        );
    }
}
