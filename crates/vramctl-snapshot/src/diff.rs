//! What changed between two snapshots: live bytes and blocks per folded stack (the groups
//! of `--top --by stack`) in A and in B, the stacks that appeared, grew, shrank or went
//! away, largest change first. A stack whose bytes keep growing from one snapshot to the
//! next is where a leak is allocated.

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use crate::model::Snapshot;
use crate::top::{By, live_by};

/// How a stack's live memory changed from A to B.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// No live block in A.
    Appeared,
    Grew,
    Shrank,
    /// No live block in B.
    Gone,
    /// The same bytes in a different number of blocks.
    Reblocked,
}

#[derive(Debug, Clone, Serialize)]
pub struct DiffRow {
    /// The folded stack, innermost first, joined by " < " (as `--top --by stack`).
    pub stack: String,
    pub change: Change,
    pub a_bytes: u64,
    pub b_bytes: u64,
    /// `b_bytes − a_bytes`.
    pub delta_bytes: i128,
    pub a_blocks: u64,
    pub b_blocks: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Diff {
    /// Σ live (active) bytes of A and of B, over all stacks.
    pub a_live_bytes: u64,
    pub b_live_bytes: u64,
    pub delta_bytes: i128,
    pub a_live_blocks: u64,
    pub b_live_blocks: u64,
    /// The changed stacks, by |delta_bytes| (largest first), then by stack.
    pub rows: Vec<DiffRow>,
}

/// The stacks whose live bytes or blocks differ between `a` and `b`; unchanged ones are
/// left out (a file against itself has no row).
pub fn diff(a: &Snapshot, b: &Snapshot) -> Diff {
    diff_by(a, b, By::Stack)
}

/// [`diff`] grouped by `by`: `By::Frame` groups live blocks by the first frame of user
/// code that allocated them (what a leak's "where" names, `vramctl leaks --watch --where`),
/// so that two call paths into one leaking line add up.
pub fn diff_by(a: &Snapshot, b: &Snapshot, by: By) -> Diff {
    let in_a = live_by(a, by);
    let in_b = live_by(b, by);
    let sum = |m: &HashMap<String, (u64, u64)>| {
        m.values().fold((0u64, 0u64), |acc, v| {
            (acc.0.saturating_add(v.0), acc.1 + v.1)
        })
    };
    let (a_live_bytes, a_live_blocks) = sum(&in_a);
    let (b_live_bytes, b_live_blocks) = sum(&in_b);
    let keys: HashSet<&String> = in_a.keys().chain(in_b.keys()).collect();
    let mut rows: Vec<DiffRow> = keys
        .into_iter()
        .filter_map(|stack| {
            let (a_bytes, a_blocks) = in_a.get(stack).copied().unwrap_or_default();
            let (b_bytes, b_blocks) = in_b.get(stack).copied().unwrap_or_default();
            let delta_bytes = i128::from(b_bytes) - i128::from(a_bytes);
            let change = if a_blocks == 0 {
                Change::Appeared
            } else if b_blocks == 0 {
                Change::Gone
            } else if delta_bytes > 0 {
                Change::Grew
            } else if delta_bytes < 0 {
                Change::Shrank
            } else if a_blocks != b_blocks {
                Change::Reblocked
            } else {
                return None;
            };
            Some(DiffRow {
                stack: stack.clone(),
                change,
                a_bytes,
                b_bytes,
                delta_bytes,
                a_blocks,
                b_blocks,
            })
        })
        .collect();
    rows.sort_by(|x, y| {
        y.delta_bytes
            .unsigned_abs()
            .cmp(&x.delta_bytes.unsigned_abs())
            .then_with(|| x.stack.cmp(&y.stack))
    });
    Diff {
        a_live_bytes,
        b_live_bytes,
        delta_bytes: i128::from(b_live_bytes) - i128::from(a_live_bytes),
        a_live_blocks,
        b_live_blocks,
        rows,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One segment whose blocks are (size, stack id); stack n ≥ 1 is one frame of user
    /// code (`a.py`, `b.py`, `c.py`, `d.py`), stack 0 none.
    fn snap(blocks: &[(u64, u32)]) -> Snapshot {
        crate::testing::live_blocks(
            blocks,
            &[
                ("/a.py", 1, "f"),
                ("/b.py", 2, "f"),
                ("/c.py", 3, "f"),
                ("/d.py", 4, "f"),
            ],
        )
    }

    #[test]
    fn stacks_that_appear_grow_shrink_or_go_are_sorted_by_the_size_of_the_change() {
        let a = snap(&[(100, 1), (50, 2), (10, 3), (10, 3), (30, 4)]);
        let b = snap(&[(60, 1), (400, 2), (20, 3), (7, 0)]);
        let d = diff(&a, &b);
        assert_eq!((d.a_live_bytes, d.b_live_bytes), (200, 487));
        assert_eq!(d.delta_bytes, 287);
        assert_eq!((d.a_live_blocks, d.b_live_blocks), (5, 4));
        let got: Vec<(&str, Change, i128, u64, u64)> = d
            .rows
            .iter()
            .map(|r| {
                (
                    r.stack.as_str(),
                    r.change,
                    r.delta_bytes,
                    r.a_blocks,
                    r.b_blocks,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("f (/b.py:2)", Change::Grew, 350, 1, 1),
                ("f (/a.py:1)", Change::Shrank, -40, 1, 1),
                ("f (/d.py:4)", Change::Gone, -30, 1, 0),
                (crate::top::NO_STACK, Change::Appeared, 7, 0, 1),
                ("f (/c.py:3)", Change::Reblocked, 0, 2, 1),
            ]
        );
    }

    #[test]
    fn a_snapshot_against_itself_has_no_change() {
        let a = snap(&[(100, 1), (50, 2), (7, 0)]);
        let d = diff(&a, &a);
        assert!(d.rows.is_empty(), "{:?}", d.rows);
        assert_eq!(
            (d.a_live_bytes, d.b_live_bytes, d.delta_bytes),
            (157, 157, 0)
        );
    }
}
