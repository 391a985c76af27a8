//! Faults between nodes: a group failed although every member of it passed elsewhere, so no
//! member is at fault; the fault is in what joins them (a link, a switch's uplink).
//!
//! The smallest such group is localized the way NVIDIA's Cluster Readiness Engine probes
//! across boundaries: it is split into about √n parts in its own order (tested at once, in one
//! round); a part that fails is the next, smaller, such group; when every part passes, the
//! parts are joined two by two (neighbours), and a pair of parts that fails while each part
//! passes is reported as a fault between those two groups. A pair of nodes that fails while
//! each passed elsewhere is a link fault between the two.

use std::collections::BTreeSet;
use std::fmt;

use gpuval_crds::fabric::FabricKind;

use crate::evaluate::{Evaluation, GroupFailure};
use crate::{Group, Purpose};

/// How many member names a fault lists before counting the rest.
const LISTED: usize = 4;

/// A fault between nodes that each passed elsewhere; no node is named for it.
#[derive(Debug, Clone, PartialEq)]
pub enum BetweenFault {
    /// Two nodes that each passed elsewhere fail together: the link (or the path) between them.
    Link {
        kind: FabricKind,
        a: String,
        b: String,
        why: String,
    },
    /// Two groups that each passed fail together: the switching between them.
    Groups {
        kind: FabricKind,
        a: Vec<String>,
        b: Vec<String>,
        why: String,
    },
    /// A group whose members all passed elsewhere fails, and the rounds left did not narrow it.
    Among {
        kind: FabricKind,
        nodes: Vec<String>,
        why: String,
    },
}

fn list(nodes: &[String]) -> String {
    let shown: Vec<&str> = nodes.iter().take(LISTED).map(String::as_str).collect();
    match nodes.len().saturating_sub(LISTED) {
        0 => shown.join(", "),
        more => format!("{} and {more} more", shown.join(", ")),
    }
}

impl BetweenFault {
    /// Every node the fault lies between.
    pub fn nodes(&self) -> Vec<&String> {
        match self {
            BetweenFault::Link { a, b, .. } => vec![a, b],
            BetweenFault::Groups { a, b, .. } => a.iter().chain(b).collect(),
            BetweenFault::Among { nodes, .. } => nodes.iter().collect(),
        }
    }
}

impl fmt::Display for BetweenFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BetweenFault::Link { kind, a, b, why } => write!(
                f,
                "{} link fault between {a} and {b} ({why}); each passed beside other nodes",
                kind.as_str()
            ),
            BetweenFault::Groups { kind, a, b, why } => write!(
                f,
                "{} fault between the groups [{}] and [{}] ({why}); each group passed on its own",
                kind.as_str(),
                list(a),
                list(b)
            ),
            BetweenFault::Among { kind, nodes, why } => write!(
                f,
                "{} fault among [{}] ({why}), not localized further; each of them passed elsewhere",
                kind.as_str(),
                list(nodes)
            ),
        }
    }
}

/// One group that failed although its members passed elsewhere: what it says so far, and the
/// groups that would narrow it down.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    pub fault: BetweenFault,
    /// Empty when nothing more can be learnt.
    pub next_groups: Vec<Group>,
}

/// The faults between nodes in `ev`, each with the groups that would narrow it down (a fault
/// whose nodes all lie within a fault between groups is that fault, and not listed again).
pub fn find(ev: &Evaluation) -> Vec<Found> {
    let found: Vec<Found> = minimal(ev).into_iter().map(|u| narrow(ev, u)).collect();
    let wide: Vec<BTreeSet<&String>> = found
        .iter()
        .filter_map(|f| match &f.fault {
            BetweenFault::Groups { a, b, .. } => Some(a.iter().chain(b).collect()),
            _ => None,
        })
        .collect();
    found
        .iter()
        .filter(|f| {
            let nodes = f.fault.nodes();
            !f.next_groups.is_empty()
                || !wide
                    .iter()
                    .any(|w| w.len() > nodes.len() && nodes.iter().all(|n| w.contains(n)))
        })
        .cloned()
        .collect()
}

/// Failed groups whose members all passed a group of that kind (and none is gone), keeping
/// only those that hold no smaller such group.
fn minimal(ev: &Evaluation) -> Vec<&GroupFailure> {
    let mut cleared: Vec<&GroupFailure> = ev
        .failures
        .iter()
        .filter(|f| {
            f.members.iter().all(|n| {
                ev.states
                    .get(n)
                    .is_some_and(|s| !s.is_out() && s.standing(f.kind).is_some_and(|s| s.passed))
            })
        })
        .collect();
    cleared.sort_by_key(|f| f.members.len());
    let mut kept: Vec<(&GroupFailure, BTreeSet<&str>)> = Vec::new();
    for f in cleared {
        let set: BTreeSet<&str> = f.members.iter().map(String::as_str).collect();
        if kept
            .iter()
            .any(|(k, ks)| k.kind == f.kind && ks.is_subset(&set))
        {
            continue;
        }
        kept.push((f, set));
    }
    kept.into_iter().map(|(f, _)| f).collect()
}

fn passed(ev: &Evaluation, kind: FabricKind, nodes: &[String]) -> bool {
    if nodes.len() < 2 {
        // A single node cannot measure on its own; it passed elsewhere.
        return true;
    }
    let mut sorted = nodes.to_vec();
    sorted.sort();
    ev.passed.contains(&(kind.as_str(), sorted))
}

