//! Cron expressions for `GpuValidationSchedule.spec.schedule` (pure: the caller passes the time).
//!
//! Five fields, as CronJob reads them, evaluated in UTC: minute (0-59), hour (0-23), day of
//! month (1-31), month (1-12 or JAN-DEC), day of week (0-6 or SUN-SAT, 7 is Sunday too). Each
//! field is `*`, a value, a range `a-b`, any of those with a step `/n`, or a comma list of
//! them. When both day fields are restricted, a day matching either one fires (as in cron).
//! The shorthands `@yearly` (`@annually`), `@monthly`, `@weekly`, `@daily` (`@midnight`) and
//! `@hourly` stand for their usual five fields.

use std::fmt;
use std::str::FromStr;

use k8s_openapi::jiff::civil::{DateTime, date};
use k8s_openapi::jiff::tz::TimeZone;
use k8s_openapi::jiff::{Span, Timestamp};

/// How far ahead [`Cron::next_after`] looks before it decides a schedule never fires again
/// (a leap day fires at least once in eight years).
const HORIZON_YEARS: i16 = 8;

/// Why a cron expression is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CronError {
    #[error(
        "schedule {0:?} has {1} field(s); write five (minute hour day-of-month month day-of-week, e.g. \"0 */4 * * *\") or a shorthand such as @hourly"
    )]
    FieldCount(String, usize),
    #[error("schedule {expr:?}: {field} {item:?} is not a number or name in {min}-{max}")]
    Value {
        expr: String,
        field: &'static str,
        item: String,
        min: u8,
        max: u8,
    },
    #[error(
        "schedule {expr:?}: {field} range {item:?} runs backwards; write the smaller value first"
    )]
    Backwards {
        expr: String,
        field: &'static str,
        item: String,
    },
    #[error("schedule {expr:?}: {field} step in {item:?} must be a number from 1 to {max}")]
    Step {
        expr: String,
        field: &'static str,
        item: String,
        max: u8,
    },
    #[error(
        "schedule {0:?} never fires (no such date, e.g. 30 February); pick a day that every matching month has"
    )]
    Never(String),
    #[error("schedule {0:?}: unknown shorthand; use @yearly, @monthly, @weekly, @daily or @hourly")]
    Shorthand(String),
}

/// One field's range and names.
struct Field {
    name: &'static str,
    min: u8,
    max: u8,
    names: &'static [&'static str],
}

const MINUTE: Field = field("minute", 0, 59, &[]);
const HOUR: Field = field("hour", 0, 23, &[]);
const DAY: Field = field("day of month", 1, 31, &[]);
const MONTH: Field = field(
    "month",
    1,
    12,
    &[
        "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
    ],
);
const WEEKDAY: Field = field(
    "day of week",
    0,
    7,
    &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"],
);

const fn field(name: &'static str, min: u8, max: u8, names: &'static [&'static str]) -> Field {
    Field {
        name,
        min,
        max,
        names,
    }
}

/// A parsed cron expression: one bit set per allowed value of each field.
#[derive(Clone, PartialEq, Eq)]
pub struct Cron {
    text: String,
    minutes: u64,
    hours: u64,
    days: u64,
    months: u64,
    weekdays: u64,
    /// Day of month was `*` (then only the weekday restricts days, and the other way round).
    any_day: bool,
    any_weekday: bool,
}

impl fmt::Debug for Cron {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Cron({:?})", self.text)
    }
}

impl fmt::Display for Cron {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl FromStr for Cron {
    type Err = CronError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Cron::parse(s)
    }
}

