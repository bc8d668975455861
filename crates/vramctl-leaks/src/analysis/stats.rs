//! The statistics behind the verdicts: Theil–Sen slope, the Mann–Kendall trend test with the
//! Hamed–Rao autocorrelation correction, and the small helpers they need.
//!
//! Everything works on `f64`: byte counts up to 2^53 are exact, larger ones (which no GPU
//! has) lose precision far below anything the verdicts look at. Callers thin their input so
//! that the O(n²) parts stay bounded (`docs/leaks.md`, "Cost").

/// Median of pairwise slopes `(yⱼ − yᵢ) / (tⱼ − tᵢ)` over pairs with `tⱼ > tᵢ`.
///
/// Robust to about 29 % of outliers (spikes, eval phases). `None` when fewer than two
/// distinct times. O(n²) time and memory: thin the input first.
pub fn theil_sen(points: &[(f64, f64)]) -> Option<f64> {
    let mut slopes = Vec::with_capacity(points.len() * points.len().saturating_sub(1) / 2);
    for (i, &(ti, yi)) in points.iter().enumerate() {
        for &(tj, yj) in &points[i + 1..] {
            let dt = tj - ti;
            if dt > 0.0 {
                slopes.push((yj - yi) / dt);
            } else if dt < 0.0 {
                slopes.push((yi - yj) / -dt);
            }
        }
    }
    median_in_place(&mut slopes)
}

/// Median of a slice (reordered in place); `None` when empty or when any value is NaN.
pub fn median_in_place(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() || values.iter().any(|v| v.is_nan()) {
        return None;
    }
    let n = values.len();
    let mid = n / 2;
    let (_, upper, _) = values.select_nth_unstable_by(mid, f64::total_cmp);
    let upper = *upper;
    if n % 2 == 1 {
        return Some(upper);
    }
    // The lower middle is the largest value left of `mid` after selection.
    let lower = values[..mid]
        .iter()
        .copied()
        .max_by(f64::total_cmp)
        .unwrap_or(upper);
    Some(f64::midpoint(lower, upper))
}

/// Result of a Mann–Kendall test for an upward trend.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct MannKendall {
    /// Number of values tested.
    pub n: usize,
    /// S = Σᵢ<ⱼ sign(yⱼ − yᵢ).
    pub s: i64,
    /// Var(S) after the tie correction and the autocorrelation correction.
    pub var_s: f64,
    /// Standard normal score with continuity correction (0 when the exact test was used).
    pub z: f64,
    /// One-sided p-value of "no upward trend".
    pub p_value: f64,
    /// Hamed–Rao variance inflation n/n* (1 when not applied).
    pub autocorrelation_factor: f64,
    /// Whether `p_value` comes from the exact null distribution (small n, no ties).
    pub exact: bool,
}

/// Largest n for the exact null distribution of S (n! must fit comfortably in a u64).
const EXACT_MAX_N: usize = 10;
/// Smallest n for which the autocorrelation of ranks is worth estimating.
const HAMED_RAO_MIN_N: usize = 11;

/// Mann–Kendall test for an upward trend in `y` (in time order).
///
/// S and its variance with the usual tie correction
/// `Var(S) = [n(n−1)(2n+5) − Σ tₚ(tₚ−1)(2tₚ+5)] / 18`. For n ≤ 10 without ties the p-value
/// is exact (Mahonian numbers); otherwise Z = (S − sign S)/√Var(S). From n ≥ 11 the variance
/// is inflated by the Hamed–Rao factor n/n* computed from the significant autocorrelations of
/// the ranks of the detrended series (`hamed_rao_factor`), never below 1.
pub fn mann_kendall(y: &[f64]) -> MannKendall {
    let n = y.len();
    let mut s: i64 = 0;
    for i in 0..n {
        for j in i + 1..n {
            s += sign(y[j] - y[i]);
        }
    }
    let n_f = n as f64;
    let ties = tie_groups(y);
    let tie_term: f64 = ties
        .iter()
        .map(|&t| {
            let t = t as f64;
            t * (t - 1.0) * (2.0 * t + 5.0)
        })
        .sum();
    let mut var_s = (n_f * (n_f - 1.0) * (2.0 * n_f + 5.0) - tie_term) / 18.0;
    let no_ties = ties.is_empty();
    if n <= EXACT_MAX_N && no_ties {
        return MannKendall {
            n,
            s,
            var_s,
            z: 0.0,
            p_value: exact_upper_tail(n, s),
            autocorrelation_factor: 1.0,
            exact: true,
        };
    }
    let factor = if n >= HAMED_RAO_MIN_N {
        hamed_rao_factor(y)
    } else {
        1.0
    };
    var_s *= factor;
    let z = if var_s <= 0.0 || s == 0 {
        0.0
    } else {
        (s - s.signum()) as f64 / var_s.sqrt()
    };
    MannKendall {
        n,
        s,
        var_s,
        z,
        p_value: if var_s <= 0.0 { 1.0 } else { normal_sf(z) },
        autocorrelation_factor: factor,
        exact: false,
    }
}

