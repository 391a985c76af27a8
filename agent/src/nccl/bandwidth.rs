//! Message layout and bandwidth, defined exactly as nccl-tests defines them, so that the
//! agent's rows line up with `all_reduce_perf` and friends.
//!
//! Layout: nccl-tests' `<Coll>GetCollByteCount` functions (`src/all_reduce.cu`,
//! `src/all_gather.cu`, `src/reduce_scatter.cu`, `src/broadcast.cu`, `src/alltoall.cu` of
//! NVIDIA/nccl-tests) turn a requested size into the element count each rank passes to NCCL
//! (the "count" column), the send and receive element counts, and the in-place offsets. For
//! all-gather, reduce-scatter and all-to-all the per-rank count is the requested count divided
//! by the rank count, rounded down to a multiple of 16 bytes; the "size" column
//! (`writeBenchmarkLinePreamble` in `src/common.cu`) is the larger of the send and receive
//! bytes, so for all-gather it is the total output, for reduce-scatter the total input.
//!
//! Bandwidth: the `<Coll>GetBw` functions of the same files and `doc/PERFORMANCE.md`:
//! algbw = bytes / time (GB/s, 1e9), with bytes = count × element size for all-reduce and
//! broadcast and count × element size × ranks for all-gather, reduce-scatter and all-to-all;
//! busbw = algbw × 2(n−1)/n for all-reduce, × (n−1)/n for all-gather, reduce-scatter and
//! all-to-all, × 1 for broadcast. The time is the average of `iters` back-to-back launches
//! (`BenchTime` in `src/common.cu`).

use gpuval_crds::Collective;

/// How one collective at one requested size is laid out in each rank's buffers. Counts are in
/// elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub collective: Collective,
    pub ranks: u64,
    /// Bytes per element.
    pub element: u64,
    /// The count each rank passes to NCCL (nccl-tests' "count" column): elements per rank for
    /// all-gather, reduce-scatter and all-to-all (per peer), the whole buffer otherwise.
    pub count: u64,
    /// Elements each rank sends from and receives into.
    pub send: u64,
    pub recv: u64,
    /// In place, where rank r's input starts inside its receive buffer (`send_offset × r`) and
    /// where its output starts (`recv_offset × r`).
    pub send_offset: u64,
    pub recv_offset: u64,
}

impl Layout {
    /// The layout nccl-tests uses for a requested size of `bytes`.
    pub fn new(collective: Collective, bytes: u64, element: u64, ranks: u64) -> Self {
        let element = element.max(1);
        let ranks = ranks.max(1);
        let count = bytes / element;
        // Per-rank counts are rounded down to whole 16-byte units.
        let per_rank = (count / ranks) & !((16 / element).max(1) - 1);
        let (count, send, recv, send_offset, recv_offset) = match collective {
            Collective::AllReduce | Collective::Broadcast => (count, count, count, 0, 0),
            Collective::AllGather => (per_rank, per_rank, per_rank * ranks, per_rank, 0),
            Collective::ReduceScatter => (per_rank, per_rank * ranks, per_rank, 0, per_rank),
            Collective::AllToAll => (per_rank, per_rank * ranks, per_rank * ranks, 0, 0),
        };
        Self {
            collective,
            ranks,
            element,
            count,
            send,
            recv,
            send_offset,
            recv_offset,
        }
    }

    /// nccl-tests' "size" column: the larger of the send and receive bytes.
    pub fn bytes(&self) -> u64 {
        self.send.max(self.recv) * self.element
    }

    /// Whether nccl-tests' in-place variant is measured for this collective (all-to-all runs
    /// out of place only: grouped sends and receives on one buffer would overwrite data not
    /// yet sent).
    pub fn has_in_place(&self) -> bool {
        self.collective != Collective::AllToAll
    }

    /// Bytes moved per collective in the algorithm-bandwidth sense (the `GetBw` numerator).
    pub fn algorithm_bytes(&self) -> u64 {
        match self.collective {
            Collective::AllReduce | Collective::Broadcast => self.count * self.element,
            Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => {
                self.count * self.element * self.ranks
            }
        }
    }

    /// Algorithm bandwidth in GB/s (1e9) for `seconds` per collective; 0 without a time.
    pub fn algbw_gbps(&self, seconds: f64) -> f64 {
        if seconds > 0.0 {
            self.algorithm_bytes() as f64 / 1e9 / seconds
        } else {
            0.0
        }
    }

    /// Bus bandwidth in GB/s: the algorithm bandwidth times [`bus_factor`].
    pub fn busbw_gbps(&self, seconds: f64) -> f64 {
        self.algbw_gbps(seconds) * bus_factor(self.collective, self.ranks)
    }
}

/// nccl-tests' correction from algorithm to bus bandwidth for `ranks` ranks.
pub fn bus_factor(collective: Collective, ranks: u64) -> f64 {
    let n = ranks.max(1) as f64;
    match collective {
        Collective::AllReduce => 2.0 * (n - 1.0) / n,
        Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => (n - 1.0) / n,
        Collective::Broadcast => 1.0,
    }
}

