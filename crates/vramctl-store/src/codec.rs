//! The compact encoding of a frame: the values that changed since the previous frame.
//!
//! A frame is the state of every series at one time (one tick, or one rollup bucket). It is
//! stored as a list of entries, sorted by series id:
//!
//! ```text
//! entry  := varint(header) value*
//! header := (series_id - previous_series_id) << 3 | mib << 2 | kind
//! kind   := 0 value (one varint) | 1 range (min, max, last) | 2 gone | 3 unknown
//! mib    := 1 when every value is a whole number of MiB and is written divided by 2^20
//! ```
//!
//! A *key* frame lists every present series; a *delta* frame lists only the series whose
//! entry changed, and `gone` for those that disappeared. Memory the driver reports is nearly
//! always a whole number of MiB, so a changed process costs 3 to 4 bytes. Varints are
//! LEB128 (7 bits per byte), so every `u64` fits.

use crate::error::StoreError;

/// What a frame says about one series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// One sample, or a bucket whose samples were all this value.
    Value(u64),
    /// A bucket whose samples varied.
    Range {
        /// Smallest sample.
        min: u64,
        /// Largest sample.
        max: u64,
        /// Latest sample.
        last: u64,
    },
    /// Present, but the value was not reported (e.g. NVML's "not available" for a
    /// process's memory).
    Unknown,
}

impl Entry {
    /// `(min, max, last)`, or `None` for [`Entry::Unknown`].
    pub fn min_max_last(self) -> Option<(u64, u64, u64)> {
        match self {
            Self::Value(v) => Some((v, v, v)),
            Self::Range { min, max, last } => Some((min, max, last)),
            Self::Unknown => None,
        }
    }

    /// Folds another sample of the same bucket into this entry.
    pub fn merge(self, later: Self) -> Self {
        match (self.min_max_last(), later.min_max_last()) {
            (Some((a_min, a_max, _)), Some((b_min, b_max, b_last))) => {
                let (min, max) = (a_min.min(b_min), a_max.max(b_max));
                if min == max && max == b_last {
                    Self::Value(b_last)
                } else {
                    Self::Range {
                        min,
                        max,
                        last: b_last,
                    }
                }
            }
            // An unknown sample adds nothing but does not erase what was seen.
            (Some(_), None) => self,
            (None, _) => later,
        }
    }
}

/// The state of every series at one time: index = series id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    entries: Vec<Option<Entry>>,
}

impl State {
    /// The entry of `series`, if present.
    pub fn get(&self, series: u32) -> Option<Entry> {
        self.entries
            .get(usize::try_from(series).ok()?)
            .copied()
            .flatten()
    }

    /// Sets (or, with `None`, removes) the entry of `series`.
    pub fn set(&mut self, series: u32, entry: Option<Entry>) {
        let Ok(i) = usize::try_from(series) else {
            return;
        };
        if i >= self.entries.len() {
            if entry.is_none() {
                return;
            }
            self.entries.resize(i + 1, None);
        }
        self.entries[i] = entry;
    }

    /// Present series and their entries, by id.
    pub fn iter(&self) -> impl Iterator<Item = (u32, Entry)> + '_ {
        self.entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| Some((u32::try_from(i).ok()?, (*e)?)))
    }

    /// Removes every entry.
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

const KIND_VALUE: u64 = 0;
const KIND_RANGE: u64 = 1;
const KIND_GONE: u64 = 2;
const KIND_UNKNOWN: u64 = 3;
const MIB: u64 = 1 << 20;

/// Encodes `cur` as a key frame (`prev` ignored) or as the changes from `prev`.
pub fn encode(prev: &State, cur: &State, key: bool, out: &mut Vec<u8>) {
    out.clear();
    let mut last_id: u64 = 0;
    let mut first = true;
    let n = prev.len().max(cur.len());
    for i in 0..n {
        let Ok(id) = u32::try_from(i) else { break };
        let now = cur.get(id);
        let before = if key { None } else { prev.get(id) };
        if !key && now == before {
            continue;
        }
        if key && now.is_none() {
            continue;
        }
        let delta = if first {
            u64::from(id)
        } else {
            u64::from(id) - last_id
        };
        first = false;
        last_id = u64::from(id);
        match now {
            None => put_varint(out, delta << 3 | KIND_GONE),
            Some(Entry::Unknown) => put_varint(out, delta << 3 | KIND_UNKNOWN),
            Some(Entry::Value(v)) => {
                let mib = v % MIB == 0;
                put_varint(out, delta << 3 | u64::from(mib) << 2 | KIND_VALUE);
                put_varint(out, if mib { v / MIB } else { v });
            }
            Some(Entry::Range { min, max, last }) => {
                let mib = min % MIB == 0 && max % MIB == 0 && last % MIB == 0;
                put_varint(out, delta << 3 | u64::from(mib) << 2 | KIND_RANGE);
                for v in [min, max, last] {
                    put_varint(out, if mib { v / MIB } else { v });
                }
            }
        }
    }
}

