//! Kubernetes resource quantities (`100Mi`, `1.5Gi`, `500m`, `1e3`), parsed the way
//! `resource.ParseQuantity` does, kept exactly as a count of nano-units.

use std::fmt;
use std::str::FromStr;

const NANOS_PER_UNIT: i128 = 1_000_000_000;

/// A parsed quantity. The exact value is held in nano-units so that `1.5Gi`, `500m` and
/// `1e-3` compare exactly; values finer than a nano-unit round up, as in Kubernetes.
/// The format the text was written in is kept for printing (`1G` stays `1G`, `1Gi`
/// stays `1Gi`) but never takes part in a comparison, as `Quantity.Cmp` ignores it.
#[derive(Debug, Clone, Copy)]
pub struct Quantity {
    nanos: i128,
    format: QuantityFormat,
}

/// How a quantity prints, from the suffix it was written with (`resource.Format`):
/// `e`/`E` exponents, binary suffixes (`Ki`..`Ei`), or decimal SI suffixes and none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QuantityFormat {
    DecimalExponent,
    /// What the kubelet builds measured byte counts with (`NewQuantity(n, BinarySI)`).
    #[default]
    BinarySi,
    DecimalSi,
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}

impl Eq for Quantity {}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.nanos.cmp(&other.nanos)
    }
}

impl std::hash::Hash for Quantity {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.nanos.hash(state);
    }
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
}

impl Quantity {
    pub const ZERO: Quantity = Quantity {
        nanos: 0,
        format: QuantityFormat::BinarySi,
    };
    /// 2^63-1 units, where Kubernetes caps what it parses.
    pub const MAX: Quantity = Quantity {
        nanos: MAX_NANOS,
        format: QuantityFormat::DecimalSi,
    };

    /// Whether the magnitude reached the cap: the text asked for 2^63-1 or more.
    pub fn is_capped(&self) -> bool {
        self.nanos.abs() >= MAX_NANOS
    }

    /// A whole number of units printed as a byte count (`NewQuantity(value, BinarySI)`).
    pub fn from_value(value: i64) -> Self {
        Quantity::from_value_in(value, QuantityFormat::BinarySi)
    }

    /// A whole number of units in the given format (`NewQuantity(value, format)`): the
    /// kubelet counts inodes and PIDs in `DecimalSI`.
    pub fn from_value_in(value: i64, format: QuantityFormat) -> Self {
        Quantity {
            nanos: i128::from(value) * NANOS_PER_UNIT,
            format,
        }
    }

    /// An exact amount in nano-units, in the given format.
    pub fn from_nanos(nanos: i128, format: QuantityFormat) -> Self {
        Quantity { nanos, format }
    }

    pub fn format(&self) -> QuantityFormat {
        self.format
    }

