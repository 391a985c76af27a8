//! A fabric round written as several objects, each well under etcd's object limit, at any node
//! count: [`shard`] cuts a round's groups into parts (a group larger than a part is listed in
//! slices, each with its offset in the group), and [`merge`] puts the parts back together.

use std::collections::BTreeMap;

use crate::fabric::{FabricGroup, FabricRoundSpec};

/// The most bytes of groups (as JSON) one round object carries: with its metadata, an object
/// stays under 64 KiB.
pub const MAX_PART_BYTES: usize = 56 * 1024;

fn json_len<T: serde::Serialize>(v: &T) -> usize {
    serde_json::to_vec(v).map_or(0, |b| b.len())
}

/// `round` as parts whose groups take at most `max_bytes` of JSON each (one part when it fits;
/// a single node's entry larger than `max_bytes` still gets a part of its own).
pub fn shard(round: &FabricRoundSpec, max_bytes: usize) -> Vec<FabricRoundSpec> {
    let mut parts: Vec<Vec<FabricGroup>> = vec![Vec::new()];
    let mut used = 0;
    for g in &round.groups {
        let whole = json_len(g);
        if used + whole <= max_bytes {
            used += whole;
            last(&mut parts).push(g.clone());
            continue;
        }
        if whole <= max_bytes {
            parts.push(vec![g.clone()]);
            used = whole;
            continue;
        }
        for slice in slices(g, max_bytes) {
            let size = json_len(&slice);
            if used + size > max_bytes && !last(&mut parts).is_empty() {
                parts.push(Vec::new());
                used = 0;
            }
            used += size;
            last(&mut parts).push(slice);
        }
    }
    let shards = i32::try_from(parts.len()).unwrap_or(i32::MAX);
    parts
        .into_iter()
        .enumerate()
        .map(|(i, groups)| FabricRoundSpec {
            groups,
            shard: i32::try_from(i).unwrap_or(i32::MAX),
            shards,
            ..round.clone()
        })
        .collect()
}

fn last(parts: &mut Vec<Vec<FabricGroup>>) -> &mut Vec<FabricGroup> {
    if parts.is_empty() {
        parts.push(Vec::new());
    }
    let n = parts.len() - 1;
    &mut parts[n]
}

/// A group too large for one part, as slices of at most about `max_bytes` each.
fn slices(g: &FabricGroup, max_bytes: usize) -> Vec<FabricGroup> {
    let size = i32::try_from(g.nodes.len()).unwrap_or(i32::MAX);
    let empty = FabricGroup {
        nodes: Vec::new(),
        gpus: Vec::new(),
        first: 0,
        size,
        ..g.clone()
    };
    let overhead = json_len(&empty) + 16;
    let mut out = Vec::new();
    let mut cur = empty.clone();
    let mut used = overhead;
    for (i, node) in g.nodes.iter().enumerate() {
        let cost = node.len() + 3 + if g.gpus.is_empty() { 0 } else { 12 };
        if used + cost > max_bytes && !cur.nodes.is_empty() {
            out.push(std::mem::replace(&mut cur, empty.clone()));
            used = overhead;
        }
        if cur.nodes.is_empty() {
            cur.first = i32::try_from(i).unwrap_or(i32::MAX);
        }
        cur.nodes.push(node.clone());
        if let Some(n) = g.gpus.get(i) {
            cur.gpus.push(*n);
        }
        used += cost;
    }
    if !cur.nodes.is_empty() {
        out.push(cur);
    }
    out
}

/// Why parts do not make a round.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MergeError {
    #[error("round {round}: {have} of its {shards} parts are here")]
    Incomplete {
        round: i32,
        have: usize,
        shards: i32,
    },
    #[error("round {round}: group {group} lists {have} of its {size} nodes")]
    Group {
        round: i32,
        group: i32,
        have: usize,
        size: i32,
    },
}

