//! The values every rank sends and the values it must receive, as the GPU computes them
//! (`kernels.cu` holds the same functions). Inputs are small integers that depend on the rank,
//! the element index and a seed; their sums over every rank stay at most 256, so they are exact
//! in bf16 (8 significant bits) and fp32 in any order of addition, and every received element
//! can be compared bit for bit.

use gpuval_crds::Collective;

/// Largest value one rank contributes, so that `ranks × value` stays at most 256.
pub fn value_range(ranks: u32) -> u32 {
    (256 / ranks.max(1)).clamp(1, 15)
}

/// murmur3's 32-bit finaliser.
fn mix32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x85eb_ca6b);
    x ^= x >> 13;
    x = x.wrapping_mul(0xc2b2_ae35);
    x ^ (x >> 16)
}

/// What `rank` sends at element `index`: an integer in `1..=range`.
pub fn value(rank: u32, index: u64, seed: u32, range: u32) -> u32 {
    let hi = mix32(
        ((index >> 32) as u32)
            .wrapping_add(rank.wrapping_mul(0x85eb_ca6b))
            .wrapping_add(seed),
    );
    let h = mix32((index as u32).wrapping_mul(0x9e37_79b1) ^ hi);
    1 + h % range.max(1)
}

/// What a rank's output must hold at element `j`.
#[derive(Debug, Clone, Copy)]
pub struct Expected {
    pub collective: Collective,
    pub rank: u32,
    pub ranks: u32,
    /// nccl-tests' count: elements per rank (per peer for all-to-all), or the whole buffer.
    pub count: u64,
    pub seed: u32,
    /// Broadcast's root.
    pub root: u32,
}

impl Expected {
    pub fn at(&self, j: u64) -> u32 {
        let range = value_range(self.ranks);
        let v = |k: u32, i: u64| value(k, i, self.seed, range);
        let sum = |i: u64| (0..self.ranks).map(|k| v(k, i)).sum::<u32>();
        let c = self.count.max(1);
        match self.collective {
            Collective::AllReduce => sum(j),
            Collective::AllGather => v((j / c) as u32, j % c),
            Collective::ReduceScatter => sum(u64::from(self.rank) * c + j),
            Collective::Broadcast => v(self.root, j),
            Collective::AllToAll => v((j / c) as u32, u64::from(self.rank) * c + j % c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nccl::bandwidth::Layout;

    /// Each rank's input of `send` elements.
    fn inputs(ranks: u32, send: u64, seed: u32) -> Vec<Vec<u32>> {
        let range = value_range(ranks);
        (0..ranks)
            .map(|k| (0..send).map(|i| value(k, i, seed, range)).collect())
            .collect()
    }

    /// A host model of each collective's data movement (what NCCL's documentation defines),
    /// to check the expectations the GPU verifies against.
    fn reference(l: &Layout, rank: usize, input: &[Vec<u32>]) -> Vec<u32> {
        let (n, c) = (input.len(), l.count as usize);
        match l.collective {
            Collective::AllReduce => (0..c).map(|j| input.iter().map(|x| x[j]).sum()).collect(),
            Collective::AllGather => input.iter().flat_map(|x| x[..c].to_vec()).collect(),
            Collective::ReduceScatter => (0..c)
                .map(|j| input.iter().map(|x| x[rank * c + j]).sum())
                .collect(),
            Collective::Broadcast => input[0][..c].to_vec(),
            Collective::AllToAll => (0..n)
                .flat_map(|k| input[k][rank * c..(rank + 1) * c].to_vec())
                .collect(),
        }
    }

    #[test]
    fn expectations_match_a_host_model_of_every_collective() {
        for ranks in [2u32, 3, 8] {
            for coll in Collective::ALL {
                let l = Layout::new(coll, 48 * u64::from(ranks) * 4, 4, u64::from(ranks));
                let input = inputs(ranks, l.send, 77);
                for rank in 0..ranks {
                    let want = reference(&l, rank as usize, &input);
                    assert_eq!(want.len() as u64, l.recv);
                    let e = Expected {
                        collective: coll,
                        rank,
                        ranks,
                        count: l.count,
                        seed: 77,
                        root: 0,
                    };
                    let got: Vec<u32> = (0..want.len() as u64).map(|j| e.at(j)).collect();
                    assert_eq!(got, want, "{coll} rank {rank} of {ranks}");
                }
            }
        }
    }

    #[test]
    fn sums_stay_exact_in_bf16() {
        for ranks in [1u32, 2, 8, 16, 17, 64, 256, 300] {
            let range = value_range(ranks);
            assert!(
                ranks.min(256) * range <= 256 || range == 1,
                "{ranks} ranks, range {range}"
            );
            for i in 0..1000 {
                let v = value(ranks - 1, i, 5, range);
                assert!((1..=range).contains(&v));
            }
        }
        // Inputs depend on the rank, the offset and the seed.
        assert_ne!(value(0, 10, 1, 15), value(1, 10, 1, 15));
        let row: Vec<u32> = (0..16).map(|i| value(0, i, 1, 15)).collect();
        assert!(row.windows(2).any(|w| w[0] != w[1]));
        assert_ne!((0..16).map(|i| value(0, i, 2, 15)).collect::<Vec<_>>(), row);
    }
}
