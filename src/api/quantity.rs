//! Kubernetes-style resource quantities (`500m`, `1`, `512Mi`, `1.5G`, `1e9`).
//!
//! Users write them as YAML integers or strings; the schema accepts both
//! (`x-kubernetes-int-or-string`) and checks the shape with the same pattern Kubernetes uses
//! for `resource.Quantity`. The Rust side keeps the text as written and parses it on demand
//! with exact integer arithmetic (no floating point), rounding up like Kubernetes does.

use std::borrow::Cow;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The pattern Kubernetes publishes for `resource.Quantity`.
pub const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

/// A resource quantity exactly as the user wrote it (`"500m"`, `"1"`, `"512Mi"`).
///
/// Deserialises from a JSON/YAML integer or string; always serialises as a string.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Quantity(pub String);

impl Quantity {
    /// The quantity in thousandths of a unit, rounded up (CPU: millicores). `"500m"` → 500,
    /// `"2"` → 2000, `"0.1"` → 100.
    pub fn to_millis(&self) -> Result<u64, String> {
        parse(&self.0, 3)
    }

    /// The quantity in whole units, rounded up (memory and disk: bytes). `"512Mi"` →
    /// 536870912, `"1G"` → 1000000000, `"1.5Ki"` → 1536.
    pub fn to_bytes(&self) -> Result<u64, String> {
        parse(&self.0, 0)
    }

    /// The text as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for Quantity {
    fn from(s: &str) -> Self {
        Quantity(s.to_string())
    }
}

impl From<String> for Quantity {
    fn from(s: String) -> Self {
        Quantity(s)
    }
}

impl Serialize for Quantity {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct QuantityVisitor;

        impl Visitor<'_> for QuantityVisitor {
            type Value = Quantity;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a quantity as an integer or a string such as \"500m\" or \"512Mi\"")
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Quantity, E> {
                if v.is_finite() {
                    Ok(Quantity(v.to_string()))
                } else {
                    Err(E::custom(format!("quantity {v} is not a finite number")))
                }
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }

            fn visit_string<E: de::Error>(self, v: String) -> Result<Quantity, E> {
                Ok(Quantity(v))
            }
        }

        deserializer.deserialize_any(QuantityVisitor)
    }
}

impl JsonSchema for Quantity {
    fn schema_name() -> Cow<'static, str> {
        "Quantity".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        // No `type` (structural int-or-string); the pattern applies to the string form only.
        // Every quantity in the API is a ceiling or a size, for which zero would silently read
        // as "no limit": the rule refuses zero and negatives at admission.
        json_schema!({
            "x-kubernetes-int-or-string": true,
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-validations": [{
                "rule": "type(self) == int ? self > 0 : (!self.startsWith('-') && quantity(self).isGreaterThan(quantity('0')))",
                "message": "must be greater than zero (zero or a negative amount is not \"no limit\"): remove the field for the provider's default, or give a quantity such as 500m, 2 or 512Mi"
            }]
        })
    }
}

/// Decimal suffixes as powers of ten.
fn decimal_suffix(s: &str) -> Option<i32> {
    Some(match s {
        "n" => -9,
        "u" => -6,
        "m" => -3,
        "" => 0,
        "k" => 3,
        "M" => 6,
        "G" => 9,
        "T" => 12,
        "P" => 15,
        "E" => 18,
        _ => return None,
    })
}

/// Binary suffixes as powers of two.
fn binary_suffix(s: &str) -> Option<u32> {
    Some(match s {
        "Ki" => 10,
        "Mi" => 20,
        "Gi" => 30,
        "Ti" => 40,
        "Pi" => 50,
        "Ei" => 60,
        _ => return None,
    })
}

