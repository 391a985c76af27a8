//! How the API spells the values of its enums (a leaf: it names nothing of the crate): one
//! table per enum gives `ALL`, `as_str` and `Display` ([`api_spelling!`]); a value is parsed
//! exactly as the API writes it ([`parse_named`], refused with [`UnknownValue`]) or loosely, as
//! on a command line ([`loosely_named`]).

/// A string that names none of an enum's values (as written in the API).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} '{value}': use one of {expected}")]
pub struct UnknownValue {
    /// What was being parsed (`phase`, `node verdict`, `verdict`).
    pub kind: &'static str,
    /// The string as given.
    pub value: String,
    /// The accepted values, comma-separated.
    pub expected: String,
}

/// Finds the value of `all` whose API name is `s` (exact, as the API writes it).
pub(crate) fn parse_named<T: Copy>(
    s: &str,
    all: &[T],
    name: impl Fn(T) -> &'static str,
    kind: &'static str,
) -> Result<T, UnknownValue> {
    all.iter()
        .copied()
        .find(|v| name(*v) == s)
        .ok_or_else(|| UnknownValue {
            kind,
            value: s.to_string(),
            expected: all.iter().map(|v| name(*v)).collect::<Vec<_>>().join(", "),
        })
}

/// Finds the value of `all` whose API name is `s` written loosely, as on a command line: any
/// case, `_` and `-` ignored (`moving-inversions`, `ALL_REDUCE`).
pub(crate) fn loosely_named<T: Copy>(
    s: &str,
    all: &[T],
    name: impl Fn(T) -> &'static str,
) -> Option<T> {
    let wanted: String = s.chars().filter(|c| *c != '_' && *c != '-').collect();
    all.iter()
        .copied()
        .find(|v| name(*v).eq_ignore_ascii_case(&wanted))
}

/// `ALL` (in declaration order), `as_str` and `Display` of a field-less API enum, from one table
/// of the spelling the API writes for each value.
macro_rules! api_spelling {
    ($ty:ident { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $ty {
            /// Every value, in declaration order.
            pub const ALL: [$ty; [$($name),+].len()] = [$($ty::$variant),+];

            /// The value as the API writes it.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $name,)+
                }
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}
pub(crate) use api_spelling;
