//! Calendar windows: a day, a week, a month or a year of a time zone's
//! local calendar, each starting at local midnight (of the day; of the
//! Monday; of the first of the month; of the first of January).
//!
//! A fixed window of `1mo` with `align: calendar` is what a quota sold per
//! month means: it resets when the customer's month changes, however many
//! days the month has and whatever the clocks did in between (a daylight
//! saving change makes a day 23 or 25 hours long). Such a window is no
//! multiple of a period, so its edges are computed from a time zone
//! database: [`jiff`]'s, with the IANA database bundled into the binary
//! (`tzdb-bundle-always`), so that neither the build nor the running server
//! needs the system's tzdata, and every server of a fleet computes the
//! same edges whatever its system has installed
//! (`docs/dependencies.md`).
//!
//! Computing an edge costs a look-up in the zone's transitions, so the
//! fixed window computes one only when a window starts
//! ([`crate::FixedWindow`] keeps the end in its state): once per key per
//! window, never on a decision inside a window.
//!
//! The local midnight that starts a window may not exist (a zone that
//! moves its clocks forward at midnight, as `America/Santiago` does): the
//! window then starts at the first instant of that day, the end of the
//! gap. A midnight that happens twice (clocks moved back at midnight)
//! starts the window at its first occurrence.

use std::fmt;
use std::hash::{Hash, Hasher};

use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

use crate::error::ParamError;
use crate::time::Nanos;

/// The length of a calendar window.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum CalendarUnit {
    /// A day, from local midnight to local midnight (23 to 25 hours where
    /// clocks change).
    Day,
    /// A week, from local midnight of a Monday (ISO 8601) to the next.
    Week,
    /// A month, from local midnight of its first day to that of the next
    /// month (28 to 31 days).
    Month,
    /// A year, from local midnight of the first of January (365 or 366
    /// days).
    Year,
}

impl CalendarUnit {
    /// Every unit, shortest first.
    pub const ALL: [CalendarUnit; 4] = [
        CalendarUnit::Day,
        CalendarUnit::Week,
        CalendarUnit::Month,
        CalendarUnit::Year,
    ];

    /// The unit as a config's `window` names it: `1d`, `1w`, `1mo`, `1y`.
    pub fn name(self) -> &'static str {
        match self {
            CalendarUnit::Day => "1d",
            CalendarUnit::Week => "1w",
            CalendarUnit::Month => "1mo",
            CalendarUnit::Year => "1y",
        }
    }

    /// The unit a config's `window` names, if it names one.
    pub fn from_name(name: &str) -> Option<CalendarUnit> {
        CalendarUnit::ALL.into_iter().find(|u| u.name() == name)
    }

    /// The nominal length: one day, 7 days, 30 days, 365 days (a month
    /// and a year as envoyproxy/ratelimit counts them). What the window
    /// is said to be where a length is wanted (Envoy's `unit` in an
    /// answer); the real windows are the calendar's.
    pub fn nominal(self) -> Nanos {
        const DAY: u64 = 86_400;
        Nanos::from_secs(match self {
            CalendarUnit::Day => DAY,
            CalendarUnit::Week => 7 * DAY,
            CalendarUnit::Month => 30 * DAY,
            CalendarUnit::Year => 365 * DAY,
        })
    }

    /// A bound on the length of any window of this unit in any zone: a
    /// day and a month, plus a day of slack for a zone that moved its
    /// clocks by a whole day (Samoa, 2011).
    pub fn longest(self) -> Nanos {
        const DAY: u64 = 86_400;
        Nanos::from_secs(match self {
            CalendarUnit::Day => 2 * DAY,
            CalendarUnit::Week => 8 * DAY,
            CalendarUnit::Month => 32 * DAY,
            CalendarUnit::Year => 367 * DAY,
        })
    }
}

