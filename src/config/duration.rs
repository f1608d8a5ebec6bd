//! Go `time.ParseDuration` syntax (`1m30s`, `1.5h`, `300ms`), as the kubelet reads its
//! grace periods. Values are signed so that validation can name a negative duration
//! instead of failing to parse it.

use std::fmt;
use std::time::Duration;

/// A signed duration in nanoseconds, the range of Go's `time.Duration`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct GoDuration {
    nanos: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("time: invalid duration {0:?}")]
    Invalid(String),
    #[error("time: missing unit in duration {0:?}")]
    MissingUnit(String),
    #[error("time: unknown unit {unit:?} in duration {text:?}")]
    UnknownUnit { unit: String, text: String },
}

impl GoDuration {
    pub const ZERO: GoDuration = GoDuration { nanos: 0 };

    pub const fn from_secs(secs: i64) -> Self {
        GoDuration {
            nanos: secs.saturating_mul(1_000_000_000),
        }
    }

    pub const fn from_nanos(nanos: i64) -> Self {
        GoDuration { nanos }
    }

    pub fn nanos(&self) -> i64 {
        self.nanos
    }

    pub fn is_negative(&self) -> bool {
        self.nanos < 0
    }

    pub fn is_zero(&self) -> bool {
        self.nanos == 0
    }

    /// Whole seconds, truncated toward zero like `int64(d / time.Second)`.
    pub fn whole_seconds(&self) -> i64 {
        self.nanos / 1_000_000_000
    }

    /// The duration as `std::time::Duration`; negative values become zero.
    pub fn to_std(&self) -> Duration {
        Duration::from_nanos(u64::try_from(self.nanos).unwrap_or(0))
    }

    pub fn parse(text: &str) -> Result<Self, DurationError> {
        parse_go_duration(text).map(|nanos| GoDuration { nanos })
    }
}

impl From<Duration> for GoDuration {
    fn from(d: Duration) -> Self {
        GoDuration {
            nanos: i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        }
    }
}

fn unit_nanos(unit: &str) -> Option<u128> {
    Some(match unit {
        "ns" => 1,
        "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60 * 1_000_000_000,
        "h" => 3600 * 1_000_000_000,
        _ => return None,
    })
}

fn parse_go_duration(original: &str) -> Result<i64, DurationError> {
    let invalid = || DurationError::Invalid(original.to_string());
    let mut rest = original;
    let mut negative = false;
    if let Some(r) = rest.strip_prefix('-') {
        negative = true;
        rest = r;
    } else if let Some(r) = rest.strip_prefix('+') {
        rest = r;
    }
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(invalid());
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let int_part = &rest[..int_len];
        rest = &rest[int_len..];
        let mut frac_part = "";
        if let Some(r) = rest.strip_prefix('.') {
            let frac_len = r.bytes().take_while(u8::is_ascii_digit).count();
            frac_part = &r[..frac_len];
            rest = &r[frac_len..];
        }
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(invalid());
        }
        let unit_len = rest
            .char_indices()
            .find(|(_, c)| *c == '.' || c.is_ascii_digit())
            .map_or(rest.len(), |(i, _)| i);
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        if unit.is_empty() {
            return Err(DurationError::MissingUnit(original.to_string()));
        }
        let scale = unit_nanos(unit).ok_or_else(|| DurationError::UnknownUnit {
            unit: unit.to_string(),
            text: original.to_string(),
        })?;
        let whole: u128 = if int_part.is_empty() {
            0
        } else if int_part.len() > 20 {
            return Err(invalid());
        } else {
            int_part.parse().map_err(|_| invalid())?
        };
        let mut value = whole.checked_mul(scale).ok_or_else(invalid)?;
        // Go truncates the fractional contribution toward zero.
        let mut frac_scale = scale;
        for digit in frac_part.bytes() {
            frac_scale /= 10;
            if frac_scale == 0 {
                break;
            }
            value += u128::from(digit - b'0') * frac_scale;
        }
        total = total.checked_add(value).ok_or_else(invalid)?;
        if total > i64::MAX as u128 + u128::from(negative) {
            return Err(invalid());
        }
    }
    if negative {
        Ok((-(total as i128)) as i64)
    } else {
        Ok(total as i64)
    }
}

impl fmt::Display for GoDuration {
    /// Renders exactly as Go's `Duration.String()`: `1h30m0s`, `1m0.5s`, `1.5ms`, `2µs`,
    /// `0s`. Every digit is kept, so the text reads back as the same duration.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SECOND: u64 = 1_000_000_000;
        if self.nanos == 0 {
            return f.write_str("0s");
        }
        let sign = if self.nanos < 0 { "-" } else { "" };
        let abs = self.nanos.unsigned_abs();
        if abs < SECOND {
            // Under a second Go picks the largest unit that leaves a whole part.
            let (unit, per_unit) = match abs {
                0..1_000 => ("ns", 1),
                1_000..1_000_000 => ("\u{b5}s", 1_000),
                _ => ("ms", 1_000_000),
            };
            let whole = abs / per_unit;
            let fraction = Fraction::of(abs % per_unit, per_unit);
            return write!(f, "{sign}{whole}{fraction}{unit}");
        }
        let secs = abs / SECOND;
        let fraction = Fraction::of(abs % SECOND, SECOND);
        let (h, m, s) = (secs / 3600, (secs / 60) % 60, secs % 60);
        match (h, m) {
            (0, 0) => write!(f, "{sign}{s}{fraction}s"),
            (0, m) => write!(f, "{sign}{m}m{s}{fraction}s"),
            (h, m) => write!(f, "{sign}{h}h{m}m{s}{fraction}s"),
        }
    }
}