/// Parses `text` and returns `ceil(value * 10^scale)` as a u64.
fn parse(text: &str, scale: i32) -> Result<u64, String> {
    let bad = |why: &str| format!("invalid quantity {text:?}: {why}");
    let body = match text.as_bytes().first() {
        None => return Err(bad("it is empty")),
        Some(b'-') => return Err(bad("it is negative")),
        Some(b'+') => &text[1..],
        Some(_) => text,
    };

    // Number: digits [ '.' digits ] | '.' digits
    let num_len = body
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(body.len());
    let (number, suffix) = body.split_at(num_len);
    let (int_part, frac_part) = match number.split_once('.') {
        Some((i, f)) => (i, f),
        None => (number, ""),
    };
    if (int_part.is_empty() && frac_part.is_empty()) || frac_part.contains('.') {
        return Err(bad(
            "expected a number such as 1, 0.5 or 250 before the suffix",
        ));
    }
    let digits = format!("{int_part}{frac_part}");
    let digits = digits.trim_start_matches('0');
    if digits.len() > 38 {
        return Err(bad("too many digits"));
    }
    let mantissa: u128 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| bad("not a number"))?
    };
    let frac_len = i32::try_from(frac_part.len()).map_err(|_| bad("too many digits"))?;

    // Suffix: binary, decimal, or an exponent.
    let (pow10, pow2) = if let Some(p2) = binary_suffix(suffix) {
        (0, p2)
    } else if let Some(p10) = decimal_suffix(suffix) {
        (p10, 0)
    } else if let Some(exp) = suffix.strip_prefix(['e', 'E']) {
        let exp: i32 = exp
            .strip_prefix('+')
            .unwrap_or(exp)
            .parse()
            .map_err(|_| bad("the exponent after 'e' must be an integer, e.g. 1e9"))?;
        if !(-1000..=1000).contains(&exp) {
            return Err(bad("exponent out of range"));
        }
        (exp, 0)
    } else {
        return Err(bad(
            "unknown suffix; use Ki Mi Gi Ti Pi Ei, n u m k M G T P E, or an exponent (e.g. 1e9)",
        ));
    };

    // value * 10^scale = mantissa * 2^pow2 * 10^(pow10 + scale - frac_len)
    let too_large = || bad("too large");
    let numerator = mantissa
        .checked_mul(1u128.checked_shl(pow2).ok_or_else(too_large)?)
        .ok_or_else(too_large)?;
    let exp10 = pow10 + scale - frac_len;
    let value = if numerator == 0 {
        0
    } else if exp10 >= 0 {
        let factor = 10u128
            .checked_pow(exp10.unsigned_abs())
            .ok_or_else(too_large)?;
        numerator.checked_mul(factor).ok_or_else(too_large)?
    } else {
        match 10u128.checked_pow(exp10.unsigned_abs()) {
            Some(divisor) => numerator.div_ceil(divisor),
            // The divisor exceeds any numerator we can hold: a positive value rounds up to 1.
            None => u128::from(numerator > 0),
        }
    };
    u64::try_from(value).map_err(|_| too_large())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn millis(s: &str) -> Result<u64, String> {
        Quantity::from(s).to_millis()
    }

    fn bytes(s: &str) -> Result<u64, String> {
        Quantity::from(s).to_bytes()
    }

    #[test]
    fn cpu_millis() {
        assert_eq!(millis("500m"), Ok(500));
        assert_eq!(millis("1"), Ok(1000));
        assert_eq!(millis("2"), Ok(2000));
        assert_eq!(millis("0.5"), Ok(500));
        assert_eq!(millis("1.25"), Ok(1250));
        assert_eq!(millis(".1"), Ok(100));
        assert_eq!(millis("+1"), Ok(1000));
        assert_eq!(millis("1500m"), Ok(1500));
        assert_eq!(millis("0"), Ok(0));
        assert_eq!(millis("1k"), Ok(1_000_000));
        assert_eq!(millis("1e-3"), Ok(1));
        assert_eq!(millis("2E0"), Ok(2000));
        // Sub-millicore values round up, like Kubernetes.
        assert_eq!(millis("100u"), Ok(1));
        assert_eq!(millis("1n"), Ok(1));
        assert_eq!(millis("0.0001"), Ok(1));
    }

    #[test]
    fn memory_bytes() {
        assert_eq!(bytes("512Mi"), Ok(512 * 1024 * 1024));
        assert_eq!(bytes("1Ki"), Ok(1024));
        assert_eq!(bytes("1.5Ki"), Ok(1536));
        assert_eq!(bytes("1Gi"), Ok(1 << 30));
        assert_eq!(bytes("2Ti"), Ok(2 << 40));
        assert_eq!(bytes("1Pi"), Ok(1 << 50));
        assert_eq!(bytes("1Ei"), Ok(1 << 60));
        assert_eq!(bytes("1k"), Ok(1000));
        assert_eq!(bytes("1M"), Ok(1_000_000));
        assert_eq!(bytes("1G"), Ok(1_000_000_000));
        assert_eq!(bytes("1T"), Ok(1_000_000_000_000));
        assert_eq!(bytes("1P"), Ok(1_000_000_000_000_000));
        assert_eq!(bytes("1E"), Ok(1_000_000_000_000_000_000));
        assert_eq!(bytes("1e9"), Ok(1_000_000_000));
        assert_eq!(bytes("1E+3"), Ok(1000));
        assert_eq!(bytes("128974848"), Ok(128_974_848));
        assert_eq!(bytes("129e6"), Ok(129_000_000));
        assert_eq!(bytes("123Mi"), Ok(128_974_848));
        assert_eq!(bytes("1500m"), Ok(2));
        assert_eq!(bytes("0.5"), Ok(1));
        assert_eq!(bytes("0Gi"), Ok(0));
    }

    #[test]
    fn errors_name_the_value() {
        for bad in [
            "", "lots", "1x", "Mi", "1..5", "-1", "-500m", "1e", "1e1.5", "1 Gi", " 1", "1Gi ",
            "1ki", "0x10",
        ] {
            let err = bytes(bad).expect_err(bad);
            assert!(err.contains(&format!("{bad:?}")), "{err}");
            assert!(millis(bad).is_err(), "{bad}");
        }
        assert!(bytes("-1").unwrap_err().contains("negative"));
        assert!(bytes("lots").unwrap_err().contains("suffix"));
    }

    #[test]
    fn overflow_is_an_error_not_a_wrap() {
        assert!(bytes("16Ei").unwrap_err().contains("too large"));
        assert!(bytes("1e30").unwrap_err().contains("too large"));
        assert!(millis("1E").unwrap_err().contains("too large"));
        assert_eq!(bytes("15Ei"), Ok(15 << 60));
        assert_eq!(bytes("1e-999"), Ok(1));
        assert_eq!(bytes("0e999"), Ok(0));
    }

    #[test]
    fn serde_accepts_ints_and_strings_and_writes_strings() {
        let q: Quantity = serde_json::from_str("1").unwrap();
        assert_eq!(q, Quantity::from("1"));
        let q: Quantity = serde_json::from_str("\"500m\"").unwrap();
        assert_eq!(q.to_millis(), Ok(500));
        let q: Quantity = serde_yaml::from_str("512Mi").unwrap();
        assert_eq!(q.to_bytes(), Ok(512 << 20));
        let q: Quantity = serde_yaml::from_str("2").unwrap();
        assert_eq!(serde_json::to_string(&q).unwrap(), "\"2\"");
        assert!(serde_json::from_str::<Quantity>("true").is_err());
        assert!(serde_json::from_str::<Quantity>("{}").is_err());
    }

    #[test]
    fn pattern_matches_what_the_parser_accepts() {
        // Every string the parser accepts is one the Kubernetes pattern accepts (spot check of
        // shapes; the pattern itself is enforced by the API server).
        for ok in [
            "1", "500m", "0.5", ".5", "1.", "512Mi", "1e3", "1E-3", "+2", "1.5Gi",
        ] {
            assert!(bytes(ok).is_ok(), "{ok}");
        }
    }
}
