//! The names and label values the operator and agent build from a validation's name and a
//! node's name are always valid: a property test over random validation and node names up to
//! Kubernetes' limits (DNS-1123 subdomains of up to 253 characters), seeded so a failure
//! repeats, checked with the API crate's own DNS-1123 and label checks.

use gpuval_crds::{labels, names, result::result_name};
use rand::{RngExt, SeedableRng, rngs::StdRng};

const CASES: usize = 20_000;
const SEED: u64 = 0x6770_7576_616c;

/// One DNS-1123 label of `len` characters (1..=63): alphanumerics and `-`, alphanumeric ends.
fn dns_label(rng: &mut StdRng, len: usize) -> String {
    const ENDS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    const INNER: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789---";
    (0..len)
        .map(|i| {
            let set = if i == 0 || i + 1 == len { ENDS } else { INNER };
            set[rng.random_range(0..set.len())] as char
        })
        .collect()
}

/// A random DNS-1123 subdomain of at most `max` characters: mostly long ones (near the limit,
/// where names get cut) made of short and long labels, so cuts land on `.`, `-` and letters.
fn subdomain(rng: &mut StdRng, max: usize) -> String {
    let target = if rng.random_bool(0.7) {
        rng.random_range(max.saturating_sub(40).max(1)..=max)
    } else {
        rng.random_range(1..=max)
    };
    let mut name = String::new();
    loop {
        let room = target - name.len();
        let short = rng.random_bool(0.5);
        let len = if short {
            rng.random_range(1..=3)
        } else {
            rng.random_range(1..=63)
        }
        .min(room);
        if len == 0 {
            break;
        }
        name.push_str(&dns_label(rng, len));
        if target - name.len() < 2 {
            break;
        }
        name.push('.');
    }
    name.trim_end_matches('.').to_string()
}

#[test]
fn the_generator_covers_the_limits() {
    let mut rng = StdRng::seed_from_u64(SEED);
    let names: Vec<String> = (0..2000)
        .map(|_| subdomain(&mut rng, names::DNS1123_SUBDOMAIN_MAX))
        .collect();
    assert!(names.iter().all(|n| names::is_dns1123_subdomain(n)));
    assert!(names.iter().any(|n| n.len() == 253));
    assert!(names.iter().any(|n| n.len() < 20));
    assert!(names.iter().any(|n| n.contains('.') && n.contains('-')));
}

#[test]
fn result_names_are_always_dns_subdomains() {
    let mut rng = StdRng::seed_from_u64(SEED);
    let mut shortened = 0;
    for case in 0..CASES {
        let validation = subdomain(&mut rng, names::DNS1123_SUBDOMAIN_MAX);
        let node = subdomain(&mut rng, names::DNS1123_SUBDOMAIN_MAX);
        let name = result_name(&validation, &node);
        assert!(
            names::is_dns1123_subdomain(&name),
            "case {case}: result_name({validation:?}, {node:?}) = {name:?} is not a DNS-1123 subdomain"
        );
        assert_eq!(name, result_name(&validation, &node), "stable");
        if name != gpuval_crds::result::run_node_key(&validation, &node) {
            shortened += 1;
        }
    }
    assert!(
        shortened > CASES / 4,
        "only {shortened} cases were long enough to be cut"
    );
}

#[test]
fn label_values_of_names_are_always_valid() {
    let mut rng = StdRng::seed_from_u64(SEED ^ 1);
    for case in 0..CASES {
        let name = subdomain(&mut rng, names::DNS1123_SUBDOMAIN_MAX);
        let value = labels::node_value(&name);
        assert!(
            names::is_label_value(&value),
            "case {case}: node_value({name:?}) = {value:?} is not a label value"
        );
        if name.len() <= names::LABEL_VALUE_MAX {
            assert_eq!(value, name);
        }
    }
}

/// Pod names are the operator's (`gpuval_operator::decide::pod::pod_name`, the API crate's
/// `agent_pod_name`); they must be DNS-1123
/// subdomains (the API server's rule for pod names) of at most 63 characters (the function's
/// promise: a pod name becomes the pod's hostname).
#[test]
fn pod_names_are_always_dns_subdomains_of_at_most_63_characters() {
    let mut rng = StdRng::seed_from_u64(SEED ^ 2);
    for case in 0..CASES {
        let validation = subdomain(&mut rng, names::DNS1123_SUBDOMAIN_MAX);
        let node = subdomain(&mut rng, names::DNS1123_SUBDOMAIN_MAX);
        let generation = if rng.random_bool(0.5) {
            rng.random_range(1..100)
        } else {
            rng.random_range(1..i64::MAX)
        };
        let name = gpuval_operator::decide::pod::pod_name(&validation, &node, generation);
        assert!(
            names::is_dns1123_subdomain(&name) && name.len() <= names::DNS1123_LABEL_MAX,
            "case {case}: pod_name({validation:?}, {node:?}, {generation}) = {name:?}"
        );
    }
}