impl fmt::Display for CalendarUnit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Calendar windows of one unit in one time zone. Equal (and hashed) by
/// unit and zone name, which is what a limit's fingerprint includes: a
/// changed zone starts fresh counters.
#[derive(Clone)]
pub struct Calendar {
    unit: CalendarUnit,
    /// The zone's IANA name as the database spells it.
    name: Box<str>,
    zone: TimeZone,
}

impl Calendar {
    /// The time zone of a calendar when none is given.
    pub const DEFAULT_ZONE: &'static str = "UTC";

    /// Windows of `unit` in the IANA time zone `zone` (`Europe/Paris`,
    /// `UTC`; looked up without regard to case, kept as the database
    /// spells it). An unknown name is a [`ParamError`] on `timezone`.
    pub fn new(unit: CalendarUnit, zone: &str) -> Result<Calendar, ParamError> {
        let tz = jiff::tz::db().get(zone).map_err(|_| ParamError::Invalid {
            param: "timezone",
            reason: crate::message::bounded(format!(
                "`{zone}` is not a time zone of the IANA database (write a name like \
                     `Europe/Paris`, `America/New_York` or `UTC`)"
            )),
        })?;
        let name = tz.iana_name().unwrap_or(zone).into();
        Ok(Calendar {
            unit,
            name,
            zone: tz,
        })
    }

    /// Windows of `unit` in UTC.
    pub fn utc(unit: CalendarUnit) -> Calendar {
        Calendar {
            unit,
            name: Calendar::DEFAULT_ZONE.into(),
            zone: TimeZone::UTC,
        }
    }

    /// The unit.
    pub fn unit(&self) -> CalendarUnit {
        self.unit
    }

    /// The time zone's IANA name.
    pub fn zone(&self) -> &str {
        &self.name
    }

    /// The window holding `now`: its first instant and the first instant
    /// of the next one (`start <= now < end`). Times beyond what the zone
    /// database can place (none a `u64` of nanoseconds reaches) give a
    /// window that never ends, rather than a panic.
    pub fn window_at(&self, now: Nanos) -> (Nanos, Nanos) {
        match self.edges(now) {
            Some((start, end)) if start <= now && now < end => (start, end),
            // Never seen: kept for a database that would place `now`
            // outside the day it names. A window holding `now` still.
            Some((start, end)) => (
                start.min(now),
                end.max(now.saturating_add(Nanos::NANOSECOND)),
            ),
            None => (now, Nanos::MAX),
        }
    }

    /// The edges of three windows: the one before the window holding
    /// `now`, that window, and the one after it (`[e0, e1)`, `[e1, e2)`,
    /// `[e2, e3)`). The Redis store passes them to its script, which
    /// cannot compute calendars, and picks the window holding Redis's own
    /// time among them.
    pub fn windows_around(&self, now: Nanos) -> [Nanos; 4] {
        let (start, end) = self.window_at(now);
        let before = if start.is_zero() {
            start
        } else {
            self.window_at(start.saturating_sub(Nanos::NANOSECOND)).0
        };
        [before, start, end, self.window_at(end).1]
    }

    /// The start of the window holding `now`, and of the next.
    fn edges(&self, now: Nanos) -> Option<(Nanos, Nanos)> {
        let ts = Timestamp::from_nanosecond(i128::from(now.as_u64())).ok()?;
        let today = ts.to_zoned_datetime(self.zone.clone()).date();
        let first = match self.unit {
            CalendarUnit::Day => today,
            CalendarUnit::Week => today
                .checked_sub(i64::from(today.weekday().to_monday_zero_offset()).days())
                .ok()?,
            CalendarUnit::Month => today.first_of_month(),
            CalendarUnit::Year => today.first_of_year(),
        };
        let next = match self.unit {
            CalendarUnit::Day => first.checked_add(1.day()),
            CalendarUnit::Week => first.checked_add(7.days()),
            CalendarUnit::Month => first.checked_add(1.month()),
            CalendarUnit::Year => first.checked_add(1.year()),
        }
        .ok()?;
        Some((self.midnight(first)?, self.midnight(next)?))
    }