fn sign(d: f64) -> i64 {
    if d > 0.0 {
        1
    } else if d < 0.0 {
        -1
    } else {
        0
    }
}

/// P(X ≥ x) for X a sum of independent Bernoulli variables with success probabilities
/// `probs` (the Poisson-binomial distribution), by dynamic programming: O(len²).
pub fn poisson_binomial_upper_tail(probs: &[f64], x: usize) -> f64 {
    if x == 0 {
        return 1.0;
    }
    if x > probs.len() {
        return 0.0;
    }
    // dist[j] = P(j successes so far).
    let mut dist = vec![0.0_f64; probs.len() + 1];
    dist[0] = 1.0;
    for (i, &p) in probs.iter().enumerate() {
        let p = p.clamp(0.0, 1.0);
        for j in (0..=i + 1).rev() {
            let stay = dist[j] * (1.0 - p);
            let come = if j > 0 { dist[j - 1] * p } else { 0.0 };
            dist[j] = stay + come;
        }
    }
    dist[x..].iter().sum::<f64>().clamp(0.0, 1.0)
}

/// Probability that window `k` (1-based, of equal windows since the growth began) holds a
/// new maximum of any of `sources` independent sequences of i.i.d. values arriving at a
/// steady pace: the chance that the maximum of the first `k` windows' values is not
/// among the first `k − 1` windows' is `1 − ((k − 1)/k)` for one sequence (the records
/// of an i.i.d. sequence are independent events; `(k − 1)/k` is exactly the chance of
/// no record in the k-th window), and for `sources` sequences `1 − ((k − 1)/k)^sources`.
/// It is distribution-free: what the values are (batch shapes, request sizes) does not
/// matter, only that they are exchangeable.
pub fn record_window_probability(k: usize, sources: u32) -> f64 {
    if k <= 1 {
        return 1.0;
    }
    let none = (k - 1) as f64 / k as f64;
    1.0 - none.powi(i32::try_from(sources).unwrap_or(i32::MAX))
}

/// [`record_window_probability`] of windows 2 to `k`: the steadiness test's windows
/// after the first, under a warm-up of `sources` sequences of new maxima.
pub fn later_window_probabilities(k: usize, sources: u32) -> impl Iterator<Item = f64> {
    (2..=k).map(move |j| record_window_probability(j, sources))
}

/// Sizes of the groups of equal values that have more than one member.
fn tie_groups(y: &[f64]) -> Vec<usize> {
    let mut sorted = y.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mut groups = Vec::new();
    let mut run = 1;
    for w in sorted.windows(2) {
        if w[0] == w[1] {
            run += 1;
        } else {
            if run > 1 {
                groups.push(run);
            }
            run = 1;
        }
    }
    if run > 1 {
        groups.push(run);
    }
    groups
}

/// P(S ≥ s) under the null hypothesis for n values without ties.
///
/// S = C(n,2) − 2·inversions, and the number of permutations with k inversions is the
/// Mahonian number M(n, k).
fn exact_upper_tail(n: usize, s: i64) -> f64 {
    if n < 2 {
        return 1.0;
    }
    let pairs = (n * (n - 1) / 2) as i64;
    // S ≥ s ⇔ inversions ≤ (pairs − s) / 2.
    let max_inversions = (pairs - s).div_euclid(2);
    if max_inversions < 0 {
        return 0.0;
    }
    let counts = mahonian(n);
    let total: u64 = counts.iter().sum();
    let upto = usize::try_from(max_inversions)
        .unwrap_or(usize::MAX)
        .min(counts.len() - 1);
    let hit: u64 = counts[..=upto].iter().sum();
    hit as f64 / total as f64
}

/// Number of permutations of n elements by inversion count.
fn mahonian(n: usize) -> Vec<u64> {
    let mut row = vec![1_u64];
    for m in 2..=n {
        let len = row.len() + m - 1;
        let mut next = vec![0_u64; len];
        for (k, slot) in next.iter_mut().enumerate() {
            // M(m, k) = Σ_{j=0}^{min(k, m−1)} M(m−1, k−j)
            let lo = k.saturating_sub(m - 1);
            *slot = row[lo..=k.min(row.len() - 1)].iter().sum();
        }
        row = next;
    }
    row
}

