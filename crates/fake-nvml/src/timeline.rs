//! Values that change with the fake's clock: process memory, utilization, temperature, power.
//!
//! In a scenario a timeline is either a constant (`memory = "2 GiB"`) or a one-key table
//! naming its kind: `ramp`, `steps`, `points` or `sawtooth`. Evaluation is a pure function of
//! the time `t` in seconds, so tests can jump the clock anywhere and get the same answer.

use std::fmt;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};

use crate::size::Size;

/// The kind of value a timeline carries: bytes (`Size`) or a plain count (`Number`).
pub trait TimelineValue: Copy + Default + fmt::Debug + for<'de> Deserialize<'de> {
    /// The value as answered (whole units).
    fn to_u64(self) -> u64;
    /// The value for rates, which may be fractional (`rate_per_s = 0.2` degrees).
    fn to_f64(self) -> f64;
}

impl TimelineValue for Size {
    fn to_u64(self) -> u64 {
        self.0
    }
    fn to_f64(self) -> f64 {
        self.0 as f64
    }
}

/// A non-negative number: percent, degrees Celsius, milliwatts, MHz. Fractions are kept
/// (a ramp may rise 0.2 degrees per second) and rounded when a value is answered.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Number(pub f64);

impl TimelineValue for Number {
    fn to_u64(self) -> u64 {
        // `as` saturates, so a huge number answers u64::MAX rather than wrapping.
        self.0.round() as u64
    }
    fn to_f64(self) -> f64 {
        self.0
    }
}

impl<'de> Deserialize<'de> for Number {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NumberVisitor;
        impl Visitor<'_> for NumberVisitor {
            type Value = Number;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a non-negative number")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Number, E> {
                if v < 0 {
                    return Err(E::custom(format!("{v} is negative")));
                }
                Ok(Number(v as f64))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Number, E> {
                Ok(Number(v as f64))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Number, E> {
                if v.is_finite() && v >= 0.0 {
                    Ok(Number(v))
                } else {
                    Err(E::custom(format!("{v} is not a non-negative number")))
                }
            }
        }
        deserializer.deserialize_any(NumberVisitor)
    }
}

/// A value as a function of time.
#[derive(Debug, Clone, PartialEq)]
pub enum Timeline<V> {
    /// Always the same value.
    Const(V),
    /// `from + rate_per_s * t`, capped at `max` when given.
    Ramp {
        from: V,
        rate_per_s: V,
        max: Option<V>,
    },
    /// `values[floor(t / every_s)]`, staying at the last value afterwards.
    Steps { values: Vec<V>, every_s: f64 },
    /// Piecewise constant: the value of the last point at or before `t`; before the first
    /// point, the first point's value. Points are sorted by time.
    Points(Vec<(f64, V)>),
    /// Rises linearly from `low` to `high` over `period_s`, then drops back to `low`.
    Sawtooth { low: V, high: V, period_s: f64 },
}

impl<V: TimelineValue> Default for Timeline<V> {
    fn default() -> Self {
        Timeline::Const(V::default())
    }
}

impl<V: TimelineValue> Timeline<V> {
    /// The value at `t` seconds. Negative or NaN times count as 0.
    pub fn at(&self, t: f64) -> u64 {
        let t = if t > 0.0 { t } else { 0.0 };
        match self {
            Timeline::Const(v) => v.to_u64(),
            Timeline::Ramp {
                from,
                rate_per_s,
                max,
            } => {
                // f64 -> u64 `as` saturates, so a long-running ramp cannot wrap around.
                let grown = (rate_per_s.to_f64() * t) as u64;
                let value = from.to_u64().saturating_add(grown);
                match max {
                    Some(max) => value.min(max.to_u64()),
                    None => value,
                }
            }
            Timeline::Steps { values, every_s } => {
                let step = (t / every_s) as usize;
                values
                    .get(step)
                    .or_else(|| values.last())
                    .map_or(0, |v| v.to_u64())
            }
            Timeline::Points(points) => {
                let after = points.partition_point(|(at, _)| *at <= t);
                points
                    .get(after.saturating_sub(1))
                    .map_or(0, |(_, v)| v.to_u64())
            }
            Timeline::Sawtooth {
                low,
                high,
                period_s,
            } => {
                let (low, high) = (low.to_u64(), high.to_u64());
                let phase = (t / period_s).fract();
                low.saturating_add(((high - low) as f64 * phase) as u64)
            }
        }
    }
}

