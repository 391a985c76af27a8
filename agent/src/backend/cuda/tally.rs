//! What every checking kernel (`gv_verify`, `gv_invert`, `gv_random_verify`) reports into, and
//! the one place that passes it to them.
//!
//! The three kernels end with the same four parameters: the counters, the mismatch log, its
//! length and the flipped-bit counters. The memory check and the p2p check both launch
//! `gv_verify`; when its list grew by one, the p2p launch kept the old list and failed on every
//! pair of real hosts. Both now push the trailing parameters through [`Tally::push`].

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DriverError};

use super::launch::Launch;

/// Two counters for each bit of a 32-bit word (`tally_bits` in `kernels.cu`).
pub const BIT_COUNTERS: usize = 64;

/// The device-side outputs of one checking kernel.
pub struct Tally {
    /// `[0]`: wrong 32-bit words; `[1]`: log slots claimed.
    pub counters: CudaSlice<u64>,
    /// Pairs (word index, expected << 32 | actual), `max_log` of them.
    pub log: CudaSlice<u64>,
    pub max_log: u32,
    /// [`BIT_COUNTERS`] flip counters: `[2b]` bit b read 1 where 0 was written, `[2b+1]` the
    /// other way.
    pub bits: CudaSlice<u64>,
}

impl Tally {
    /// Zeroed outputs on `stream` with room for `max_log` logged words (at least one).
    pub fn new(stream: &Arc<CudaStream>, max_log: usize) -> Result<Self, DriverError> {
        let max_log = max_log.max(1);
        Ok(Self {
            counters: stream.alloc_zeros::<u64>(2)?,
            log: stream.alloc_zeros::<u64>(2 * max_log)?,
            max_log: u32::try_from(max_log).unwrap_or(u32::MAX),
            bits: stream.alloc_zeros::<u64>(BIT_COUNTERS)?,
        })
    }

    /// Zeroes the counters before the next kernel (the log and bit counters accumulate).
    pub fn reset(&mut self, stream: &Arc<CudaStream>) -> Result<(), DriverError> {
        stream.memset_zeros(&mut self.counters)
    }

    /// Pushes the four parameters every checking kernel ends with.
    pub fn push<'a>(&'a mut self, launch: &mut Launch<'a>) {
        launch
            .arg(&mut self.counters)
            .arg(&mut self.log)
            .arg(&self.max_log)
            .arg(&mut self.bits);
    }
}