/// Hamed–Rao variance inflation n/n* for autocorrelated data (Hamed & Rao 1998).
///
/// Detrend with the Sen slope over the index (as pymannkendall does), rank the residuals,
/// and sum the lag-k autocorrelations ρₖ of the ranks that are significant at 5 %
/// (|ρₖ| > 1.96/√n): n/n* = 1 + 2/(n(n−1)(n−2)) · Σₖ (n−k)(n−k−1)(n−k−2) ρₖ.
/// Clamped to ≥ 1: negative autocorrelation would make the test more eager, and a leak
/// alarm should not rest on that.
pub fn hamed_rao_factor(y: &[f64]) -> f64 {
    let n = y.len();
    if n < 3 {
        return 1.0;
    }
    let indexed: Vec<(f64, f64)> = y.iter().enumerate().map(|(i, &v)| (i as f64, v)).collect();
    let slope = theil_sen(&indexed).unwrap_or(0.0);
    let detrended: Vec<f64> = indexed.iter().map(|&(i, v)| v - slope * i).collect();
    let ranks = average_ranks(&detrended);
    let mean = ranks.iter().sum::<f64>() / n as f64;
    let denom: f64 = ranks.iter().map(|r| (r - mean).powi(2)).sum();
    if denom <= 0.0 {
        return 1.0;
    }
    let n_f = n as f64;
    let bound = 1.96 / n_f.sqrt();
    let mut sum = 0.0;
    for k in 1..n - 2 {
        let num: f64 = (0..n - k)
            .map(|t| (ranks[t] - mean) * (ranks[t + k] - mean))
            .sum();
        let rho = num / denom;
        if rho.abs() > bound {
            let m = (n - k) as f64;
            sum += m * (m - 1.0) * (m - 2.0) * rho;
        }
    }
    let factor = 1.0 + 2.0 * sum / (n_f * (n_f - 1.0) * (n_f - 2.0));
    if factor.is_finite() {
        factor.max(1.0)
    } else {
        1.0
    }
}

/// Ranks 1..=n with ties given their average rank.
fn average_ranks(values: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[a].total_cmp(&values[b]));
    let mut ranks = vec![0.0; values.len()];
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && values[order[j + 1]] == values[order[i]] {
            j += 1;
        }
        let rank = (i + j) as f64 / 2.0 + 1.0;
        for &k in &order[i..=j] {
            ranks[k] = rank;
        }
        i = j + 1;
    }
    ranks
}

/// Upper tail of the standard normal distribution, 1 − Φ(z).
pub fn normal_sf(z: f64) -> f64 {
    0.5 * erfc(z / std::f64::consts::SQRT_2)
}

