//! How memory grows with the value: least-squares fits of a device's peaks against the
//! values tried, the check that decides whether a fit may be extrapolated, and the
//! largest value a trusted fit puts under a limit.
//!
//! Pure arithmetic on `f64`; the search (`fit_search.rs`) decides which points and which
//! limit. A 3×3 normal-equation solve is all a quadratic fit needs, so no linear-algebra
//! crate is pulled in for it.

use serde::Serialize;

/// The largest relative residual a fit may leave on the points it was fitted on and still
/// be extrapolated, and the largest share of the limit the quadratic term may add at the
/// linear prediction before the line is called too straight.
///
/// Argued, not fitted: a fit that already mis-states memory by more than 5 % where it was
/// measured is off by at least that much at the edge, which is more than twice the 2 %
/// tolerance the one confirming trial can absorb — bracketing is then cheaper than
/// trusting it. Measurement noise of a fresh-process peak is far below it (two-point
/// calibrations predicted other sizes to ~0.1 % on an H200, research round 2 §1.4), so an
/// affine job passes. Checked (not chosen) on the simulated ±3 % noisy and quadratic jobs
/// in `simulation.rs`.
pub const MAX_RELATIVE_RESIDUAL: f64 = 0.05;

/// Which figure of a device's demand a fit is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Figure {
    /// NVML's peak of the trial's processes (else the framework's reserved peak): includes
    /// the allocator's cache, which it gives back under pressure.
    Conservative,
    /// The framework's allocated peak plus what lies outside its pool (NVML − reserved):
    /// what the job needs when the allocator is squeezed. Needs the agent.
    Optimistic,
}

/// The curve a fit found.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Curve {
    /// `bytes = intercept + slope·value`.
    Linear {
        intercept_bytes: f64,
        slope_bytes_per_value: f64,
    },
    /// `bytes = c0 + c1·value + c2·value²` (attention over a sequence length).
    Quadratic {
        c0_bytes: f64,
        c1_bytes_per_value: f64,
        c2_bytes_per_value2: f64,
    },
}

impl Curve {
    /// The curve's bytes at `value`.
    #[must_use]
    pub fn at(&self, value: f64) -> f64 {
        match *self {
            Curve::Linear {
                intercept_bytes,
                slope_bytes_per_value,
            } => intercept_bytes + slope_bytes_per_value * value,
            Curve::Quadratic {
                c0_bytes,
                c1_bytes_per_value,
                c2_bytes_per_value2,
            } => c0_bytes + c1_bytes_per_value * value + c2_bytes_per_value2 * value * value,
        }
    }

    /// The largest real value at which the curve is still at or under `limit_bytes`, when
    /// the curve grows there; `None` when it does not grow (no edge to find).
    fn edge(&self, limit_bytes: f64) -> Option<f64> {
        match *self {
            Curve::Linear {
                intercept_bytes,
                slope_bytes_per_value,
            } => (slope_bytes_per_value > 0.0)
                .then(|| (limit_bytes - intercept_bytes) / slope_bytes_per_value),
            Curve::Quadratic {
                c0_bytes,
                c1_bytes_per_value,
                c2_bytes_per_value2,
            } => {
                if c2_bytes_per_value2 <= 0.0 {
                    return None;
                }
                // Larger root of c2·v² + c1·v + (c0 − limit) = 0.
                let disc = c1_bytes_per_value * c1_bytes_per_value
                    - 4.0 * c2_bytes_per_value2 * (c0_bytes - limit_bytes);
                if disc < 0.0 {
                    // Never under the limit.
                    return Some(0.0);
                }
                Some((-c1_bytes_per_value + disc.sqrt()) / (2.0 * c2_bytes_per_value2))
            }
        }
    }
}

/// Whether a fit may be extrapolated, and if not why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Good on its points (or too few points to tell: two make a line exactly): predicts.
    Trusted,
    /// Fewer than two distinct values measured: nothing to fit yet.
    TooFewPoints,
    /// Memory does not grow with the value (slope ≤ 0): a line would put the edge at
    /// infinity or below zero, so it does not predict.
    Flat,
    /// Neither the line nor a quadratic is within `MAX_RELATIVE_RESIDUAL` of its points.
    PoorFit,
}

/// One device's fit of one figure against one limit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceModel {
    pub uuid: String,
    pub figure: Figure,
    /// What the figure must stay under: the capacity (no out-of-memory) or the usable part
    /// of it (`--margin`).
    pub limit_bytes: u64,
    /// Distinct values measured.
    pub points: usize,
    /// The curve chosen (the line unless the quadratic was needed); `None` with fewer
    /// than two points.
    pub curve: Option<Curve>,
    /// Largest |measured − fitted| / measured over the points; `None` with fewer than three
    /// (a line through two points, or a quadratic through three, has none to show).
    pub max_relative_residual: Option<f64>,
    pub verdict: Verdict,
    /// The largest value the trusted curve puts at or under the limit (floor), capped to
    /// `high` of the range; `None` when the fit is not trusted.
    pub prediction: Option<u64>,
}

