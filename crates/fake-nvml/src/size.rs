//! Byte sizes in scenario files: an integer number of bytes, or a string such as `"616 MiB"`.
//!
//! Strings exist so that sizes read naturally and so that values above `i64::MAX` (TOML's
//! integer range) can be written, e.g. `"18446744073709551615"`, the `NVML_VALUE_NOT_AVAILABLE`
//! sentinel real drivers put in `usedGpuMemory`.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, Visitor};

/// A number of bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Size(pub u64);

/// Units accepted after the number; binary (KiB) and decimal (KB) both exist because
/// NVML tools print binary units while vendors' data sheets use decimal ones.
const UNITS: &[(&str, u64)] = &[
    ("B", 1),
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("TiB", 1 << 40),
    ("kB", 1_000),
    ("KB", 1_000),
    ("MB", 1_000_000),
    ("GB", 1_000_000_000),
    ("TB", 1_000_000_000_000),
];

/// Parses `"<number> [unit]"`; the number may have a decimal fraction (`"1.5 GiB"`), the
/// result must be a whole number of bytes that fits in 64 bits.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: String = number.chars().filter(|c| *c != '_').collect();
    let unit = unit.trim();
    if number.is_empty() {
        return Err(format!("size {text:?} does not start with a number"));
    }
    let multiplier = if unit.is_empty() {
        1
    } else {
        UNITS
            .iter()
            .find(|(name, _)| *name == unit)
            .map(|(_, m)| *m)
            .ok_or_else(|| {
                format!("unknown size unit {unit:?} in {text:?} (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)")
            })?
    };
    let (whole, fraction) = match number.split_once('.') {
        Some((w, f)) => (w, f),
        None => (number.as_str(), ""),
    };
    if fraction.contains('.') || (whole.is_empty() && fraction.is_empty()) {
        return Err(format!("size {text:?} is not a number"));
    }
    let too_big = || format!("size {text:?} does not fit in 64 bits");
    // u128 so that `whole * multiplier` cannot overflow before we check the 64-bit range.
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| too_big())?
    };
    let mut bytes = whole
        .checked_mul(u128::from(multiplier))
        .ok_or_else(too_big)?;
    if !fraction.is_empty() {
        if fraction.len() > 18 {
            return Err(format!("size {text:?} has too many decimals"));
        }
        let digits: u128 = fraction.parse().map_err(|_| too_big())?;
        let scale = 10u128.pow(u32::try_from(fraction.len()).map_err(|_| too_big())?);
        let scaled = digits * u128::from(multiplier);
        if scaled % scale != 0 {
            return Err(format!("size {text:?} is not a whole number of bytes"));
        }
        bytes = bytes.checked_add(scaled / scale).ok_or_else(too_big)?;
    }
    u64::try_from(bytes).map_err(|_| too_big())
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SizeVisitor;
        impl Visitor<'_> for SizeVisitor {
            type Value = Size;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size: an integer number of bytes or a string like \"2 GiB\"")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Size, E> {
                u64::try_from(v)
                    .map(Size)
                    .map_err(|_| E::custom(format!("size {v} is negative")))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Size, E> {
                Ok(Size(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Size, E> {
                parse_size(v).map(Size).map_err(E::custom)
            }
        }
        deserializer.deserialize_any(SizeVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_units() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("123"), Ok(123));
        assert_eq!(parse_size("616 MiB"), Ok(616 << 20));
        assert_eq!(parse_size("616MiB"), Ok(616 << 20));
        assert_eq!(parse_size(" 2 GiB "), Ok(2 << 30));
        assert_eq!(parse_size("1 TiB"), Ok(1 << 40));
        assert_eq!(parse_size("4 KiB"), Ok(4096));
        assert_eq!(parse_size("3 GB"), Ok(3_000_000_000));
        assert_eq!(parse_size("5 kB"), Ok(5_000));
        assert_eq!(parse_size("7 B"), Ok(7));
        assert_eq!(parse_size("1_000 MB"), Ok(1_000_000_000));
    }

    #[test]
    fn fractions() {
        assert_eq!(parse_size("1.5 GiB"), Ok(3 << 29));
        assert_eq!(parse_size("0.5 KiB"), Ok(512));
        assert_eq!(parse_size(".25 MiB"), Ok(1 << 18));
        assert!(parse_size("1.5 B").is_err(), "half a byte");
        assert!(parse_size("1.2.3 GiB").is_err());
    }

    #[test]
    fn limits() {
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
        assert!(parse_size("18446744073709551616").is_err());
        assert_eq!(parse_size("16777215 TiB"), Ok(16_777_215u64 << 40));
        assert!(parse_size("16777216 TiB").is_err());
        assert!(parse_size("99999999999999999999999999999999999999999").is_err());
    }

    #[test]
    fn rejects_garbage() {
        assert!(parse_size("").is_err());
        assert!(parse_size("GiB").is_err());
        assert!(parse_size("12 gigs").is_err());
        assert!(parse_size("-1 GiB").is_err());
        assert!(
            parse_size("1 gib").is_err(),
            "units are case sensitive: b is bits"
        );
    }

    #[test]
    fn deserializes_from_toml() {
        #[derive(serde::Deserialize)]
        struct T {
            a: Size,
            b: Size,
            c: Size,
        }
        let t: T = toml::from_str("a = 42\nb = \"1 KiB\"\nc = \"18446744073709551615\"")
            .expect("valid sizes");
        assert_eq!((t.a.0, t.b.0, t.c.0), (42, 1024, u64::MAX));
        assert!(toml::from_str::<T>("a = -1\nb = 0\nc = 0").is_err());
        assert!(toml::from_str::<T>("a = 1.5\nb = 0\nc = 0").is_err());
    }
}
