//! Kubernetes resource quantities (`100Mi`, `1.5Gi`, `500m`, `1e3`), parsed the way
//! `resource.ParseQuantity` does, kept exactly as a count of nano-units.

use std::fmt;
use std::str::FromStr;

const NANOS_PER_UNIT: i128 = 1_000_000_000;

/// A parsed quantity. The exact value is held in nano-units so that `1.5Gi`, `500m` and
/// `1e-3` compare exactly; values finer than a nano-unit round up, as in Kubernetes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quantity {
    nanos: i128,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error(
        "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
    )]
    Format,
    #[error("unable to parse numeric part of quantity")]
    Numeric,
    #[error("unable to parse quantity's suffix")]
    Suffix,
    #[error("quantity is too large: the magnitude must not exceed 2^63-1")]
    TooLarge,
}

impl Quantity {
    pub const ZERO: Quantity = Quantity { nanos: 0 };

    pub fn from_value(value: i64) -> Self {
        Quantity {
            nanos: i128::from(value) * NANOS_PER_UNIT,
        }
    }

    /// The integer value rounded up, like `Quantity.Value()`.
    pub fn value(&self) -> i64 {
        let whole = self.nanos.div_euclid(NANOS_PER_UNIT);
        let rounded = if self.nanos.rem_euclid(NANOS_PER_UNIT) != 0 {
            whole + 1
        } else {
            whole
        };
        i64::try_from(rounded).unwrap_or(if rounded > 0 { i64::MAX } else { i64::MIN })
    }

    /// The exact value in nano-units.
    pub fn nanos(&self) -> i128 {
        self.nanos
    }

    pub fn is_positive(&self) -> bool {
        self.nanos > 0
    }

    pub fn is_negative(&self) -> bool {
        self.nanos < 0
    }

    pub fn parse(text: &str) -> Result<Self, QuantityError> {
        text.parse()
    }
}

impl FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.is_empty() {
            return Err(QuantityError::Format);
        }
        let bytes = text.as_bytes();
        let mut pos = 0;
        let negative = match bytes[0] {
            b'+' => {
                pos = 1;
                false
            }
            b'-' => {
                pos = 1;
                true
            }
            _ => false,
        };
        let number_start = pos;
        while pos < bytes.len() && (bytes[pos].is_ascii_digit() || bytes[pos] == b'.') {
            pos += 1;
        }
        let number = &text[number_start..pos];
        if number.is_empty() {
            return Err(QuantityError::Format);
        }
        let (integer_part, fraction_part) = match number.split_once('.') {
            Some((i, f)) => {
                if f.contains('.') {
                    return Err(QuantityError::Numeric);
                }
                (i, f)
            }
            None => (number, ""),
        };
        if integer_part.is_empty() && fraction_part.is_empty() {
            return Err(QuantityError::Numeric);
        }
        let suffix = &text[pos..];
        let (base, exponent) = parse_suffix(suffix)?;

        // Exact arithmetic: mantissa * 10^-fraction_digits * base^exponent, kept as a
        // fraction numerator/denominator and rounded up to nano-units at the end.
        let digits: String = format!("{integer_part}{fraction_part}");
        let digits = digits.trim_start_matches('0');
        if digits.len() > 30 {
            return Err(QuantityError::TooLarge);
        }
        let mantissa: i128 = if digits.is_empty() {
            0
        } else {
            digits.parse().map_err(|_| QuantityError::Numeric)?
        };
        let mut numerator: i128 = mantissa * NANOS_PER_UNIT;
        let mut denominator: i128 = 10i128.pow(fraction_part.len().min(30) as u32);
        if fraction_part.len() > 30 {
            return Err(QuantityError::Numeric);
        }
        if exponent >= 0 {
            for _ in 0..exponent {
                numerator = numerator
                    .checked_mul(base)
                    .filter(|n| *n <= i128::from(i64::MAX) * NANOS_PER_UNIT * 10)
                    .ok_or(QuantityError::TooLarge)?;
            }
        } else {
            for _ in 0..(-exponent) {
                denominator = denominator
                    .checked_mul(base)
                    .ok_or(QuantityError::Numeric)?;
                if denominator > 10i128.pow(36) {
                    // Far below a nano-unit: the value rounds up to one nano (or is zero).
                    let nanos = if numerator == 0 { 0 } else { 1 };
                    return Ok(Quantity {
                        nanos: if negative { -nanos } else { nanos },
                    });
                }
            }
        }
        let mut nanos = numerator / denominator;
        if numerator % denominator != 0 {
            nanos += 1;
        }
        if nanos > i128::from(i64::MAX) * NANOS_PER_UNIT {
            return Err(QuantityError::TooLarge);
        }
        Ok(Quantity {
            nanos: if negative { -nanos } else { nanos },
        })
    }
}

