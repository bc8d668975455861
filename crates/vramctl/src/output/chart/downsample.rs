//! Series to drawable runs: split at gaps, then reduce each run to what the pixels can show.
//!
//! A day at 100 ms is 864,000 samples for a plot about 1,000 pixels wide. Averaging would
//! hide exactly what people look for (the spike before an OOM), so each pixel column keeps
//! its first, lowest, highest and last sample (M4 aggregation): the drawn line covers the
//! same pixels as the full series would.

/// One unbroken run of samples, `(unix ms, bytes)`, in time order.
pub(crate) type Run = Vec<(i64, u64)>;

/// Splits `points` into runs separated by gaps (`None`) and reduces each run to at most
/// four points per column of `columns` columns spanning `start_ms..=end_ms`. Points outside
/// that span are dropped; unsorted input is sorted first.
pub(crate) fn runs(
    points: &[(i64, Option<u64>)],
    start_ms: i64,
    end_ms: i64,
    columns: u32,
) -> Vec<Run> {
    let mut sorted;
    let points = if points.is_sorted_by_key(|p| p.0) {
        points
    } else {
        sorted = points.to_vec();
        // Stable: two samples at one instant keep their order, as the recorder wrote them.
        sorted.sort_by_key(|p| p.0);
        &sorted
    };
    let mut runs = Vec::new();
    let mut current: Run = Vec::new();
    for &(at_ms, bytes) in points {
        if !(start_ms..=end_ms).contains(&at_ms) {
            continue;
        }
        match bytes {
            Some(bytes) => current.push((at_ms, bytes)),
            None if current.is_empty() => {}
            None => runs.push(std::mem::take(&mut current)),
        }
    }
    if !current.is_empty() {
        runs.push(current);
    }
    runs.into_iter()
        .map(|run| reduce(run, start_ms, end_ms, columns))
        .collect()
}

fn column(at_ms: i64, start_ms: i64, end_ms: i64, columns: u32) -> i128 {
    let span = (i128::from(end_ms) - i128::from(start_ms)).max(1);
    (i128::from(at_ms) - i128::from(start_ms)) * i128::from(columns) / span
}

/// M4: per column the first, min, max and last samples, in time order.
fn reduce(run: Run, start_ms: i64, end_ms: i64, columns: u32) -> Run {
    let budget = usize::try_from(columns)
        .unwrap_or(usize::MAX)
        .saturating_mul(4);
    if run.len() <= budget.max(4) {
        return run;
    }
    let mut out = Run::with_capacity(budget);
    let mut chunk_start = 0;
    while chunk_start < run.len() {
        let col = column(run[chunk_start].0, start_ms, end_ms, columns);
        let chunk_end = run[chunk_start..]
            .iter()
            .position(|p| column(p.0, start_ms, end_ms, columns) != col)
            .map_or(run.len(), |n| chunk_start + n);
        let chunk = &run[chunk_start..chunk_end];
        let first = 0;
        let last = chunk.len() - 1;
        let (mut min, mut max) = (0, 0);
        for (i, p) in chunk.iter().enumerate() {
            if p.1 < chunk[min].1 {
                min = i;
            }
            if p.1 > chunk[max].1 {
                max = i;
            }
        }
        let mut keep = [first, min, max, last];
        keep.sort_unstable();
        let mut previous = None;
        for i in keep {
            if previous != Some(i) {
                out.push(chunk[i]);
                previous = Some(i);
            }
        }
        chunk_start = chunk_end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_break_runs() {
        let points = [
            (0, Some(1)),
            (1, Some(2)),
            (2, None),
            (3, None),
            (4, Some(5)),
        ];
        assert_eq!(
            runs(&points, 0, 10, 100),
            [vec![(0, 1), (1, 2)], vec![(4, 5)]]
        );
    }

    #[test]
    fn empty_and_all_gaps_give_no_runs() {
        assert!(runs(&[], 0, 10, 100).is_empty());
        assert!(runs(&[(1, None), (2, None)], 0, 10, 100).is_empty());
    }

    #[test]
    fn unsorted_input_is_sorted_and_outside_points_dropped() {
        let points = [(5, Some(5)), (1, Some(1)), (-3, Some(9)), (20, Some(9))];
        assert_eq!(runs(&points, 0, 10, 100), [vec![(1, 1), (5, 5)]]);
    }

    #[test]
    fn reduction_keeps_spikes_and_bounds_the_point_count() {
        // 100,000 flat samples with one spike and one dip, over 500 columns.
        let mut points: Vec<(i64, Option<u64>)> = (0..100_000).map(|t| (t, Some(10))).collect();
        points[31_337].1 = Some(1_000);
        points[77_777].1 = Some(0);
        let runs = runs(&points, 0, 99_999, 500);
        assert_eq!(runs.len(), 1);
        let run = &runs[0];
        assert!(run.len() <= 2_000, "{}", run.len());
        assert!(run.contains(&(31_337, 1_000)));
        assert!(run.contains(&(77_777, 0)));
        assert_eq!(run.first(), Some(&(0, 10)));
        assert_eq!(run.last(), Some(&(99_999, 10)));
        assert!(run.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn short_runs_are_untouched() {
        let points: Vec<_> = (0..50).map(|t| (t, Some(t as u64))).collect();
        let runs = runs(&points, 0, 49, 20);
        assert_eq!(runs[0].len(), 50);
    }

    #[test]
    fn extreme_times_do_not_overflow() {
        let points = [
            (i64::MIN, Some(1)),
            (0, Some(2)),
            (i64::MAX, Some(u64::MAX)),
        ];
        let runs = runs(&points, i64::MIN, i64::MAX, 1);
        assert_eq!(runs[0].len(), 3);
    }
}