    /// The sum, in the format `Quantity.Add` leaves: the left side's, unless it is zero,
    /// when the right side's format is taken.
    pub fn plus(self, other: Quantity) -> Quantity {
        Quantity {
            nanos: self.nanos.saturating_add(other.nanos),
            format: if self.nanos == 0 {
                other.format
            } else {
                self.format
            },
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
        let magnitude = magnitude_nanos(integer_part, fraction_part, base, exponent);
        let format = if base == 2 {
            QuantityFormat::BinarySi
        } else if suffix.len() > 1 && suffix.starts_with(['e', 'E']) {
            QuantityFormat::DecimalExponent
        } else {
            QuantityFormat::DecimalSi
        };
        Ok(Quantity {
            nanos: if negative { -magnitude } else { magnitude },
            format,
        })
    }
}

/// The largest magnitude a quantity holds: 2^63-1 units. `resource.ParseQuantity` caps
/// binary-suffixed values there; a larger decimal one compares above every int64 the
/// kubelet measures, so capping decides the same.
const MAX_NANOS: i128 = i64::MAX as i128 * NANOS_PER_UNIT;

/// Significant digits kept exactly. The rest (beyond any value a person writes) only
/// marks the result for rounding up; what they stand for is below 10^-40 of a nano-unit
/// for every value under the cap.
const MAX_DIGITS: usize = 60;

/// `integer.fraction × base^exponent` in nano-units, rounded up, capped at [`MAX_NANOS`].
fn magnitude_nanos(integer_part: &str, fraction_part: &str, base: i128, exponent: i32) -> i128 {
    let all_digits = format!("{integer_part}{fraction_part}");
    let significant = all_digits.trim_start_matches('0');
    if significant.is_empty() {
        return 0;
    }
    // digits × 10^decimal_shift, trailing zeros and excess digits folded into the shift;
    // `inexact` remembers dropped non-zero digits.
    let mut decimal_shift = -(fraction_part.len() as i64);
    let trimmed = significant.trim_end_matches('0');
    decimal_shift += (significant.len() - trimmed.len()) as i64;
    let (kept, dropped) = trimmed.split_at(trimmed.len().min(MAX_DIGITS));
    decimal_shift += dropped.len() as i64;
    let inexact = !dropped.is_empty();

    // The order of magnitude bounds the arithmetic below: the value lies in
    // [10^magnitude, 10^(magnitude+1)).
    let magnitude = (kept.len() as f64 - 1.0)
        + decimal_shift as f64
        + f64::from(exponent) * (base as f64).log10();
    if magnitude >= 19.0 {
        return MAX_NANOS;
    }
    if magnitude < -10.0 {
        // Below a nano-unit: rounds up to one, as Kubernetes rounds up.
        return 1;
    }
    // nanos = digits × 10^(decimal_shift + 9) × base^exponent, as powers of 2 and 5.
    let exponent = i64::from(exponent);
    let nano_shift = decimal_shift + 9;
    let twos = nano_shift + exponent;
    let fives = nano_shift + if base == 10 { exponent } else { 0 };
    let (whole, remainder) =
        nanos_in_i128(kept, twos, fives).unwrap_or_else(|| nanos_in_natural(kept, twos, fives));
    let rounded = if remainder || inexact {
        whole.saturating_add(1)
    } else {
        whole
    };
    rounded.min(MAX_NANOS)
}

/// `digits × 2^twos × 5^fives`, truncated, and whether anything was cut off: the fast
/// path every quantity a person writes takes (each pod's quantities are read every
/// cycle). `None` when an intermediate does not fit in i128.
fn nanos_in_i128(digits: &str, twos: i64, fives: i64) -> Option<(i128, bool)> {
    let power = |prime: i128, count: i64| prime.checked_pow(u32::try_from(count.max(0)).ok()?);
    let numerator = digits
        .parse::<i128>()
        .ok()?
        .checked_mul(power(2, twos)?)?
        .checked_mul(power(5, fives)?)?;
    let denominator = power(2, -twos)?.checked_mul(power(5, -fives)?)?;
    Some((numerator / denominator, numerator % denominator != 0))
}

/// [`nanos_in_i128`] for what does not fit there, with a big integer; a result beyond
/// i128 is above the cap anyway.
fn nanos_in_natural(digits: &str, twos: i64, fives: i64) -> (i128, bool) {
    let mut value = Natural::from_decimal(digits);
    for _ in 0..twos.max(0) {
        value.multiply(2);
    }
    for _ in 0..fives.max(0) {
        value.multiply(5);
    }
    let mut remainder = false;
    for _ in 0..(-twos).max(0) {
        remainder |= value.divide(2) != 0;
    }
    for _ in 0..(-fives).max(0) {
        remainder |= value.divide(5) != 0;
    }
    (value.to_i128().unwrap_or(MAX_NANOS), remainder)
}

/// A natural number in base-2^32 limbs, least significant first: just enough arithmetic
/// for an exact quantity (the magnitude check keeps it to a few limbs).
struct Natural(Vec<u32>);

impl Natural {
    fn from_decimal(digits: &str) -> Natural {
        let mut value = Natural(vec![0]);
        for digit in digits.bytes() {
            value.multiply(10);
            value.add(u32::from(digit - b'0'));
        }
        value
    }