/// What a failed group of cleared members says, and how to narrow it.
fn narrow(ev: &Evaluation, u: &GroupFailure) -> Found {
    let kind = u.kind;
    let why = format!("fabric round {}: {}", u.round, u.why);
    let members = u.members.as_slice();
    if let [a, b] = members {
        return probe_pair(ev, u, a, b, why);
    }
    if let Some((a, b)) = two_passed_parts(ev, kind, members) {
        return Found {
            fault: BetweenFault::Groups { kind, a, b, why },
            next_groups: Vec::new(),
        };
    }
    let parts = split(members);
    let untested = |gs: Vec<Vec<String>>| -> Vec<Group> {
        gs.into_iter()
            .filter(|g| !passed(ev, kind, g))
            .map(|nodes| Group { kind, nodes })
            .collect()
    };
    let mut next = untested(parts.clone());
    if next.is_empty() {
        let joined = parts
            .windows(2)
            .map(|w| [w[0].clone(), w[1].clone()].concat())
            .filter(|j| j.len() < members.len())
            .collect();
        next = untested(joined);
    }
    Found {
        fault: BetweenFault::Among {
            kind,
            nodes: members.to_vec(),
            why,
        },
        next_groups: next,
    }
}

/// A pair of cleared nodes that failed together: the link between them, unless the node next
/// to either one (on the side away from the other) fails beside the other one too, which makes
/// it a fault between the two sides (a switch's uplink). Pairs planned to probe are not probed
/// again.
fn probe_pair(ev: &Evaluation, u: &GroupFailure, a: &String, b: &String, why: String) -> Found {
    let kind = u.kind;
    let link = BetweenFault::Link {
        kind,
        a: a.clone(),
        b: b.clone(),
        why: why.clone(),
    };
    let names: Vec<&String> = ev.states.keys().collect();
    let (Some(ia), Some(ib)) = (
        names.iter().position(|n| *n == a),
        names.iter().position(|n| *n == b),
    ) else {
        return Found {
            fault: link,
            next_groups: Vec::new(),
        };
    };
    if u.purpose == Purpose::Split {
        return Found {
            fault: link,
            next_groups: Vec::new(),
        };
    }
    let (lo, hi) = (ia.min(ib), ia.max(ib));
    let near = crate::neighbours::Neighbours::new(ev, kind);
    let mut lo_side = vec![names[lo].clone()];
    let mut hi_side = vec![names[hi].clone()];
    let mut next = Vec::new();
    let probes = [
        near.below(lo, hi).map(|x| (x, hi, true)),
        near.above(hi, lo).map(|x| (x, lo, false)),
    ];
    for (extra, other, on_lo) in probes.into_iter().flatten() {
        let pair = vec![names[extra].clone(), names[other].clone()];
        if passed(ev, kind, &pair) {
            continue;
        }
        if failed(ev, kind, &pair) {
            if on_lo {
                lo_side.insert(0, names[extra].clone());
            } else {
                hi_side.push(names[extra].clone());
            }
        } else {
            next.push(Group { kind, nodes: pair });
        }
    }
    let fault = if next.is_empty() && (lo_side.len() > 1 || hi_side.len() > 1) {
        BetweenFault::Groups {
            kind,
            a: lo_side,
            b: hi_side,
            why,
        }
    } else {
        link
    };
    Found {
        fault,
        next_groups: next,
    }
}

fn failed(ev: &Evaluation, kind: FabricKind, nodes: &[String]) -> bool {
    let mut want = nodes.to_vec();
    want.sort();
    ev.failures.iter().any(|f| {
        f.kind == kind && f.members.len() == want.len() && {
            let mut got = f.members.to_vec();
            got.sort();
            got == want
        }
    })
}

/// `members` in order, cut into about √n parts of at least two.
pub fn split(members: &[String]) -> Vec<Vec<String>> {
    let n = members.len();
    let size = if n <= 4 {
        n.div_ceil(2)
    } else {
        (n as f64).sqrt().ceil() as usize
    }
    .max(2);
    members.chunks(size).map(<[String]>::to_vec).collect()
}

/// Two groups that passed and together make `members` (each may be a single node).
fn two_passed_parts(
    ev: &Evaluation,
    kind: FabricKind,
    members: &[String],
) -> Option<(Vec<String>, Vec<String>)> {
    let set: BTreeSet<&str> = members.iter().map(String::as_str).collect();
    ev.passed
        .iter()
        .filter(|(k, g)| *k == kind.as_str() && g.len() < members.len())
        .filter(|(_, g)| g.iter().all(|n| set.contains(n.as_str())))
        .find_map(|(_, a)| {
            let rest: Vec<String> = members.iter().filter(|n| !a.contains(n)).cloned().collect();
            passed(ev, kind, &rest).then(|| (a.clone(), rest))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("n{i:02}")).collect()
    }

    #[test]
    fn a_group_is_cut_into_about_root_n_parts_of_two_or_more() {
        let sizes = |n| split(&names(n)).iter().map(Vec::len).collect::<Vec<_>>();
        assert_eq!(sizes(3), vec![2, 1]);
        assert_eq!(sizes(4), vec![2, 2]);
        assert_eq!(sizes(16), vec![4, 4, 4, 4]);
        assert_eq!(sizes(10), vec![4, 4, 2]);
        assert_eq!(split(&names(1000)).len(), 32);
    }

    #[test]
    fn faults_between_read_in_words() {
        let f = BetweenFault::Groups {
            kind: FabricKind::Nccl,
            a: names(6),
            b: vec!["m1".into()],
            why: "fabric round 4: 120.0 GB/s below 350".into(),
        };
        let s = f.to_string();
        assert!(
            s.contains("[n00, n01, n02, n03 and 2 more] and [m1]"),
            "{s}"
        );
    }
}