/// The digits after the decimal point of `remainder / per_unit` (a power of ten), without
/// trailing zeros; nothing at all for no remainder.
struct Fraction {
    remainder: u64,
    per_unit: u64,
}

impl Fraction {
    fn of(remainder: u64, per_unit: u64) -> Fraction {
        Fraction {
            remainder,
            per_unit,
        }
    }
}

impl fmt::Display for Fraction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.remainder == 0 {
            return Ok(());
        }
        let mut digits = self.per_unit.ilog10() as usize;
        let mut remainder = self.remainder;
        while remainder.is_multiple_of(10) {
            remainder /= 10;
            digits -= 1;
        }
        write!(f, ".{remainder:0digits$}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        let s = 1_000_000_000i64;
        for (text, nanos) in [
            ("0", 0),
            ("0s", 0),
            ("1m30s", 90 * s),
            ("1.5h", 5400 * s),
            ("300ms", 300_000_000),
            ("2h45m", (2 * 3600 + 45 * 60) * s),
            ("-1s", -s),
            ("+10s", 10 * s),
            ("1us", 1000),
            ("1\u{b5}s", 1000),
            (".5s", s / 2),
            ("1.s", s),
        ] {
            assert_eq!(
                GoDuration::parse(text).map(|d| d.nanos()),
                Ok(nanos),
                "{text}"
            );
        }
    }

    #[test]
    fn rejects_what_go_rejects() {
        assert!(matches!(
            GoDuration::parse(""),
            Err(DurationError::Invalid(_))
        ));
        assert!(matches!(
            GoDuration::parse("10"),
            Err(DurationError::MissingUnit(_))
        ));
        assert!(matches!(
            GoDuration::parse("10x"),
            Err(DurationError::UnknownUnit { .. })
        ));
        assert!(matches!(
            GoDuration::parse("s"),
            Err(DurationError::Invalid(_))
        ));
        assert!(matches!(
            GoDuration::parse("-"),
            Err(DurationError::Invalid(_))
        ));
        assert!(matches!(
            GoDuration::parse("1m 30s"),
            Err(DurationError::UnknownUnit { .. })
        ));
        assert!(matches!(
            GoDuration::parse("3000000h"),
            Err(DurationError::Invalid(_))
        ));
    }

    #[test]
    fn displays_like_go() {
        assert_eq!(GoDuration::from_secs(90).to_string(), "1m30s");
        assert_eq!(GoDuration::from_secs(300).to_string(), "5m0s");
        assert_eq!(GoDuration::from_secs(3600).to_string(), "1h0m0s");
        assert_eq!(GoDuration::ZERO.to_string(), "0s");
        assert_eq!(GoDuration::from_nanos(1_500_000_000).to_string(), "1.5s");
    }

    /// The cases of Go's own `TestDurationString` (src/time/time_test.go): every digit kept,
    /// the largest unit under a second.
    #[test]
    fn displays_every_digit_as_go_does() {
        let (us, ms, s) = (1_000, 1_000_000, 1_000_000_000i64);
        for (nanos, text) in [
            (1, "1ns"),
            (1_100, "1.1\u{b5}s"),
            (2_200 * us, "2.2ms"),
            (3_300 * ms, "3.3s"),
            (4 * 60 * s + 5 * s, "4m5s"),
            (4 * 60 * s + 5_001 * ms, "4m5.001s"),
            (5 * 3600 * s + 6 * 60 * s + 7_001 * ms, "5h6m7.001s"),
            (8 * 60 * s + 1, "8m0.000000001s"),
            (i64::MAX, "2562047h47m16.854775807s"),
            (i64::MIN, "-2562047h47m16.854775808s"),
        ] {
            assert_eq!(
                GoDuration::from_nanos(nanos).to_string(),
                text,
                "{nanos} ns"
            );
        }
    }

    /// Found by the quantity fuzz target: 6113.2s printed through a float as
    /// 1h41m53.19999999999982s, a different duration from the one configured.
    #[test]
    fn what_it_prints_reads_back_as_the_same_duration() {
        for text in [
            "006113.2s",
            "1.000000001s",
            "-59m59.999999999s",
            "1.5us",
            "7h0.1ms",
        ] {
            let parsed = GoDuration::parse(text).expect(text);
            let printed = parsed.to_string();
            assert_eq!(
                GoDuration::parse(&printed),
                Ok(parsed),
                "{text} printed as {printed}"
            );
        }
    }
}