fn parse_suffix(suffix: &str) -> Result<(i128, i32), QuantityError> {
    let binary = |power: i32| Ok((2, power));
    let decimal = |power: i32| Ok((10, power));
    match suffix {
        "" => decimal(0),
        "Ki" => binary(10),
        "Mi" => binary(20),
        "Gi" => binary(30),
        "Ti" => binary(40),
        "Pi" => binary(50),
        "Ei" => binary(60),
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        _ => {
            let rest = suffix
                .strip_prefix('e')
                .or_else(|| suffix.strip_prefix('E'))
                .ok_or_else(|| {
                    if suffix
                        .chars()
                        .all(|c| "eEinumkKMGTP+-0123456789".contains(c))
                    {
                        QuantityError::Suffix
                    } else {
                        QuantityError::Format
                    }
                })?;
            let unsigned = rest.strip_prefix(['+', '-']).unwrap_or(rest);
            if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
                return Err(QuantityError::Suffix);
            }
            let exponent: i32 = rest.parse().map_err(|_| QuantityError::Suffix)?;
            if exponent.abs() > 60 {
                return Err(if exponent > 0 {
                    QuantityError::TooLarge
                } else {
                    QuantityError::Numeric
                });
            }
            decimal(exponent)
        }
    }
}

impl fmt::Display for Quantity {
    /// Canonical-enough rendering: binary suffixes for exact multiples of 1024, otherwise
    /// the plain integer, or a milli-unit form for fractions.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nanos % NANOS_PER_UNIT != 0 {
            let millis = self.nanos / 1_000_000;
            if self.nanos % 1_000_000 == 0 {
                return write!(f, "{millis}m");
            }
            return write!(f, "{}n", self.nanos);
        }
        let value = self.nanos / NANOS_PER_UNIT;
        if value == 0 {
            return write!(f, "0");
        }
        for (suffix, shift) in [
            ("Ei", 60),
            ("Pi", 50),
            ("Ti", 40),
            ("Gi", 30),
            ("Mi", 20),
            ("Ki", 10),
        ] {
            let unit = 1i128 << shift;
            if value % unit == 0 {
                return write!(f, "{}{suffix}", value / unit);
            }
        }
        write!(f, "{value}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_kubernetes_grammar() {
        let cases: &[(&str, i128)] = &[
            ("100Mi", 100 * (1 << 20) * NANOS_PER_UNIT),
            ("1.5Gi", 3 * (1 << 29) * NANOS_PER_UNIT),
            ("500m", NANOS_PER_UNIT / 2),
            ("1e3", 1000 * NANOS_PER_UNIT),
            ("1E3", 1000 * NANOS_PER_UNIT),
            ("2e-3", 2_000_000),
            ("+5k", 5000 * NANOS_PER_UNIT),
            ("-1", -NANOS_PER_UNIT),
            (".5", NANOS_PER_UNIT / 2),
            ("5.", 5 * NANOS_PER_UNIT),
            ("0", 0),
            ("1n", 1),
            ("0.1n", 1),
        ];
        for (text, nanos) in cases {
            assert_eq!(
                Quantity::parse(text).map(|q| q.nanos()),
                Ok(*nanos),
                "{text}"
            );
        }
    }

    #[test]
    fn rejects_malformed_quantities() {
        for (text, error) in [
            ("", QuantityError::Format),
            ("Mi", QuantityError::Format),
            ("1.2.3", QuantityError::Numeric),
            ("1Xi", QuantityError::Format),
            ("1Mb", QuantityError::Format),
            ("1KiB", QuantityError::Format),
            ("1e", QuantityError::Suffix),
            ("1ki", QuantityError::Suffix),
            ("10Ei", QuantityError::TooLarge),
            ("abc", QuantityError::Format),
            (" 1", QuantityError::Format),
        ] {
            assert_eq!(Quantity::parse(text), Err(error.clone()), "{text}");
        }
    }

    #[test]
    fn value_rounds_up_like_kubernetes() {
        assert_eq!(Quantity::parse("500m").unwrap().value(), 1);
        assert_eq!(Quantity::parse("1.5").unwrap().value(), 2);
        assert_eq!(Quantity::parse("-1.5").unwrap().value(), -1);
        assert_eq!(Quantity::parse("1Gi").unwrap().value(), 1 << 30);
    }

    #[test]
    fn displays_binary_multiples_compactly() {
        assert_eq!(Quantity::from_value(100 << 20).to_string(), "100Mi");
        assert_eq!(Quantity::from_value(1000).to_string(), "1000");
        assert_eq!(Quantity::parse("500m").unwrap().to_string(), "500m");
    }
}