/// Least-squares fit of `points` (value, bytes) for `figure` under `limit_bytes`, with the
/// check of `MAX_RELATIVE_RESIDUAL`; predictions are capped at `high`.
pub fn fit_device(
    uuid: &str,
    figure: Figure,
    limit_bytes: u64,
    points: &[(u64, u64)],
    high: u64,
) -> DeviceModel {
    #[allow(clippy::cast_precision_loss)] // bytes and values far below 2^53 in practice
    let pts: Vec<(f64, f64)> = points.iter().map(|&(v, y)| (v as f64, y as f64)).collect();
    let mut distinct: Vec<u64> = points.iter().map(|&(v, _)| v).collect();
    distinct.sort_unstable();
    distinct.dedup();
    let mut model = DeviceModel {
        uuid: uuid.to_owned(),
        figure,
        limit_bytes,
        points: distinct.len(),
        curve: None,
        max_relative_residual: None,
        verdict: Verdict::TooFewPoints,
        prediction: None,
    };
    let Some(line) = fit_line(&pts) else {
        return model;
    };
    #[allow(clippy::cast_precision_loss)]
    let limit = limit_bytes as f64;
    model.curve = Some(line);
    let line_residual = (distinct.len() >= 3).then(|| max_relative_residual(&line, &pts));
    model.max_relative_residual = line_residual;
    let line_good = line_residual.is_none_or(|r| r <= MAX_RELATIVE_RESIDUAL);
    let line_edge = line.edge(limit);

    // A quadratic needs three values to be fitted, four to be checked; through exactly
    // three it is as exact as a line through two, and is trusted the same way.
    let quad = (distinct.len() >= 3)
        .then(|| fit_quadratic(&pts))
        .flatten()
        .filter(|q| matches!(q, Curve::Quadratic { c2_bytes_per_value2, .. } if *c2_bytes_per_value2 > 0.0));
    let quad_residual = quad.map(|q| max_relative_residual(&q, &pts));
    let quad_good = quad_residual.is_some_and(|r| r <= MAX_RELATIVE_RESIDUAL);
    // The curvature matters when, at the line's own prediction, the quadratic term adds
    // more than the residual bound's share of the limit.
    let curvature_matters = match (quad, line_edge) {
        (
            Some(Curve::Quadratic {
                c2_bytes_per_value2,
                ..
            }),
            Some(edge),
        ) if edge > 0.0 => c2_bytes_per_value2 * edge * edge > MAX_RELATIVE_RESIDUAL * limit,
        _ => false,
    };

    let chosen = if line_edge.is_some() && line_good && !curvature_matters {
        Some((line, line_residual))
    } else if let (Some(q), true) = (quad, quad_good) {
        Some((q, quad_residual))
    } else {
        None
    };
    match chosen {
        Some((curve, residual)) => {
            model.curve = Some(curve);
            model.max_relative_residual = residual;
            model.verdict = Verdict::Trusted;
            model.prediction = curve.edge(limit).map(|edge| to_value(edge, high));
        }
        None => {
            model.verdict = if line_edge.is_none() {
                Verdict::Flat
            } else {
                Verdict::PoorFit
            };
        }
    }
    model
}

/// `edge` as a whole value: floor, 0 when negative (or not a number), at most `high`.
fn to_value(edge: f64, high: u64) -> u64 {
    if edge.is_nan() || edge <= 0.0 {
        return 0;
    }
    #[allow(clippy::cast_precision_loss)]
    if edge >= high as f64 {
        return high;
    }
    // In (0, high): the cast cannot truncate beyond the floor wanted.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let v = edge.floor() as u64;
    v
}

fn max_relative_residual(curve: &Curve, pts: &[(f64, f64)]) -> f64 {
    pts.iter()
        .map(|&(x, y)| {
            if y > 0.0 {
                (y - curve.at(x)).abs() / y
            } else {
                f64::INFINITY
            }
        })
        .fold(0.0, f64::max)
}

/// Ordinary least squares `y = a + b·x`; `None` with fewer than two distinct x.
fn fit_line(pts: &[(f64, f64)]) -> Option<Curve> {
    #[allow(clippy::cast_precision_loss)]
    let n = pts.len() as f64;
    if pts.len() < 2 {
        return None;
    }
    let mean_x = pts.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = pts.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = pts.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    let sxy: f64 = pts.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let slope = sxy / sxx;
    Some(Curve::Linear {
        intercept_bytes: mean_y - slope * mean_x,
        slope_bytes_per_value: slope,
    })
}