impl Cron {
    /// Parses `expr` (see the module's documentation).
    pub fn parse(expr: &str) -> Result<Cron, CronError> {
        let expr = expr.trim();
        let expanded = match expr {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            s if s.starts_with('@') => return Err(CronError::Shorthand(s.into())),
            s => s,
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        let [m, h, d, mo, w] = fields[..] else {
            return Err(CronError::FieldCount(expr.into(), fields.len()));
        };
        let mut weekdays = parse_field(expr, w, &WEEKDAY)?;
        if weekdays & (1 << 7) != 0 {
            weekdays = (weekdays | 1) & !(1 << 7);
        }
        let cron = Cron {
            text: expr.to_string(),
            minutes: parse_field(expr, m, &MINUTE)?,
            hours: parse_field(expr, h, &HOUR)?,
            days: parse_field(expr, d, &DAY)?,
            months: parse_field(expr, mo, &MONTH)?,
            weekdays,
            any_day: d == "*" || d.starts_with("*/"),
            any_weekday: w == "*" || w.starts_with("*/"),
        };
        let probe = Timestamp::from_second(946_684_800).unwrap_or(Timestamp::UNIX_EPOCH);
        if cron.next_after(probe).is_none() {
            return Err(CronError::Never(expr.into()));
        }
        Ok(cron)
    }

    /// The first time after `t` (strictly) that this schedule fires, on a whole minute; None
    /// when it does not fire within eight years.
    pub fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        let utc = TimeZone::UTC;
        let now = utc.to_datetime(t);
        let mut dt = now
            .date()
            .at(now.hour(), now.minute(), 0, 0)
            .checked_add(Span::new().minutes(1))
            .ok()?;
        let limit = now.year().saturating_add(HORIZON_YEARS);
        while dt.year() <= limit {
            if !bit(self.months, dt.month()) {
                dt = next_month(dt)?;
            } else if !self.day_matches(dt) {
                dt = dt.date().tomorrow().ok()?.at(0, 0, 0, 0);
            } else if !bit(self.hours, dt.hour()) {
                dt = dt
                    .date()
                    .at(dt.hour(), 0, 0, 0)
                    .checked_add(Span::new().hours(1))
                    .ok()?;
            } else if !bit(self.minutes, dt.minute()) {
                dt = dt.checked_add(Span::new().minutes(1)).ok()?;
            } else {
                return utc.to_timestamp(dt).ok();
            }
        }
        None
    }

    /// The latest time in `(after, now]` this schedule fires, if any. Looks at most a week
    /// back from `now` (older slots are missed, as a CronJob without a starting deadline
    /// would run only the latest one anyway).
    pub fn latest_in(&self, after: Timestamp, now: Timestamp) -> Option<Timestamp> {
        let week_ago = now.checked_sub(Span::new().hours(24 * 7)).unwrap_or(after);
        let mut t = after.max(week_ago);
        let mut latest = None;
        while let Some(n) = self.next_after(t) {
            if n > now {
                break;
            }
            latest = Some(n);
            t = n;
        }
        latest
    }

    fn day_matches(&self, dt: DateTime) -> bool {
        let day = bit(self.days, dt.day());
        let weekday = bit(self.weekdays, dt.weekday().to_sunday_zero_offset());
        match (self.any_day, self.any_weekday) {
            (false, false) => day || weekday,
            _ => day && weekday,
        }
    }
}

fn bit(mask: u64, value: i8) -> bool {
    u32::try_from(value).is_ok_and(|v| v < 64 && mask & (1 << v) != 0)
}

fn next_month(dt: DateTime) -> Option<DateTime> {
    let (y, m) = if dt.month() == 12 {
        (dt.year().checked_add(1)?, 1)
    } else {
        (dt.year(), dt.month() + 1)
    };
    Some(date(y, m, 1).at(0, 0, 0, 0))
}

fn parse_field(expr: &str, text: &str, f: &Field) -> Result<u64, CronError> {
    let mut mask = 0u64;
    for item in text.split(',') {
        mask |= parse_item(expr, item, f)?;
    }
    Ok(mask)
}

fn parse_item(expr: &str, item: &str, f: &Field) -> Result<u64, CronError> {
    let (range, step) = match item.split_once('/') {
        Some((r, s)) => {
            let step = s
                .parse::<u8>()
                .ok()
                .filter(|s| (1..=f.max.max(1)).contains(s));
            let step = step.ok_or_else(|| CronError::Step {
                expr: expr.into(),
                field: f.name,
                item: item.into(),
                max: f.max.max(1),
            })?;
            (r, step)
        }
        None => (item, 1),
    };
    let (lo, hi) = match range {
        "*" => (f.min, f.max),
        r => match r.split_once('-') {
            Some((a, b)) => (value(expr, a, f)?, value(expr, b, f)?),
            // `a/n` runs from a to the field's end.
            None if item.contains('/') => (value(expr, r, f)?, f.max),
            None => {
                let v = value(expr, r, f)?;
                (v, v)
            }
        },
    };
    if lo > hi {
        return Err(CronError::Backwards {
            expr: expr.into(),
            field: f.name,
            item: item.into(),
        });
    }
    Ok((lo..=hi)
        .step_by(usize::from(step))
        .fold(0, |m, v| m | (1 << v)))
}

