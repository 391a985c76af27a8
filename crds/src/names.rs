//! Kubernetes' syntax for object names, label keys and label values, as the API server checks
//! them for built-in kinds (apimachinery's `IsDNS1123Label`, `IsDNS1123Subdomain`,
//! `IsQualifiedName` and `IsValidLabelValue`): the same expressions and lengths, as schema
//! patterns for the CRDs and as plain checks for Rust code.

use std::sync::LazyLock;

use regex::Regex;

/// The longest DNS-1123 label (a pod's hostname, a label value).
pub const DNS1123_LABEL_MAX: usize = 63;
/// The longest DNS-1123 subdomain (most object names, node names).
pub const DNS1123_SUBDOMAIN_MAX: usize = 253;
/// The longest name part of a label key (after the optional `prefix/`).
pub const LABEL_NAME_MAX: usize = 63;
/// The longest label value.
pub const LABEL_VALUE_MAX: usize = 63;
/// The longest label key: a subdomain prefix, `/`, a name.
pub const LABEL_KEY_MAX: usize = DNS1123_SUBDOMAIN_MAX + 1 + LABEL_NAME_MAX;

/// One DNS-1123 label, unanchored: lower-case alphanumerics and `-`, alphanumeric at both ends.
pub const DNS1123_LABEL: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
/// A DNS-1123 subdomain, unanchored: labels joined by `.`.
pub const DNS1123_SUBDOMAIN: &str =
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
/// The name part of a label key, unanchored: alphanumerics, `-`, `_`, `.`, alphanumeric at both
/// ends. Also the shape of a non-empty label value.
pub const LABEL_NAME: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";

/// Anchored pattern of a label value (empty, or [`LABEL_NAME`]); length is checked apart.
pub const LABEL_VALUE_PATTERN: &str = "^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$";
/// Anchored pattern of a node name (a non-empty DNS-1123 subdomain); length is checked apart.
pub const NODE_NAME_PATTERN: &str =
    "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// Anchored expression of a label key with its name part's length bound built in:
/// `[subdomain/]name`. The prefix's own bound (253) needs a separate length check, which
/// [`label_key_cel`] and [`is_label_key`] add.
pub const LABEL_KEY_PATTERN: &str = "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$";

/// What a label key looks like, in words (part of the message of every rule that checks one).
pub const LABEL_KEY_FORM: &str = "a label key: an optional DNS subdomain prefix of at most 253 characters and '/', then a name of at most 63 characters of alphanumerics, '-', '_' or '.' that starts and ends with an alphanumeric (e.g. 'example.com/my-name' or 'zone')";

/// The CEL expression (for `x-kubernetes-validations`) that is true when the string `var` is a
/// valid label key: the same test as [`is_label_key`].
pub fn label_key_cel(var: &str) -> String {
    format!(
        "{var}.matches(r'{LABEL_KEY_PATTERN}') && (!{var}.contains('/') || {var}.indexOf('/') <= {DNS1123_SUBDOMAIN_MAX})"
    )
}

/// Compiles one of this crate's constant patterns (each is exercised by the tests).
pub(crate) fn regex(pattern: &'static str) -> Regex {
    Regex::new(pattern).expect("a constant pattern of this crate compiles")
}

static LABEL_VALUE_RE: LazyLock<Regex> = LazyLock::new(|| regex(LABEL_VALUE_PATTERN));
static NODE_NAME_RE: LazyLock<Regex> = LazyLock::new(|| regex(NODE_NAME_PATTERN));
static LABEL_KEY_RE: LazyLock<Regex> = LazyLock::new(|| regex(LABEL_KEY_PATTERN));
static DNS1123_LABEL_RE: LazyLock<Regex> =
    LazyLock::new(|| regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"));

/// A DNS-1123 label: at most 63 characters, lower-case alphanumerics and `-`, alphanumeric at
/// both ends.
pub fn is_dns1123_label(s: &str) -> bool {
    s.len() <= DNS1123_LABEL_MAX && DNS1123_LABEL_RE.is_match(s)
}

/// A DNS-1123 subdomain: at most 253 characters, DNS-1123 labels joined by `.`.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= DNS1123_SUBDOMAIN_MAX && NODE_NAME_RE.is_match(s)
}