/// Least squares `y = c0 + c1·x + c2·x²`, with x scaled to [0, 1] so that the normal
/// equations stay well conditioned (x² of a sequence length reaches 10^7); `None` with
/// fewer than three distinct x.
fn fit_quadratic(pts: &[(f64, f64)]) -> Option<Curve> {
    let scale = pts.iter().map(|p| p.0.abs()).fold(0.0, f64::max);
    if pts.len() < 3 || scale <= 0.0 {
        return None;
    }
    // Normal equations M·c = r over the scaled x (u = x / scale).
    let mut m = [[0.0_f64; 3]; 3];
    let mut r = [0.0_f64; 3];
    for &(x, y) in pts {
        let u = x / scale;
        let powers = [1.0, u, u * u];
        for i in 0..3 {
            for j in 0..3 {
                m[i][j] += powers[i] * powers[j];
            }
            r[i] += powers[i] * y;
        }
    }
    let c = solve3(m, r)?;
    Some(Curve::Quadratic {
        c0_bytes: c[0],
        c1_bytes_per_value: c[1] / scale,
        c2_bytes_per_value2: c[2] / (scale * scale),
    })
}

/// Gaussian elimination with partial pivoting; `None` when singular (x not distinct).
fn solve3(mut m: [[f64; 3]; 3], mut r: [f64; 3]) -> Option<[f64; 3]> {
    for col in 0..3 {
        let pivot = (col..3).max_by(|&a, &b| m[a][col].abs().total_cmp(&m[b][col].abs()))?;
        if m[pivot][col].abs() < 1e-12 {
            return None;
        }
        m.swap(col, pivot);
        r.swap(col, pivot);
        for row in col + 1..3 {
            let f = m[row][col] / m[col][col];
            let pivot_row = m[col];
            for (cell, above) in m[row].iter_mut().zip(pivot_row).skip(col) {
                *cell -= f * above;
            }
            r[row] -= f * r[col];
        }
    }
    let mut c = [0.0; 3];
    for row in (0..3).rev() {
        let tail: f64 = (row + 1..3).map(|k| m[row][k] * c[k]).sum();
        c[row] = (r[row] - tail) / m[row][row];
    }
    Some(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn a_line_through_two_points_predicts_its_edge() {
        let m = fit_device(
            "g",
            Figure::Conservative,
            100 * GIB,
            &[(1, 12 * GIB), (5, 20 * GIB)],
            4096,
        );
        assert_eq!(m.verdict, Verdict::Trusted);
        assert_eq!(m.max_relative_residual, None);
        // 10 GiB + 2 GiB·v ≤ 100 GiB → v ≤ 45.
        assert_eq!(m.prediction, Some(45));
    }

    #[test]
    fn flat_memory_does_not_predict() {
        let m = fit_device(
            "g",
            Figure::Conservative,
            100 * GIB,
            &[(1, 20 * GIB), (8, 20 * GIB), (64, 20 * GIB)],
            4096,
        );
        assert_eq!(m.verdict, Verdict::Flat);
        assert_eq!(m.prediction, None);
    }

    #[test]
    fn quadratic_growth_is_fitted_as_a_quadratic() {
        // 4 GiB + 0.01 GiB·v²: a line through 1, 10, 40 is far off at the edge.
        let pts: Vec<(u64, u64)> = [1_u64, 10, 40, 60]
            .iter()
            .map(|&v| (v, 4 * GIB + v * v * GIB / 100))
            .collect();
        let m = fit_device("g", Figure::Conservative, 100 * GIB, &pts, 4096);
        assert!(matches!(m.curve, Some(Curve::Quadratic { .. })), "{m:?}");
        // 4 + v²/100 ≤ 100 → v ≤ 97.97.
        assert_eq!(m.prediction, Some(97));
    }

    #[test]
    fn a_prediction_beyond_the_range_is_capped_at_high() {
        let m = fit_device(
            "g",
            Figure::Conservative,
            100 * GIB,
            &[(1, GIB), (2, GIB + 1)],
            64,
        );
        assert_eq!(m.prediction, Some(64));
    }

    #[test]
    fn a_limit_below_the_intercept_predicts_zero() {
        let m = fit_device(
            "g",
            Figure::Conservative,
            5 * GIB,
            &[(1, 10 * GIB), (2, 11 * GIB)],
            64,
        );
        assert_eq!(m.prediction, Some(0));
    }
}