/// Applies a frame to `state`: a key frame replaces it, a delta frame updates it.
///
/// # Errors
/// [`StoreError::Corrupt`] when the bytes are not a frame.
pub fn apply(state: &mut State, data: &[u8], key: bool) -> Result<(), StoreError> {
    apply_tracked(state, data, key, None)
}

/// [`apply`], also listing in `touched` the series a delta frame named (cleared first).
///
/// # Errors
/// As [`apply`].
pub fn apply_tracked(
    state: &mut State,
    data: &[u8],
    key: bool,
    mut touched: Option<&mut Vec<u32>>,
) -> Result<(), StoreError> {
    if key {
        state.clear();
    }
    if let Some(t) = touched.as_deref_mut() {
        t.clear();
    }
    let mut pos = 0;
    let mut id: u64 = 0;
    let mut first = true;
    while pos < data.len() {
        let header = get_varint(data, &mut pos)?;
        let delta = header >> 3;
        id = if first {
            delta
        } else {
            id.checked_add(delta).ok_or_else(bad_frame)?
        };
        first = false;
        let series = u32::try_from(id).map_err(|_| bad_frame())?;
        let scale = if header & 4 != 0 { MIB } else { 1 };
        let value = |pos: &mut usize| -> Result<u64, StoreError> {
            get_varint(data, pos)?
                .checked_mul(scale)
                .ok_or_else(bad_frame)
        };
        let entry = match header & 3 {
            KIND_VALUE => Some(Entry::Value(value(&mut pos)?)),
            KIND_RANGE => Some(Entry::Range {
                min: value(&mut pos)?,
                max: value(&mut pos)?,
                last: value(&mut pos)?,
            }),
            KIND_GONE => None,
            _ => Some(Entry::Unknown),
        };
        state.set(series, entry);
        if let Some(t) = touched.as_deref_mut() {
            t.push(series);
        }
    }
    Ok(())
}

fn bad_frame() -> StoreError {
    StoreError::Corrupt {
        path: None,
        detail: "a stored frame is malformed".into(),
    }
}

pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(crate) fn get_varint(data: &[u8], pos: &mut usize) -> Result<u64, StoreError> {
    let mut v: u64 = 0;
    let mut shift = 0;
    loop {
        let byte = *data.get(*pos).ok_or_else(bad_frame)?;
        *pos += 1;
        if shift == 63 && byte > 1 {
            return Err(bad_frame());
        }
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(v);
        }
        shift += 7;
        if shift > 63 {
            return Err(bad_frame());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(entries: &[(u32, Entry)]) -> State {
        let mut s = State::default();
        for (id, e) in entries {
            s.set(*id, Some(*e));
        }
        s
    }

    #[test]
    fn key_frame_round_trips() {
        let s = state(&[
            (0, Entry::Value(0)),
            (3, Entry::Value(2 << 30)),
            (4, Entry::Value(644_939_776 + 1)),
            (9, Entry::Unknown),
            (700, Entry::Value(u64::MAX)),
            (
                701,
                Entry::Range {
                    min: 1 << 20,
                    max: 5 << 20,
                    last: 3 << 20,
                },
            ),
        ]);
        let mut buf = Vec::new();
        encode(&State::default(), &s, true, &mut buf);
        let mut back = state(&[(5, Entry::Value(1))]);
        apply(&mut back, &buf, true).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn delta_lists_only_changes_and_gone() {
        let a = state(&[(1, Entry::Value(10 << 20)), (2, Entry::Value(5))]);
        let b = state(&[(1, Entry::Value(10 << 20)), (3, Entry::Value(7))]);
        let mut buf = Vec::new();
        encode(&a, &b, false, &mut buf);
        // series 2 gone (1 byte), series 3 value 7 (2 bytes)
        assert_eq!(buf.len(), 3, "{buf:?}");
        let mut back = a.clone();
        apply(&mut back, &buf, false).unwrap();
        assert_eq!(back, b);
        encode(&b, &b, false, &mut buf);
        assert!(buf.is_empty());
    }

    #[test]
    fn a_changed_mib_value_costs_three_bytes() {
        let a = state(&[(5, Entry::Value(2048 << 20))]);
        let b = state(&[(5, Entry::Value(2050 << 20))]);
        let mut buf = Vec::new();
        encode(&a, &b, false, &mut buf);
        assert_eq!(buf.len(), 3);
    }

    #[test]
    fn garbage_is_corrupt_not_a_panic() {
        let mut s = State::default();
        assert!(apply(&mut s, &[0x80], true).is_err());
        assert!(apply(&mut s, &[0x00], true).is_err()); // value missing
        assert!(apply(&mut s, &[0xff; 11], true).is_err());
        assert!(
            apply(
                &mut s,
                &[0x05, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
                true
            )
            .is_err()
        );
    }

    #[test]
    fn merge_keeps_the_spike() {
        let e = Entry::Value(5)
            .merge(Entry::Value(9))
            .merge(Entry::Value(5));
        assert_eq!(
            e,
            Entry::Range {
                min: 5,
                max: 9,
                last: 5
            }
        );
        assert_eq!(Entry::Value(5).merge(Entry::Value(5)), Entry::Value(5));
        assert_eq!(Entry::Value(5).merge(Entry::Unknown), Entry::Value(5));
    }
}