/// Complementary error function (Numerical Recipes' `erfcc`, relative error < 1.2e-7).
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let ans = t * poly.exp();
    if x >= 0.0 { ans } else { 2.0 - ans }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisson_binomial_tails_match_hand_counts() {
        // Windows 2..=5 of a record process: 1/2, 1/3, 1/4, 1/5. All four: 1/120.
        let probs: Vec<f64> = (2..=5).map(|k| record_window_probability(k, 1)).collect();
        assert!((poisson_binomial_upper_tail(&probs, 4) - 1.0 / 120.0).abs() < 1e-12);
        // At least three: 1/120 × (1 + 1 + 2 + 3 + 4) = 11/120.
        assert!((poisson_binomial_upper_tail(&probs, 3) - 11.0 / 120.0).abs() < 1e-12);
        assert_eq!(poisson_binomial_upper_tail(&probs, 0), 1.0);
        assert_eq!(poisson_binomial_upper_tail(&probs, 5), 0.0);
        // Two sources: window 2 holds a record of either with 1 − 1/4.
        assert!((record_window_probability(2, 2) - 0.75).abs() < 1e-12);
        assert_eq!(record_window_probability(1, 3), 1.0);
    }

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn theil_sen_recovers_a_line_and_ignores_outliers() {
        let mut pts: Vec<(f64, f64)> = (0..50)
            .map(|i| (f64::from(i), 3.0 * f64::from(i) + 7.0))
            .collect();
        assert!(close(theil_sen(&pts).unwrap(), 3.0, 1e-12));
        // 20 % wild spikes do not move it.
        for i in (0..50).step_by(5) {
            pts[i].1 += 1e9;
        }
        assert!(close(theil_sen(&pts).unwrap(), 3.0, 1e-9));
    }

    #[test]
    fn theil_sen_needs_two_distinct_times() {
        assert_eq!(theil_sen(&[]), None);
        assert_eq!(theil_sen(&[(1.0, 5.0)]), None);
        assert_eq!(theil_sen(&[(1.0, 5.0), (1.0, 9.0)]), None);
        assert_eq!(theil_sen(&[(1.0, 5.0), (3.0, 9.0)]), Some(2.0));
    }

    #[test]
    fn median_of_even_and_odd_slices() {
        assert_eq!(median_in_place(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median_in_place(&mut [4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median_in_place(&mut []), None);
        assert_eq!(median_in_place(&mut [1.0, f64::NAN]), None);
    }

    #[test]
    fn normal_tail_matches_tables() {
        assert!(close(normal_sf(0.0), 0.5, 1e-7));
        assert!(close(normal_sf(1.959_964), 0.025, 1e-6));
        assert!(close(normal_sf(2.326_348), 0.01, 1e-6));
        assert!(close(normal_sf(-1.644_854), 0.95, 1e-6));
        assert!(normal_sf(40.0) < 1e-300);
    }

    #[test]
    fn mahonian_numbers() {
        assert_eq!(mahonian(3), vec![1, 2, 2, 1]);
        assert_eq!(mahonian(4), vec![1, 3, 5, 6, 5, 3, 1]);
        assert_eq!(mahonian(10).iter().sum::<u64>(), 3_628_800);
    }

    #[test]
    fn exact_mann_kendall_for_small_samples() {
        // Five strictly increasing values: only the identity permutation has S = 10.
        let mk = mann_kendall(&[1.0, 2.0, 3.0, 4.0, 5.0]);
        assert!(mk.exact);
        assert_eq!(mk.s, 10);
        assert!(close(mk.p_value, 1.0 / 120.0, 1e-15));
        // Four: 1/24, not significant at 1 %.
        assert!(close(
            mann_kendall(&[1.0, 2.0, 3.0, 4.0]).p_value,
            1.0 / 24.0,
            1e-15
        ));
        // Decreasing: p = 1.
        assert!(close(
            mann_kendall(&[5.0, 4.0, 3.0, 2.0, 1.0]).p_value,
            1.0,
            1e-15
        ));
        // One value or none: nothing to test.
        assert_eq!(mann_kendall(&[1.0]).p_value, 1.0);
        assert_eq!(mann_kendall(&[]).p_value, 1.0);
    }

    #[test]
    fn mann_kendall_with_ties_uses_the_tie_corrected_variance() {
        // Values of pymannkendall.original_test([1,1,2,2,3,3,4,4,5,5,6,6]):
        // S = 60, var_s = 203.333…
        let y = [1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0, 5.0, 5.0, 6.0, 6.0];
        let ties = tie_groups(&y);
        assert_eq!(ties, vec![2; 6]);
        let mk = mann_kendall(&y);
        assert_eq!(mk.s, 60);
        // The Hamed–Rao factor may inflate it, never shrink it.
        assert!(mk.var_s >= 203.333 - 1e-3);
        assert!(mk.p_value < 0.01);
    }

    #[test]
    fn mann_kendall_sees_no_trend_in_alternation() {
        let y: Vec<f64> = (0..200)
            .map(|i| if i % 2 == 0 { 10.0 } else { 12.0 })
            .collect();
        let mk = mann_kendall(&y);
        assert!(mk.p_value > 0.2, "{mk:?}");
    }

    #[test]
    fn hamed_rao_inflates_for_autocorrelated_noise() {
        // A slow random walk without drift (fixed LCG so the test is deterministic): the
        // plain test is fooled, the corrected one much less.
        let mut state: u64 = 12345;
        let mut level = 0.0;
        let y: Vec<f64> = (0..200)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1);
                level += ((state >> 33) as f64 / f64::from(1u32 << 31)) - 0.5;
                level
            })
            .collect();
        let factor = hamed_rao_factor(&y);
        assert!(factor > 2.0, "factor {factor}");
        // White noise: no inflation to speak of.
        let mut state: u64 = 99;
        let white: Vec<f64> = (0..200)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1);
                (state >> 33) as f64
            })
            .collect();
        assert!(hamed_rao_factor(&white) < 1.5);
    }

    #[test]
    fn ranks_average_ties() {
        assert_eq!(
            average_ranks(&[10.0, 20.0, 10.0, 30.0]),
            vec![1.5, 3.0, 1.5, 4.0]
        );
    }
}