/// The requested sizes: `min`, `min × factor`, ... while at most `max` (nccl-tests' `-b -e
/// -f` loop), then `max` itself when the ladder does not land on it, so the largest size asked
/// for is always measured.
pub fn size_ladder(min: u64, max: u64, factor: u64) -> Vec<u64> {
    let (min, factor) = (min.max(1), factor.max(2));
    let mut sizes = Vec::new();
    let mut size = min;
    while size <= max {
        sizes.push(size);
        match size.checked_mul(factor) {
            Some(next) => size = next,
            None => break,
        }
    }
    if sizes.last().is_some_and(|l| *l < max) {
        sizes.push(max);
    }
    sizes
}

/// `4 GiB`, `256 MiB`, `8 B`: binary units for whole multiples, bytes otherwise.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (1 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
    ];
    for (unit, name) in UNITS {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{} {name}", bytes / unit);
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    /// Hand-computed from nccl-tests' definitions: 2 ranks, fp32, 1 GiB in 4 ms.
    #[test]
    fn bandwidth_matches_nccl_tests_by_hand() {
        let secs = 0.004;
        let ar = Layout::new(Collective::AllReduce, GIB, 4, 2);
        assert_eq!((ar.count, ar.bytes()), (GIB / 4, GIB));
        // algbw = 2^30 / 1e9 / 0.004 = 268.435456; busbw = algbw × 2·1/2
        assert!((ar.algbw_gbps(secs) - 268.435456).abs() < 1e-9);
        assert!((ar.busbw_gbps(secs) - 268.435456).abs() < 1e-9);

        let ag = Layout::new(Collective::AllGather, GIB, 4, 2);
        assert_eq!((ag.count, ag.send, ag.recv), (GIB / 8, GIB / 8, GIB / 4));
        assert_eq!(ag.bytes(), GIB, "all-gather's size is the whole output");
        assert!((ag.busbw_gbps(secs) - 134.217728).abs() < 1e-9);

        let rs = Layout::new(Collective::ReduceScatter, GIB, 4, 2);
        assert_eq!(
            (rs.send, rs.recv, rs.recv_offset),
            (GIB / 4, GIB / 8, GIB / 8)
        );
        assert!((rs.busbw_gbps(secs) - 134.217728).abs() < 1e-9);

        let bc = Layout::new(Collective::Broadcast, GIB, 4, 2);
        assert!((bc.busbw_gbps(secs) - 268.435456).abs() < 1e-9);
    }

    /// 8 ranks, bf16: all-reduce 2·7/8 = 1.75, the others 7/8.
    #[test]
    fn bus_factors_for_eight_ranks() {
        assert_eq!(bus_factor(Collective::AllReduce, 8), 1.75);
        assert_eq!(bus_factor(Collective::AllGather, 8), 0.875);
        assert_eq!(bus_factor(Collective::AllToAll, 8), 0.875);
        assert_eq!(bus_factor(Collective::Broadcast, 8), 1.0);
        let a2a = Layout::new(Collective::AllToAll, 96 << 20, 2, 8);
        // 96 MiB / 2 B = 48 Mi elements; 6 Mi per peer; the size column is all of them.
        assert_eq!((a2a.count, a2a.bytes()), (6 << 20, 96 << 20));
        // 100 µs: algbw = 96 MiB / 1e9 / 1e-4 = 1006.632960 GB/s.
        assert!((a2a.algbw_gbps(1e-4) - 1006.63296).abs() < 1e-6);
        assert!((a2a.busbw_gbps(1e-4) - 880.80384).abs() < 1e-6);
    }

    #[test]
    fn per_rank_counts_round_down_to_16_bytes() {
        // 8 B of bf16 over 2 ranks: 2 elements each, less than 16 bytes: nothing to send.
        let ag = Layout::new(Collective::AllGather, 8, 2, 2);
        assert_eq!((ag.count, ag.bytes()), (0, 0));
        // 100 B of fp32 over 4 ranks: 25 elements, 6 each, rounded down to 4 (16 bytes).
        let rs = Layout::new(Collective::ReduceScatter, 100, 4, 4);
        assert_eq!((rs.count, rs.send, rs.bytes()), (4, 16, 64));
        // Over 3 ranks: 8 each, already whole 16-byte units.
        assert_eq!(
            Layout::new(Collective::ReduceScatter, 100, 4, 3).bytes(),
            96
        );
        // All-reduce keeps the size asked for.
        assert_eq!(Layout::new(Collective::AllReduce, 8, 2, 2).bytes(), 8);
    }

    #[test]
    fn the_ladder_ends_on_the_largest_size() {
        let sizes = size_ladder(8, 4 * GIB, 4);
        assert_eq!(sizes.first(), Some(&8));
        assert_eq!(&sizes[sizes.len() - 2..], &[2 * GIB, 4 * GIB]);
        assert_eq!(sizes.len(), 16);
        assert_eq!(size_ladder(16, 4 * GIB, 4).len(), 15);
        assert_eq!(size_ladder(64, 64, 2), [64]);
        assert!(size_ladder(128, 64, 2).is_empty());
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human_bytes(4 * GIB), "4 GiB");
        assert_eq!(human_bytes(256 << 20), "256 MiB");
        assert_eq!(human_bytes(8), "8 B");
        assert_eq!(human_bytes(1000), "1000 B");
    }
}
