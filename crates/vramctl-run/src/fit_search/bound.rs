//! An upper bound on the edge from the framework's *allocated* peak (issue 34's stop rule).
//!
//! At its peak a job holds at least its live tensors (PyTorch's allocated peak) plus what
//! lies outside the allocator's pool (the CUDA context and libraries' workspaces: NVML's
//! peak − the reserved peak). The pool can give its cache back and cuDNN can shrink its
//! workspaces under pressure — which is why NVML's peak flattens near the capacity
//! (ResNet-50 on the H200, docs/fit.md) — but live tensors cannot: a value whose allocated
//! peak + non-pool memory exceeds the capacity (or, with a margin, the usable share) runs
//! out of memory (or over the margin) whatever the allocator does. Extrapolating the
//! allocated peak by a line through the two largest succeeded values therefore bounds the
//! edge from above, as long as the allocated peak grows at least linearly there (convex
//! growth — attention scores ∝ length² — only loosens the bound). The line is refused when
//! the allocated peak grows *less* per unit between the two largest values than between the
//! two below them by more than [`MAX_RELATIVE_RESIDUAL`] (the same share that makes the NVML
//! line "not a line"): concave growth would make the bound too low.
//!
//! Unlike the NVML line, the bound is not a prediction: it leaves out the pool's
//! fragmentation (a few % of the pool), so the true edge lies below it. The search uses it
//! only to *stop* (the bracket `[ok, bound]` within the tolerance) and to place the first
//! predicted trial so that the trial after it settles the search either way.

use super::{DeviceMeasure, MAX_RELATIVE_RESIDUAL};

/// One succeeded trial's figures on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Point {
    pub value: u64,
    pub allocated_bytes: u64,
    /// NVML's peak − the reserved peak: the context and what else lies outside the pool.
    pub outside_pool_bytes: u64,
}

impl Point {
    /// The point of a trial that measured all three figures.
    pub fn of(value: u64, d: &DeviceMeasure) -> Option<Point> {
        let (nvml, reserved, allocated) = (
            d.nvml_peak_bytes?,
            d.reserved_peak_bytes?,
            d.allocated_peak_bytes?,
        );
        Some(Point {
            value,
            allocated_bytes: allocated,
            outside_pool_bytes: nvml.saturating_sub(reserved),
        })
    }
}

/// The largest value whose allocated peak + non-pool memory can stay within `limit_bytes`
/// on one device, from its succeeded trials; `None` without two distinct values, with a
/// slope ≤ 0, or with concave growth (see the module docs).
pub(super) fn device_bound(points: &[Point], limit_bytes: u64) -> Option<u64> {
    let mut sorted = points.to_vec();
    sorted.sort_unstable_by_key(|p| p.value);
    sorted.dedup_by_key(|p| p.value);
    let n = sorted.len();
    if n < 2 {
        return None;
    }
    let slope = |a: &Point, b: &Point| -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let s = (b.allocated_bytes as f64 - a.allocated_bytes as f64)
            / (b.value as f64 - a.value as f64);
        s
    };
    let (lower, upper) = (&sorted[n - 2], &sorted[n - 1]);
    let top = slope(lower, upper);
    if top.is_nan() || top <= 0.0 {
        return None;
    }
    if n >= 3 && top < (1.0 - MAX_RELATIVE_RESIDUAL) * slope(&sorted[n - 3], lower) {
        return None;
    }
    // The smallest non-pool share seen: a larger one only lowers the bound.
    let outside = points.iter().map(|p| p.outside_pool_bytes).min()?;
    let used = upper.allocated_bytes.saturating_add(outside);
    // A trial that succeeded above the limit (capacity grew since) says nothing safe.
    let room = limit_bytes.checked_sub(used)?;
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let more = (room as f64 / top).floor().min(u64::MAX as f64) as u64;
    Some(upper.value.saturating_add(more))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn p(value: u64, allocated_gib_milli: u64) -> Point {
        Point {
            value,
            allocated_bytes: allocated_gib_milli * GIB / 1000,
            outside_pool_bytes: GIB / 2,
        }
    }

    #[test]
    fn a_line_of_allocated_bytes_bounds_the_edge() {
        // 1 GiB + 1 GiB per value, 0.5 GiB outside the pool, 20.5 GiB: at most 19.
        let pts = [p(2, 3000), p(10, 11_000)];
        assert_eq!(device_bound(&pts, 41 * GIB / 2), Some(19));
        // One value only, or memory flat in the value: no bound.
        assert_eq!(device_bound(&pts[..1], 40 * GIB), None);
        assert_eq!(device_bound(&[p(2, 3000), p(10, 3000)], 40 * GIB), None);
    }

    #[test]
    fn concave_growth_or_a_point_over_the_limit_gives_no_bound() {
        // 1 GiB per value, then 0.5: the line through the top would bound too low.
        let concave = [p(2, 3000), p(10, 11_000), p(12, 12_000)];
        assert_eq!(device_bound(&concave, 40 * GIB), None);
        // Convex is fine (the bound is only looser).
        let convex = [p(2, 3000), p(10, 11_000), p(12, 14_000)];
        assert!(device_bound(&convex, 40 * GIB).is_some());
        assert_eq!(device_bound(&[p(2, 3000), p(10, 11_000)], 10 * GIB), None);
    }
}