    fn multiply(&mut self, factor: u32) {
        let mut carry = 0u64;
        for limb in &mut self.0 {
            let product = u64::from(*limb) * u64::from(factor) + carry;
            *limb = product as u32;
            carry = product >> 32;
        }
        if carry != 0 {
            self.0.push(carry as u32);
        }
    }

    fn add(&mut self, addend: u32) {
        let mut carry = u64::from(addend);
        for limb in &mut self.0 {
            let sum = u64::from(*limb) + carry;
            *limb = sum as u32;
            carry = sum >> 32;
            if carry == 0 {
                return;
            }
        }
        self.0.push(carry as u32);
    }

    /// Divide in place; the remainder.
    fn divide(&mut self, divisor: u32) -> u32 {
        let mut remainder = 0u64;
        for limb in self.0.iter_mut().rev() {
            let current = (remainder << 32) | u64::from(*limb);
            *limb = (current / u64::from(divisor)) as u32;
            remainder = current % u64::from(divisor);
        }
        remainder as u32
    }

    fn to_i128(&self) -> Option<i128> {
        let mut out: u128 = 0;
        for (index, limb) in self.0.iter().enumerate() {
            if *limb == 0 {
                continue;
            }
            if index >= 4 {
                return None;
            }
            out |= u128::from(*limb) << (32 * index);
        }
        i128::try_from(out).ok()
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
            // An exponent beyond int32 is a suffix error in Kubernetes too; any other
            // exponent is accepted, its value capped or rounded up to a nano-unit.
            let exponent: i32 = rest.parse().map_err(|_| QuantityError::Suffix)?;
            decimal(exponent)
        }
    }
}

impl fmt::Display for Quantity {
    /// The canonical form `Quantity.String()` prints, so messages read as the kubelet's:
    /// a binary quantity takes the largest binary suffix that divides it exactly
    /// (`1536Mi`, `1Gi`), but prints as decimal when it is under 1024 or not whole; a
    /// decimal one takes the largest SI suffix (or `e` exponent) that leaves a whole
    /// mantissa (`1G`, `1500m`, `40k`, `1e3`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nanos == 0 {
            return f.write_str("0");
        }
        let whole = self.nanos % NANOS_PER_UNIT == 0;
        let units = self.nanos / NANOS_PER_UNIT;
        if self.format == QuantityFormat::BinarySi && whole && units.abs() >= 1024 {
            let (mantissa, thousands_of_twos) = remove_factors(units, 1024);
            let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
                .get(thousands_of_twos)
                .copied()
                .unwrap_or("Ei");
            return write!(f, "{mantissa}{suffix}");
        }
        // Decimal: the exponent of ten, brought down to a multiple of three.
        let (mut mantissa, tens) = remove_factors(self.nanos, 10);
        let mut exponent = tens as i32 - 9;
        while exponent.rem_euclid(3) != 0 {
            mantissa *= 10;
            exponent -= 1;
        }
        if self.format == QuantityFormat::DecimalExponent {
            return if exponent == 0 {
                write!(f, "{mantissa}")
            } else {
                write!(f, "{mantissa}e{exponent}")
            };
        }
        let suffix = match exponent {
            -9 => "n",
            -6 => "u",
            -3 => "m",
            0 => "",
            3 => "k",
            6 => "M",
            9 => "G",
            12 => "T",
            15 => "P",
            18 => "E",
            _ => return write!(f, "{mantissa}e{exponent}"),
        };
        write!(f, "{mantissa}{suffix}")
    }
}