    /// The first instant of `date` in the zone: its midnight, or the end
    /// of a gap that swallowed midnight.
    fn midnight(&self, date: Date) -> Option<Nanos> {
        let zoned = date.to_zoned_datetime(self.zone.clone()).ok()?;
        let ns = zoned.timestamp().as_nanosecond();
        Some(Nanos::new(u64::try_from(ns.max(0)).unwrap_or(u64::MAX)))
    }
}

impl PartialEq for Calendar {
    fn eq(&self, other: &Calendar) -> bool {
        self.unit == other.unit && self.name == other.name
    }
}

impl Eq for Calendar {}

impl Hash for Calendar {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.unit.hash(state);
        self.name.hash(state);
    }
}

impl fmt::Debug for Calendar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Calendar")
            .field("unit", &self.unit)
            .field("zone", &self.name)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nanoseconds of a UTC date and time.
    fn utc(y: i16, mo: i8, d: i8, h: i8) -> Nanos {
        let ts = jiff::civil::date(y, mo, d)
            .at(h, 0, 0, 0)
            .to_zoned_datetime(TimeZone::UTC)
            .unwrap()
            .timestamp();
        Nanos::new(u64::try_from(ts.as_nanosecond()).unwrap())
    }

    #[test]
    fn months_in_utc_run_from_first_to_first() {
        let c = Calendar::utc(CalendarUnit::Month);
        assert_eq!(
            c.window_at(utc(2024, 2, 29, 23)),
            (utc(2024, 2, 1, 0), utc(2024, 3, 1, 0))
        );
        let edge = utc(2024, 3, 1, 0);
        assert_eq!(c.window_at(edge).0, edge);
        assert_eq!(c.window_at(edge.saturating_sub(Nanos::NANOSECOND)).1, edge);
    }

    #[test]
    fn a_paris_month_starts_at_local_midnight() {
        let c = Calendar::new(CalendarUnit::Month, "europe/paris").unwrap();
        assert_eq!(c.zone(), "Europe/Paris");
        // March 2024 in Paris: from 1 March 00:00 CET (23:00 UTC the day
        // before) to 1 April 00:00 CEST (22:00 UTC): 31 days less an hour.
        let (start, end) = c.window_at(utc(2024, 3, 15, 12));
        assert_eq!(start, utc(2024, 2, 29, 23));
        assert_eq!(end, utc(2024, 3, 31, 22));
    }

    #[test]
    fn weeks_start_on_monday() {
        let c = Calendar::utc(CalendarUnit::Week);
        // Thursday 2024-01-04.
        assert_eq!(
            c.window_at(utc(2024, 1, 4, 5)),
            (utc(2024, 1, 1, 0), utc(2024, 1, 8, 0))
        );
    }

    #[test]
    fn a_midnight_swallowed_by_a_gap_starts_the_day_after_it() {
        // Santiago moved its clocks from 00:00 to 01:00 on 2022-09-11.
        let c = Calendar::new(CalendarUnit::Day, "America/Santiago").unwrap();
        let (start, end) = c.window_at(utc(2022, 9, 11, 12));
        // 01:00 -03 is 04:00 UTC; the next midnight (-03) is 03:00 UTC.
        assert_eq!(start, utc(2022, 9, 11, 4));
        assert_eq!(end, utc(2022, 9, 12, 3));
    }

    #[test]
    fn an_unknown_zone_is_named() {
        let e = Calendar::new(CalendarUnit::Month, "Europe/Pariss").unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("`timezone`") && text.contains("Europe/Pariss"),
            "{text}"
        );
    }

    #[test]
    fn the_largest_time_has_a_window() {
        let c = Calendar::new(CalendarUnit::Year, "Pacific/Kiritimati").unwrap();
        let (start, end) = c.window_at(Nanos::MAX);
        assert!(start <= Nanos::MAX && end == Nanos::MAX);
        let (s0, e0) = c.window_at(Nanos::ZERO);
        assert!(s0 == Nanos::ZERO && e0 > Nanos::ZERO);
    }
}
