//! Kubernetes-style durations (`90s`, `5m`, `1h30m`, `24h`) as they appear in the spec.

use std::{borrow::Cow, fmt, str::FromStr};

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The pattern the API server enforces on every duration field: one or more `<number><unit>`
/// groups, units `ms`, `s`, `m`, `h`; no sign, so negative durations are rejected.
pub const DURATION_PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$";

/// A non-negative duration written the Kubernetes way (`metav1.Duration`, Go's
/// `time.ParseDuration` without a sign): `500ms`, `90s`, `5m`, `1h30m`, `24h`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Duration(std::time::Duration);

/// Why a duration string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("empty duration: write it like 90s, 5m or 1h30m")]
    Empty,
    #[error("invalid duration {input:?}: {why}; write it like 90s, 5m or 1h30m")]
    Invalid { input: String, why: &'static str },
}

impl Duration {
    pub const fn from_secs(secs: u64) -> Self {
        Self(std::time::Duration::from_secs(secs))
    }
    pub const fn from_std(d: std::time::Duration) -> Self {
        Self(d)
    }
    pub const fn as_std(&self) -> std::time::Duration {
        self.0
    }
    pub fn as_secs_f64(&self) -> f64 {
        self.0.as_secs_f64()
    }
}

impl From<Duration> for std::time::Duration {
    fn from(d: Duration) -> Self {
        d.0
    }
}

impl FromStr for Duration {
    type Err = DurationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() {
            return Err(DurationError::Empty);
        }
        let invalid = |why| DurationError::Invalid {
            input: s.to_string(),
            why,
        };
        let bytes = s.as_bytes();
        let mut i = 0;
        let mut total_nanos: f64 = 0.0;
        while i < bytes.len() {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_digit() || bytes[i] == b'.') {
                i += 1;
            }
            if start == i {
                return Err(invalid(if bytes[i] == b'-' {
                    "negative durations are not allowed"
                } else {
                    "expected a number"
                }));
            }
            let number: f64 = s[start..i]
                .parse()
                .map_err(|_| invalid("malformed number"))?;
            let unit_start = i;
            while i < bytes.len() && bytes[i].is_ascii_alphabetic() {
                i += 1;
            }
            let nanos_per_unit = match &s[unit_start..i] {
                "ms" => 1e6,
                "s" => 1e9,
                "m" => 60e9,
                "h" => 3600e9,
                "" => return Err(invalid("missing unit (ms, s, m or h)")),
                _ => return Err(invalid("unknown unit (use ms, s, m or h)")),
            };
            total_nanos += number * nanos_per_unit;
        }
        if !total_nanos.is_finite() || total_nanos > u64::MAX as f64 {
            return Err(invalid("too large"));
        }
        Ok(Self(std::time::Duration::from_nanos(
            total_nanos.round() as u64
        )))
    }
}

impl fmt::Display for Duration {
    /// Formats as the shortest exact combination of `h`, `m`, `s`, `ms` (`1h30m`, `90ms`, `0s`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total_ms = self.0.as_millis();
        if total_ms == 0 {
            return f.write_str("0s");
        }
        let (h, rest) = (total_ms / 3_600_000, total_ms % 3_600_000);
        let (m, rest) = (rest / 60_000, rest % 60_000);
        let (s, ms) = (rest / 1000, rest % 1000);
        if h > 0 {
            write!(f, "{h}h")?;
        }
        if m > 0 {
            write!(f, "{m}m")?;
        }
        if s > 0 {
            write!(f, "{s}s")?;
        }
        if ms > 0 {
            write!(f, "{ms}ms")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Duration({self})")
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = Cow::<'de, str>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for Duration {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "maxLength": 32,
            "pattern": DURATION_PATTERN,
            "description": "A duration such as 90s, 5m, 1h30m or 24h (units ms, s, m, h; no sign).",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kubernetes_style_durations() {
        let cases = [
            ("90s", 90_000),
            ("5m", 300_000),
            ("1h30m", 5_400_000),
            ("24h", 86_400_000),
            ("1.5h", 5_400_000),
            ("250ms", 250),
            ("0s", 0),
        ];
        for (text, ms) in cases {
            let d: Duration = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(d.as_std().as_millis(), ms, "{text}");
        }
    }

    #[test]
    fn rejects_bad_durations_with_a_reason() {
        for (text, why) in [
            ("", "empty"),
            ("-5m", "negative"),
            ("5", "missing unit"),
            ("5d", "unknown unit"),
            ("m5", "expected a number"),
            ("1..5s", "malformed"),
        ] {
            let err = text.parse::<Duration>().unwrap_err().to_string();
            assert!(
                err.contains(why),
                "{text:?} gave {err:?}, expected it to mention {why:?}"
            );
        }
    }

    #[test]
    fn display_round_trips() {
        for text in ["0s", "90ms", "1m30s", "2h", "1h1m1s1ms"] {
            let d: Duration = text.parse().unwrap();
            assert_eq!(d.to_string(), text);
            assert_eq!(d.to_string().parse::<Duration>().unwrap(), d);
        }
        assert_eq!("90s".parse::<Duration>().unwrap().to_string(), "1m30s");
    }

    #[test]
    fn pattern_agrees_with_parser_on_sign_and_units() {
        // The schema pattern is what the API server enforces (tests/tests/api.rs sends it bad
        // durations); keep its units in step with FromStr and allow no sign before a group.
        assert!(DURATION_PATTERN.contains("(ms|s|m|h)"));
        assert!(
            DURATION_PATTERN.starts_with("^([0-9]"),
            "a duration starts with a digit, never a sign"
        );
        for unit in ["ms", "s", "m", "h"] {
            assert!(format!("3{unit}").parse::<Duration>().is_ok(), "{unit}");
        }
    }
}