/// `value` without its factors of `base`, and how many were removed.
fn remove_factors(mut value: i128, base: i128) -> (i128, usize) {
    let mut count = 0;
    while value != 0 && value % base == 0 {
        value /= base;
        count += 1;
    }
    (value, count)
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
            ("abc", QuantityError::Format),
            (" 1", QuantityError::Format),
        ] {
            assert_eq!(Quantity::parse(text), Err(error.clone()), "{text}");
        }
    }

    /// `resource.ParseQuantity` caps a binary-suffixed value at 2^63-1 and keeps a larger
    /// decimal one, which then compares above every int64 availability; either way the
    /// kubelet starts with it, so the parser caps instead of refusing.
    #[test]
    fn values_beyond_int64_are_capped_not_refused() {
        for text in [
            "10Ei",
            "8Ei",
            "9223372036854775808",
            "1e19",
            "1e300",
            "-10Ei",
            "123456789012345678901234567890123456789",
        ] {
            let quantity = Quantity::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert!(quantity.is_capped(), "{text}");
            assert_eq!(quantity.value().unsigned_abs(), i64::MAX as u64, "{text}");
        }
        for text in ["7Ei", "9223372036854775806", "1e18", "0.5Ei"] {
            assert!(!Quantity::parse(text).unwrap().is_capped(), "{text}");
        }
        assert_eq!(Quantity::parse("7Ei").unwrap().value(), 7 << 60);
        assert_eq!(Quantity::parse("0.5Ei").unwrap().value(), 1 << 59);
    }

    /// Digits beyond what i128 holds exactly, and exponents far out either way, still
    /// parse as Kubernetes parses them: rounded up to a nano-unit at the small end.
    #[test]
    fn long_and_extreme_inputs_round_like_kubernetes() {
        let cases: &[(&str, i128)] = &[
            ("1e-300", 1),
            ("0.0000000000000000000000000000000000001", 1),
            ("0", 0),
            ("0e99", 0),
            ("0.000000000Ei", 0),
            ("1.0000000000000000000000000000000001", NANOS_PER_UNIT + 1),
            (
                "1000000000000000000000000000000000000e-30",
                1_000_000 * NANOS_PER_UNIT,
            ),
            (
                "0.123456789012345678Ei",
                142_335_986_942_043_632_726_471_714,
            ),
            ("1.5Gi", 3 * (1 << 29) * NANOS_PER_UNIT),
            // Long digit strings with binary suffixes, checked against exact rationals.
            (
                "0.461993599993138072951980566Ei",
                532_642_356_422_822_555_834_648_615,
            ),
            (
                "5005063674579.0920088605000039Mi",
                5_248_189_647_635_445_982_282_907_653,
            ),
            (
                "1.000000000000000000000000000000000000000000000000000000000000000000001",
                NANOS_PER_UNIT + 1,
            ),
        ];
        for (text, nanos) in cases {
            assert_eq!(
                Quantity::parse(text).map(|q| q.nanos()),
                Ok(*nanos),
                "{text}"
            );
        }
        assert_eq!(Quantity::parse("1e99999999999"), Err(QuantityError::Suffix));
    }

    proptest::proptest! {
        /// Against exact rational arithmetic (in i128, which holds these sizes): every
        /// suffix up to Gi, up to 9 integer and 9 fraction digits, rounded up to a nano-unit.
        #[test]
        fn matches_exact_arithmetic_rounded_up(
            integer in 0u64..1_000_000_000,
            fraction in proptest::option::of((1usize..10, 0u64..1_000_000_000)),
            suffix in proptest::sample::select(vec![
                ("", 10i128, 0i32), ("Ki", 2, 10), ("Mi", 2, 20), ("Gi", 2, 30),
                ("n", 10, -9), ("u", 10, -6), ("m", 10, -3), ("k", 10, 3), ("M", 10, 6),
                ("e-4", 10, -4), ("e2", 10, 2),
            ]),
        ) {
            let (suffix, base, exponent) = suffix;
            let (fraction_text, fraction_value, fraction_digits) = match fraction {
                None => (String::new(), 0i128, 0u32),
                Some((digits, value)) => {
                    let value = value % 10u64.pow(digits as u32);
                    (format!(".{value:0digits$}"), i128::from(value), digits as u32)
                }
            };
            let text = format!("{integer}{fraction_text}{suffix}");
            // (integer + fraction / 10^d) × base^exponent × 10^9, as numerator / denominator.
            let mut numerator = (i128::from(integer) * 10i128.pow(fraction_digits) + fraction_value)
                * NANOS_PER_UNIT;
            let mut denominator = 10i128.pow(fraction_digits);
            if exponent >= 0 {
                numerator *= base.pow(exponent as u32);
            } else {
                denominator *= base.pow(exponent.unsigned_abs());
            }
            let expected = (numerator + denominator - 1) / denominator;
            proptest::prop_assert_eq!(Quantity::parse(&text).map(|q| q.nanos()), Ok(expected), "{}", text);
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
    fn prints_the_canonical_form_in_the_format_it_was_written() {
        // `Quantity.String()` after `ParseQuantity`, as `kubectl get -o yaml` shows a
        // request the API server stored, and as the kubelet prints it in its messages.
        // (Go also keeps the text itself when it already looks canonical, so `1E3` or
        // `+1G` print as written there; here they print `1e3` and `1G`.)
        let cases = [
            ("1G", "1G"),
            ("1000M", "1G"),
            ("1500M", "1500M"),
            ("40k", "40k"),
            ("40000", "40k"),
            ("1500", "1500"),
            ("1.5", "1500m"),
            ("500m", "500m"),
            ("0.5", "500m"),
            ("1n", "1n"),
            ("1u", "1u"),
            ("1024Mi", "1Gi"),
            ("1000Mi", "1000Mi"),
            ("0.5Gi", "512Mi"),
            ("1536Ki", "1536Ki"),
            ("1.5Ki", "1536"),
            ("0.5Ki", "512"),
            ("0.1Ki", "102400m"),
            ("1Ki", "1Ki"),
            ("1e3", "1e3"),
            ("1000e0", "1e3"),
            ("12e6", "12e6"),
            ("1E", "1E"),
            ("-1G", "-1G"),
            ("-2Ki", "-2Ki"),
            ("0", "0"),
            ("0Gi", "0"),
        ];
        for (text, printed) in cases {
            assert_eq!(
                Quantity::parse(text).unwrap().to_string(),
                printed,
                "{text}"
            );
        }
    }

    #[test]
    fn measured_amounts_print_as_the_kubelet_builds_them() {
        // Bytes: `NewQuantity(n, BinarySI)`, decimal below 1024 or when no binary
        // suffix divides; inodes and PIDs: `NewQuantity(n, DecimalSI)`.
        assert_eq!(Quantity::from_value(100 << 20).to_string(), "100Mi");
        assert_eq!(Quantity::from_value(1000).to_string(), "1k");
        assert_eq!(Quantity::from_value(1023).to_string(), "1023");
        assert_eq!(Quantity::from_value(2000).to_string(), "2000");
        assert_eq!(Quantity::from_value(-1000).to_string(), "-1k");
        let decimal = |n| Quantity::from_value_in(n, QuantityFormat::DecimalSi).to_string();
        assert_eq!(decimal(1_000_000), "1M");
        assert_eq!(decimal(1 << 20), "1048576");
    }

    #[test]
    fn the_format_never_changes_a_comparison_and_a_sum_keeps_the_first_non_zero_format() {
        let decimal = Quantity::parse("1024").unwrap();
        let binary = Quantity::parse("1Ki").unwrap();
        assert_eq!(decimal, binary);
        assert_eq!(decimal.to_string(), "1024");
        assert_eq!(binary.to_string(), "1Ki");
        assert_eq!(decimal.plus(binary).to_string(), "2048");
        assert_eq!(binary.plus(decimal).to_string(), "2Ki");
        assert_eq!(Quantity::ZERO.plus(binary).to_string(), "1Ki");
    }
}