fn value(expr: &str, text: &str, f: &Field) -> Result<u8, CronError> {
    let upper = text.to_ascii_uppercase();
    let named = f
        .names
        .iter()
        .position(|n| *n == upper)
        .and_then(|i| u8::try_from(i).ok())
        .map(|i| if f.min == 1 { i + 1 } else { i });
    named
        .or_else(|| text.parse::<u8>().ok())
        .filter(|v| (f.min..=f.max).contains(v))
        .ok_or_else(|| CronError::Value {
            expr: expr.into(),
            field: f.name,
            item: text.into(),
            min: f.min,
            max: f.max,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn next(expr: &str, after: &str) -> String {
        Cron::parse(expr)
            .unwrap()
            .next_after(ts(after))
            .unwrap()
            .to_string()
    }

    #[test]
    fn fields_ranges_steps_and_lists() {
        assert_eq!(
            next("*/15 * * * *", "2026-11-23T07:31:10Z"),
            "2026-11-23T07:45:00Z"
        );
        assert_eq!(
            next("0 */4 * * *", "2026-11-23T07:31:00Z"),
            "2026-11-23T08:00:00Z"
        );
        assert_eq!(
            next("5,35 9-17 * * *", "2026-11-23T17:40:00Z"),
            "2026-11-24T09:05:00Z"
        );
        assert_eq!(
            next("30 2 1 * *", "2026-12-05T00:00:00Z"),
            "2027-01-01T02:30:00Z"
        );
        assert_eq!(
            next("0 0 * JUN-AUG *", "2026-11-23T00:00:00Z"),
            "2027-06-01T00:00:00Z"
        );
        assert_eq!(
            next("10/20 * * * *", "2026-11-23T07:31:00Z"),
            "2026-11-23T07:50:00Z"
        );
        // Exactly on a slot: the next one, strictly after.
        assert_eq!(
            next("@hourly", "2026-11-23T07:00:00Z"),
            "2026-11-23T08:00:00Z"
        );
    }

    #[test]
    fn weekdays_and_the_either_day_rule() {
        // 2026-11-23 is a Monday.
        assert_eq!(
            next("0 3 * * SAT", "2026-11-23T00:00:00Z"),
            "2026-11-28T03:00:00Z"
        );
        assert_eq!(
            next("0 3 * * 7", "2026-11-23T00:00:00Z"),
            "2026-11-29T03:00:00Z"
        );
        assert_eq!(
            next("@weekly", "2026-11-23T00:00:00Z"),
            "2026-11-29T00:00:00Z"
        );
        // Day 1 or a Wednesday, whichever comes first.
        assert_eq!(
            next("0 0 1 * WED", "2026-11-23T00:00:00Z"),
            "2026-11-25T00:00:00Z"
        );
        assert_eq!(
            next("0 0 29 2 *", "2026-03-01T00:00:00Z"),
            "2028-02-29T00:00:00Z"
        );
    }

    #[test]
    fn bad_expressions_say_what_to_fix() {
        let err = |e: &str| Cron::parse(e).unwrap_err().to_string();
        assert!(
            err("* * * *").contains("has 4 field(s)"),
            "{}",
            err("* * * *")
        );
        assert!(err("60 * * * *").contains("minute \"60\" is not a number or name in 0-59"));
        assert!(err("0 25 * * *").contains("hour"));
        assert!(err("0 0 * FOO *").contains("month \"FOO\""));
        assert!(err("0 5-2 * * *").contains("runs backwards"));
        assert!(err("*/0 * * * *").contains("step"));
        assert!(err("0 0 30 2 *").contains("never fires"));
        assert!(err("@often").contains("unknown shorthand"));
        assert!(err("").contains("has 0 field(s)"));
    }

    #[test]
    fn latest_in_picks_the_most_recent_missed_slot_only() {
        let c = Cron::parse("*/10 * * * *").unwrap();
        let got = c.latest_in(ts("2026-11-23T07:00:00Z"), ts("2026-11-23T07:35:00Z"));
        assert_eq!(got, Some(ts("2026-11-23T07:30:00Z")));
        assert_eq!(
            c.latest_in(ts("2026-11-23T07:30:00Z"), ts("2026-11-23T07:39:59Z")),
            None
        );
        // Years of missed slots cost a week of steps at most.
        let got = c.latest_in(ts("2000-01-01T00:00:00Z"), ts("2026-11-23T07:35:00Z"));
        assert_eq!(got, Some(ts("2026-11-23T07:30:00Z")));
    }
}
