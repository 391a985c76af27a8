//! Kubernetes-style durations (`90s`, `5m`, `1h30m`, `24h`) as they appear in the spec, and the
//! one schema rule that bounds a duration field.

use std::{borrow::Cow, fmt, str::FromStr};

use schemars::json_schema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The form every duration field accepts: one or more `<number><unit>` groups, units `ms`, `s`,
/// `m`, `h`, no sign. The digits before each unit are capped (12 for ms, 9 for s, 7 for m, 5 for
/// h) so that no string of at most [`MAX_LEN`] characters can overflow the API server's
/// duration type: the schema rule tests this pattern before it converts the string.
pub const DURATION_PATTERN: &str = r"^([0-9]{1,12}(\.[0-9]+)?ms|[0-9]{1,9}(\.[0-9]+)?s|[0-9]{1,7}(\.[0-9]+)?m|[0-9]{1,5}(\.[0-9]+)?h)+$";

/// The longest duration string a field accepts.
pub const MAX_LEN: usize = 32;

/// The accepted form, in words (part of every duration field's message).
pub const DURATION_FORM: &str =
    "written like 90s, 5m or 1h30m (units ms, s, m, h; no sign: a duration is never negative)";

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
    pub const fn from_millis(millis: u64) -> Self {
        Self(std::time::Duration::from_millis(millis))
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

/// The largest duration Go (and so the API server) can hold: `i64::MAX` nanoseconds.
const MAX_NANOS: u64 = i64::MAX as u64;

/// One `<number><unit>` group, read the way Go's `time.ParseDuration` reads it: the integer part
/// exactly, the fraction scaled to the unit and truncated to whole nanoseconds.
struct Group {
    int: u64,
    fraction: u64,
    scale: f64,
    nanos_per_unit: u64,
}

impl Group {
    fn nanos(&self) -> Option<u64> {
        let mut v = self.int.checked_mul(self.nanos_per_unit)?;
        if self.fraction > 0 {
            // Go: v += uint64(float64(f) * (float64(unit) / scale)), truncating.
            let frac = (self.fraction as f64 * (self.nanos_per_unit as f64 / self.scale)) as u64;
            v = v.checked_add(frac)?;
        }
        (v <= MAX_NANOS).then_some(v)
    }
}

/// Reads digits from `bytes[*i..]`: the value (None on overflow) and how many digits there were.
fn leading_int(bytes: &[u8], i: &mut usize) -> (Option<u64>, usize) {
    let start = *i;
    let mut value = Some(0u64);
    while *i < bytes.len() && bytes[*i].is_ascii_digit() {
        let digit = u64::from(bytes[*i] - b'0');
        value = value
            .and_then(|v| v.checked_mul(10))
            .and_then(|v| v.checked_add(digit))
            .filter(|v| *v <= MAX_NANOS);
        *i += 1;
    }
    (value, *i - start)
}

/// Reads fraction digits the way Go does: digits past what fits are read and dropped.
fn leading_fraction(bytes: &[u8], i: &mut usize) -> (u64, f64, usize) {
    let start = *i;
    let (mut value, mut scale, mut full) = (0u64, 1.0f64, false);
    while *i < bytes.len() && bytes[*i].is_ascii_digit() {
        if !full {
            match value
                .checked_mul(10)
                .and_then(|v| v.checked_add(u64::from(bytes[*i] - b'0')))
                .filter(|v| *v <= MAX_NANOS)
            {
                Some(v) => {
                    value = v;
                    scale *= 10.0;
                }
                None => full = true,
            }
        }
        *i += 1;
    }
    (value, scale, *i - start)
}

fn unit_nanos(unit: &str) -> Option<u64> {
    match unit {
        "ms" => Some(1_000_000),
        "s" => Some(1_000_000_000),
        "m" => Some(60_000_000_000),
        "h" => Some(3_600_000_000_000),
        _ => None,
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
        let mut total: u64 = 0;
        while i < bytes.len() {
            let (int, digits) = leading_int(bytes, &mut i);
            if digits == 0 {
                return Err(invalid(match bytes[i] {
                    b'-' => "negative durations are not allowed",
                    b'+' => "a sign is not allowed",
                    _ => "expected a number",
                }));
            }
            let int = int.ok_or_else(|| invalid("too large"))?;
            let (fraction, scale) = if bytes.get(i) == Some(&b'.') {
                i += 1;
                let (fraction, scale, digits) = leading_fraction(bytes, &mut i);
                if digits == 0 {
                    return Err(invalid("malformed number"));
                }
                (fraction, scale)
            } else {
                (0, 1.0)
            };
            let unit_start = i;
            while i < bytes.len() && !bytes[i].is_ascii_digit() && bytes[i] != b'.' {
                i += 1;
            }
            let nanos_per_unit = match &s[unit_start..i] {
                "" => return Err(invalid("missing unit (ms, s, m or h)")),
                unit => {
                    unit_nanos(unit).ok_or_else(|| invalid("unknown unit (use ms, s, m or h)"))?
                }
            };
            let group = Group {
                int,
                fraction,
                scale,
                nanos_per_unit,
            };
            total = group
                .nanos()
                .and_then(|n| total.checked_add(n))
                .filter(|t| *t <= MAX_NANOS)
                .ok_or_else(|| invalid("too large"))?;
        }
        Ok(Self(std::time::Duration::from_nanos(total)))
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

// A string of bounded length; its form and range are one rule on the field
// ([`DurationRange::rule`]), so that a bad value gets one message.
crate::schema_inline::inline_schema!(Duration, |_| json_schema!({
    "type": "string",
    "maxLength": MAX_LEN,
    "description": "A duration such as 90s, 5m, 1h30m or 24h (units ms, s, m, h; no sign).",
}));

/// The range a duration field accepts, and the one schema rule that enforces its form and range
/// together: the rule tests [`DURATION_PATTERN`] before it converts the string, so a malformed,
/// overflowing or out-of-range value gets one message (the API server puts the value before it).
/// The validator of [`crate::validate`] recognises the rules this makes ([`Self::from_rule`]) and
/// decides them the same way ([`Self::check`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DurationRange {
    pub min: Duration,
    pub max: Duration,
}

const RULE_START: &str = "self.matches(r'";
const RULE_MIN: &str = "') && duration(self) >= duration('";
const RULE_MAX: &str = "') && duration(self) <= duration('";
const RULE_END: &str = "')";

impl DurationRange {
    pub const fn new(min: Duration, max: Duration) -> Self {
        Self { min, max }
    }

    /// The CEL expression: form first, then the range.
    pub fn rule_text(&self) -> String {
        format!(
            "{RULE_START}{DURATION_PATTERN}{RULE_MIN}{}{RULE_MAX}{}{RULE_END}",
            self.min, self.max
        )
    }

    /// The message: the range and the accepted form.
    pub fn message(&self) -> String {
        format!(
            "must be a duration from {} to {}, {DURATION_FORM}",
            self.min, self.max
        )
    }

    /// The rule for `x-kubernetes-validations`.
    pub fn rule(&self) -> kube::core::Rule {
        kube::core::Rule::new(self.rule_text()).message(self.message().as_str())
    }

    /// Recognises a rule made by [`Self::rule_text`] and gives back its range.
    pub fn from_rule(rule: &str) -> Option<Self> {
        let rest = rule
            .strip_prefix(RULE_START)?
            .strip_prefix(DURATION_PATTERN)?
            .strip_prefix(RULE_MIN)?
            .strip_suffix(RULE_END)?;
        let (min, max) = rest.split_once(RULE_MAX)?;
        let range = Self::new(min.parse().ok()?, max.parse().ok()?);
        (range.rule_text() == rule).then_some(range)
    }

    /// What the rule decides for `value`: `Err` with the rule's message when it fails.
    pub fn check(&self, value: &str) -> Result<(), String> {
        let in_range = matches_pattern(value)
            && value
                .parse::<Duration>()
                .is_ok_and(|d| d >= self.min && d <= self.max);
        if in_range {
            Ok(())
        } else {
            Err(self.message())
        }
    }
}

/// Whether `value` has the form of [`DURATION_PATTERN`].
pub fn matches_pattern(value: &str) -> bool {
    static PATTERN: std::sync::LazyLock<regex::Regex> =
        std::sync::LazyLock::new(|| crate::names::regex(DURATION_PATTERN));
    PATTERN.is_match(value)
}

/// A string quoted the way CEL's `strings.quote` quotes it.
pub fn cel_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Default for `spec.deadline`.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(3600);

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
            ("+5m", "sign"),
            ("5", "missing unit"),
            ("5d", "unknown unit"),
            ("m5", "expected a number"),
            ("1..5s", "malformed"),
            ("5.s", "malformed"),
            ("9999999999999999999h", "too large"),
            ("2562048h", "too large"),
            ("2562047h2562047h", "too large"),
        ] {
            let err = text.parse::<Duration>().unwrap_err().to_string();
            assert!(
                err.contains(why),
                "{text:?} gave {err:?}, expected it to mention {why:?}"
            );
        }
    }

    #[test]
    fn fractions_truncate_to_nanoseconds_like_go() {
        // Go: 9999999999 * (1e9 / 1e10) = 999999999.9, truncated; rounding would give 10s.
        let d: Duration = "9.9999999999s".parse().unwrap();
        assert_eq!(d.as_std(), std::time::Duration::from_nanos(9_999_999_999));
        let d: Duration = "0.1234567891234567891234s".parse().unwrap();
        assert_eq!(d.as_std().as_nanos(), 123_456_789);
        assert_eq!(
            "2562047h".parse::<Duration>().unwrap().as_std().as_secs(),
            2_562_047 * 3600
        );
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
    fn the_pattern_accepts_what_the_parser_reads_and_cannot_overflow() {
        for ok in [
            "0s",
            "90s",
            "1.5h",
            "250ms",
            "1h30m",
            "999999999999ms",
            "99999h",
        ] {
            assert!(matches_pattern(ok), "{ok}");
            assert!(ok.parse::<Duration>().is_ok(), "{ok}");
        }
        for bad in [
            "", "-5m", "+5m", "5", "5d", "1..5s", ".5s", "5.s", "100000h", "1 h", "1H",
        ] {
            assert!(!matches_pattern(bad), "{bad}");
        }
        // No string of at most MAX_LEN characters that has the form can overflow: no group
        // carries more than MAX / MAX_LEN nanoseconds a character.
        let longest_ok = "999999999s999999999s999999999s9s";
        assert_eq!(longest_ok.len(), MAX_LEN);
        assert!(matches_pattern(longest_ok));
        let d: Duration = longest_ok.parse().unwrap();
        assert!(d.as_std().as_nanos() < u128::from(MAX_NANOS));
        for group in ["999999999999ms", "999999999s", "9999999m", "99999h"] {
            let per_char =
                group.parse::<Duration>().unwrap().as_std().as_nanos() / group.len() as u128;
            assert!(
                per_char * MAX_LEN as u128 <= u128::from(MAX_NANOS),
                "{group}: {MAX_LEN} characters of it could overflow"
            );
        }
    }

    #[test]
    fn a_range_rule_is_recognised_and_checks_form_and_range_in_one_message() {
        let range = DurationRange::new(Duration::from_secs(10), Duration::from_secs(168 * 3600));
        let rule = range.rule_text();
        assert_eq!(DurationRange::from_rule(&rule), Some(range));
        assert_eq!(DurationRange::from_rule(&rule.replace("10s", "10d")), None);
        assert_eq!(DurationRange::from_rule("self.size() > 0"), None);
        assert!(
            rule.starts_with("self.matches("),
            "form before duration(): {rule}"
        );
        for ok in ["10s", "168h", "5m", "10000ms"] {
            assert_eq!(range.check(ok), Ok(()), "{ok}");
        }
        for bad in [
            "9s",
            "9999ms",
            "168h1ms",
            "2d",
            "-5m",
            "",
            "999999999h",
            "5m\n",
        ] {
            let msg = range.check(bad).unwrap_err();
            assert_eq!(msg, range.message(), "{bad}");
        }
        assert!(
            range
                .message()
                .starts_with("must be a duration from 10s to 168h, written like")
        );
        assert!(range.message().contains("negative"));
        assert_eq!(cel_quote("a\nb\"c\\"), "\"a\\nb\\\"c\\\\\"");
        let kube::core::Rule { message, .. } = range.rule();
        assert_eq!(message, Some(kube::core::Message::Message(range.message())));
    }
}