/// The table form, `{ ramp = {...} }` etc.; exactly one key must be present.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TimelineTable<V> {
    ramp: Option<RampSpec<V>>,
    steps: Option<StepsSpec<V>>,
    points: Option<Vec<(f64, V)>>,
    sawtooth: Option<SawtoothSpec<V>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RampSpec<V> {
    from: Option<V>,
    rate_per_s: V,
    max: Option<V>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StepsSpec<V> {
    values: Vec<V>,
    every_s: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SawtoothSpec<V> {
    low: V,
    high: V,
    period_s: f64,
}

fn timeline_from_table<V: TimelineValue>(table: TimelineTable<V>) -> Result<Timeline<V>, String> {
    let kinds = usize::from(table.ramp.is_some())
        + usize::from(table.steps.is_some())
        + usize::from(table.points.is_some())
        + usize::from(table.sawtooth.is_some());
    if kinds != 1 {
        return Err(
            "a timeline table needs exactly one of `ramp`, `steps`, `points`, `sawtooth`".into(),
        );
    }
    if let Some(r) = table.ramp {
        return Ok(Timeline::Ramp {
            from: r.from.unwrap_or_default(),
            rate_per_s: r.rate_per_s,
            max: r.max,
        });
    }
    if let Some(s) = table.steps {
        if s.values.is_empty() {
            return Err("`steps.values` is empty".into());
        }
        if !(s.every_s.is_finite() && s.every_s > 0.0) {
            return Err(format!("`steps.every_s` must be > 0, not {}", s.every_s));
        }
        return Ok(Timeline::Steps {
            values: s.values,
            every_s: s.every_s,
        });
    }
    if let Some(points) = table.points {
        if points.is_empty() {
            return Err("`points` is empty".into());
        }
        if points.iter().any(|(t, _)| !t.is_finite()) {
            return Err("`points` times must be finite numbers".into());
        }
        if points.windows(2).any(|w| w[0].0 > w[1].0) {
            return Err("`points` must be sorted by time".into());
        }
        return Ok(Timeline::Points(points));
    }
    if let Some(s) = table.sawtooth {
        if s.low.to_u64() > s.high.to_u64() {
            return Err("`sawtooth.low` is above `sawtooth.high`".into());
        }
        if !(s.period_s.is_finite() && s.period_s > 0.0) {
            return Err(format!(
                "`sawtooth.period_s` must be > 0, not {}",
                s.period_s
            ));
        }
        return Ok(Timeline::Sawtooth {
            low: s.low,
            high: s.high,
            period_s: s.period_s,
        });
    }
    Err("empty timeline table".into())
}

impl<'de, V: TimelineValue> Deserialize<'de> for Timeline<V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TimelineVisitor<V>(PhantomData<V>);

        impl<V: TimelineValue> TimelineVisitor<V> {
            fn constant<'de, E, D2>(value: D2) -> Result<Timeline<V>, E>
            where
                E: de::Error,
                D2: Deserializer<'de, Error = E>,
            {
                V::deserialize(value).map(Timeline::Const)
            }
        }

        impl<'de, V: TimelineValue> Visitor<'de> for TimelineVisitor<V> {
            type Value = Timeline<V>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a constant, or a table with one of `ramp`, `steps`, `points`, `sawtooth`",
                )
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Self::constant(de::value::I64Deserializer::new(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Self::constant(de::value::U64Deserializer::new(v))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
                Self::constant(de::value::F64Deserializer::new(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Self::constant(de::value::StrDeserializer::new(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                let table =
                    TimelineTable::<V>::deserialize(de::value::MapAccessDeserializer::new(map))?;
                timeline_from_table(table).map_err(de::Error::custom)
            }
        }

        deserializer.deserialize_any(TimelineVisitor(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    #[derive(Deserialize)]
    struct Doc {
        m: Timeline<Size>,
    }

    fn mem(src: &str) -> Timeline<Size> {
        toml::from_str::<Doc>(&format!("m = {src}"))
            .unwrap_or_else(|e| panic!("{src}: {e}"))
            .m
    }

    #[test]
    fn constant() {
        let t = mem("\"2 GiB\"");
        assert_eq!(t.at(0.0), 2 * GIB);
        assert_eq!(t.at(1e9), 2 * GIB);
        assert_eq!(mem("1024").at(5.0), 1024);
        assert_eq!(mem("\"18446744073709551615\"").at(3.0), u64::MAX);
    }

    #[test]
    fn ramp() {
        let t = mem(r#"{ ramp = { from = "1 GiB", rate_per_s = "10 MiB", max = "2 GiB" } }"#);
        assert_eq!(t.at(0.0), GIB);
        assert_eq!(t.at(10.0), GIB + 100 * MIB);
        assert_eq!(t.at(0.5), GIB + 5 * MIB);
        assert_eq!(t.at(1e6), 2 * GIB, "capped at max");
        assert_eq!(t.at(-5.0), GIB, "negative time is time 0");
        let uncapped = mem(r#"{ ramp = { rate_per_s = "1 GiB" } }"#);
        assert_eq!(uncapped.at(0.0), 0, "from defaults to 0");
        assert_eq!(uncapped.at(3.0), 3 * GIB);
        assert_eq!(
            uncapped.at(1e300),
            u64::MAX,
            "saturates instead of wrapping"
        );
    }

    #[test]
    fn steps() {
        let t = mem(r#"{ steps = { values = ["1 GiB", "2 GiB", "4 GiB"], every_s = 5.0 } }"#);
        assert_eq!(t.at(0.0), GIB);
        assert_eq!(t.at(4.99), GIB);
        assert_eq!(t.at(5.0), 2 * GIB);
        assert_eq!(t.at(10.0), 4 * GIB);
        assert_eq!(t.at(1000.0), 4 * GIB, "stays at the last value");
    }

    #[test]
    fn points() {
        let t = mem(r#"{ points = [[0.0, "1 GiB"], [10, "3 GiB"], [20.5, "512 MiB"]] }"#);
        assert_eq!(t.at(0.0), GIB);
        assert_eq!(t.at(9.9), GIB);
        assert_eq!(t.at(10.0), 3 * GIB);
        assert_eq!(t.at(20.4), 3 * GIB);
        assert_eq!(t.at(20.5), 512 * MIB);
        assert_eq!(t.at(99.0), 512 * MIB);
        let late = mem(r#"{ points = [[5.0, "1 GiB"], [6.0, "2 GiB"]] }"#);
        assert_eq!(late.at(0.0), GIB, "before the first point: the first value");
    }

    #[test]
    fn sawtooth() {
        let t = mem(r#"{ sawtooth = { low = "1 GiB", high = "9 GiB", period_s = 10.0 } }"#);
        assert_eq!(t.at(0.0), GIB);
        assert_eq!(t.at(5.0), 5 * GIB);
        assert_eq!(t.at(9.999) / MIB, (9 * GIB - 8 * GIB / 10_000) / MIB);
        assert_eq!(t.at(10.0), GIB, "drops back at the period");
        assert_eq!(t.at(12.5), 3 * GIB);
    }

    #[test]
    fn numbers() {
        #[derive(Deserialize)]
        struct N {
            u: Timeline<Number>,
        }
        let n: N = toml::from_str("u = 37.6").expect("float");
        assert_eq!(n.u.at(0.0), 38);
        let n: N = toml::from_str("u = { steps = { values = [0, 50, 100], every_s = 1 } }")
            .expect("steps of numbers");
        assert_eq!(n.u.at(1.5), 50);
        let n: N = toml::from_str("u = { ramp = { from = 38, rate_per_s = 0.2, max = 64 } }")
            .expect("fractional rate");
        assert_eq!(n.u.at(10.0), 40);
        assert_eq!(n.u.at(1000.0), 64);
        assert!(toml::from_str::<N>("u = -3").is_err());
        assert!(
            toml::from_str::<N>("u = \"5\"").is_err(),
            "numbers are not strings"
        );
    }

    #[test]
    fn bad_tables() {
        let bad = |src: &str| {
            toml::from_str::<Doc>(&format!("m = {src}"))
                .err()
                .unwrap_or_else(|| panic!("{src} should be rejected"))
                .message()
                .to_owned()
        };
        assert!(bad("{}").contains("exactly one"));
        assert!(
            bad(r#"{ ramp = { rate_per_s = 1 }, steps = { values = [1], every_s = 1 } }"#)
                .contains("exactly one")
        );
        assert!(bad(r#"{ wobble = 1 }"#).contains("unknown field"));
        assert!(bad(r#"{ ramp = { rate = 1 } }"#).contains("unknown field"));
        assert!(bad(r#"{ steps = { values = [], every_s = 1 } }"#).contains("empty"));
        assert!(bad(r#"{ steps = { values = [1], every_s = 0 } }"#).contains("> 0"));
        assert!(bad(r#"{ points = [[2, 1], [1, 1]] }"#).contains("sorted"));
        assert!(bad(r#"{ sawtooth = { low = 5, high = 1, period_s = 1 } }"#).contains("above"));
        assert!(bad(r#"{ sawtooth = { low = 1, high = 5, period_s = -1 } }"#).contains("> 0"));
        assert!(bad(r#""12 gigs""#).contains("unit"));
        assert!(bad("true").contains("invalid type"));
    }
}