/// A label value: empty, or at most 63 characters of alphanumerics, `-`, `_`, `.` with an
/// alphanumeric at both ends.
pub fn is_label_value(s: &str) -> bool {
    s.len() <= LABEL_VALUE_MAX && LABEL_VALUE_RE.is_match(s)
}

/// A label key (Kubernetes' "qualified name"): an optional DNS-1123 subdomain prefix of at most
/// 253 characters and `/`, then a name part of at most 63 characters.
pub fn is_label_key(s: &str) -> bool {
    LABEL_KEY_RE.is_match(s)
        && s.find('/')
            .is_none_or(|slash| slash <= DNS1123_SUBDOMAIN_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_patterns_are_built_from_the_upstream_pieces() {
        assert_eq!(
            DNS1123_SUBDOMAIN,
            format!("{DNS1123_LABEL}(\\.{DNS1123_LABEL})*")
        );
        assert_eq!(NODE_NAME_PATTERN, format!("^{DNS1123_SUBDOMAIN}$"));
        assert_eq!(LABEL_VALUE_PATTERN, format!("^({LABEL_NAME})?$"));
        // The key's name part is LABEL_NAME with its 63-character bound written into it.
        assert!(LABEL_KEY_PATTERN.starts_with(&format!("^({DNS1123_SUBDOMAIN}/)?")));
        assert_eq!(LABEL_KEY_MAX, 317);
    }

    #[test]
    fn labels_and_subdomains() {
        for ok in ["a", "0", "gpu-0", &"a".repeat(63)] {
            assert!(is_dns1123_label(ok), "{ok}");
            assert!(is_dns1123_subdomain(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", &"a".repeat(64)] {
            assert!(!is_dns1123_label(bad), "{bad}");
        }
        assert!(is_dns1123_subdomain("ip-10-0-0-1.ec2.internal"));
        let longest = format!("{}.{}", "a".repeat(126), "b".repeat(126));
        assert!(is_dns1123_subdomain(&longest));
        for bad in [
            "",
            "a..b",
            "a.-b",
            "a-.b",
            ".a",
            "a.",
            "Gpu",
            &format!("{longest}c"),
        ] {
            assert!(!is_dns1123_subdomain(bad), "{bad}");
        }
    }

    #[test]
    fn label_values() {
        for ok in ["", "true", "a_b.c-d", "A", &"x".repeat(63)] {
            assert!(is_label_value(ok), "{ok:?}");
        }
        for bad in ["-a", "a-", "_", "a b", "a/b", "ü", &"x".repeat(64)] {
            assert!(!is_label_value(bad), "{bad:?}");
        }
    }

    #[test]
    fn label_keys() {
        let prefix_253 = format!("{}.{}", "a".repeat(126), "b".repeat(126));
        for ok in [
            "zone",
            "nvidia.com/gpu.present",
            "node.kubernetes.io/instance-type",
            "A_b.C",
            &"n".repeat(63),
            &format!("{prefix_253}/n"),
            &format!("example.com/{}", "n".repeat(63)),
        ] {
            assert!(is_label_key(ok), "{ok}");
        }
        for bad in [
            "",
            "a b",
            "bad!",
            "/name",
            "example.com/",
            "a/b/c",
            "Example.com/name",
            "-a",
            &"n".repeat(64),
            &format!("{prefix_253}c/n"),
            &format!("example.com/{}", "n".repeat(64)),
        ] {
            assert!(!is_label_key(bad), "{bad:?}");
        }
    }

    #[test]
    fn the_cel_key_check_uses_the_same_pattern_and_prefix_bound() {
        let cel = label_key_cel("k");
        assert!(cel.contains(LABEL_KEY_PATTERN));
        assert!(cel.contains("k.indexOf('/') <= 253"));
    }
}