/// The groups of a round's parts (in part order) put back together: slices of one group
/// joined in order and checked complete.
pub fn merge_groups<'a>(
    round: i32,
    parts: impl IntoIterator<Item = &'a [FabricGroup]>,
) -> Result<Vec<FabricGroup>, MergeError> {
    let mut groups: Vec<FabricGroup> = Vec::new();
    let mut index: BTreeMap<i32, usize> = BTreeMap::new();
    for part in parts {
        for g in part {
            match index.get(&g.id) {
                Some(at) if g.size > 0 => {
                    let whole = &mut groups[*at];
                    whole.nodes.extend(g.nodes.iter().cloned());
                    whole.gpus.extend(g.gpus.iter().copied());
                }
                _ => {
                    index.insert(g.id, groups.len());
                    groups.push(g.clone());
                }
            }
        }
    }
    for g in &mut groups {
        if g.size > 0 {
            if g.nodes.len() != usize::try_from(g.size).unwrap_or(0) || g.first != 0 {
                return Err(MergeError::Group {
                    round,
                    group: g.id,
                    have: g.nodes.len(),
                    size: g.size,
                });
            }
            g.size = 0;
        }
    }
    Ok(groups)
}

/// The round the `parts` of one round make (in any order, duplicates allowed).
pub fn merge(parts: &[&FabricRoundSpec]) -> Result<FabricRoundSpec, MergeError> {
    let Some(head) = parts.iter().min_by_key(|p| p.shard) else {
        return Err(MergeError::Incomplete {
            round: 0,
            have: 0,
            shards: 1,
        });
    };
    let by_shard: BTreeMap<i32, &FabricRoundSpec> = parts.iter().map(|p| (p.shard, *p)).collect();
    let shards = head.shards.max(1);
    if (0..shards).any(|i| !by_shard.contains_key(&i)) {
        return Err(MergeError::Incomplete {
            round: head.round,
            have: by_shard.len(),
            shards,
        });
    }
    let groups = merge_groups(head.round, by_shard.values().map(|p| p.groups.as_slice()))?;
    Ok(FabricRoundSpec {
        groups,
        shard: 0,
        shards: 1,
        ..(*head).clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::FabricKind;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn round(nodes: usize) -> FabricRoundSpec {
        let names: Vec<String> = (0..nodes).map(|i| format!("gpu-node-{i:05}")).collect();
        let mut groups = vec![FabricGroup {
            id: 0,
            kind: FabricKind::Nccl,
            nodes: names.clone(),
            rendezvous: "10.0.0.1:29400".into(),
            gpus: vec![8; nodes],
            first: 0,
            size: 0,
            rail: None,
        }];
        for (i, pair) in names.chunks(2).enumerate() {
            groups.push(FabricGroup {
                id: i32::try_from(i + 1).unwrap(),
                kind: FabricKind::Tcp,
                nodes: pair.to_vec(),
                rendezvous: format!("10.0.{}.{}:{}", i / 250, i % 250, 29402 + 2 * i),
                gpus: vec![8; pair.len()],
                first: 0,
                size: 0,
                rail: None,
            });
        }
        FabricRoundSpec {
            validation: "acceptance".into(),
            generation: 1,
            round: 1,
            purpose: "screen".into(),
            started: Time(k8s_openapi::jiff::Timestamp::from_second(1_790_000_000).unwrap()),
            timeout_seconds: 300,
            end: false,
            groups,
            shard: 0,
            shards: 1,
        }
    }

    #[test]
    fn a_small_round_is_one_object_unchanged() {
        let r = round(8);
        let parts = shard(&r, MAX_PART_BYTES);
        assert_eq!(parts, vec![r.clone()]);
        assert_eq!(merge(&parts.iter().collect::<Vec<_>>()).unwrap(), r);
    }

    #[test]
    fn a_round_of_fifty_thousand_nodes_is_parts_under_64_kib_that_merge_back() {
        let r = round(50_000);
        let parts = shard(&r, MAX_PART_BYTES);
        assert!(parts.len() > 10, "{} parts", parts.len());
        for p in &parts {
            let bytes = serde_json::to_vec(p).unwrap().len();
            assert!(bytes < 60 * 1024, "part {} is {bytes} bytes", p.shard);
            assert_eq!(p.shards, i32::try_from(parts.len()).unwrap());
        }
        // In any order, and a part seen twice (a watch replays it) changes nothing.
        let mut refs: Vec<&FabricRoundSpec> = parts.iter().rev().collect();
        refs.push(&parts[3]);
        assert_eq!(merge(&refs).unwrap(), r);
    }

    #[test]
    fn a_round_missing_a_part_is_not_a_round() {
        let r = round(20_000);
        let parts = shard(&r, MAX_PART_BYTES);
        let some: Vec<&FabricRoundSpec> = parts.iter().skip(1).collect();
        let e = merge(&some).unwrap_err();
        assert!(e.to_string().contains("parts are here"), "{e}");
    }
}
