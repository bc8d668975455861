//! Prometheus HTTP API answers (`/api/v1/query`, `/api/v1/query_range`), parsed and bounded.
//!
//! The server is trusted no more than the targets it scrapes: every label value in an answer
//! was chosen by whoever controls a target or its relabelling. So an answer has at most
//! [`Limits::max_series`] series of at most [`Limits::max_labels`] labels each, a label
//! name or value longer than [`Limits::max_label_bytes`] is cut (on a character boundary),
//! and a range answer holds at most [`Limits::max_points`] points in all. Values stay raw
//! text in the model: escaping happens where a person is shown them (the page).

use std::collections::BTreeMap;

use anyhow::{Context as _, bail};
use serde::Deserialize;

/// Bounds on one answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Series in one answer.
    pub max_series: usize,
    /// Labels on one series.
    pub max_labels: usize,
    /// Bytes of one label name or value (longer ones are cut).
    pub max_label_bytes: usize,
    /// Points in one range answer, all series together.
    pub max_points: usize,
}

impl Default for Limits {
    /// 5000 series: 500 hosts × 8 GPUs is 4000 device series; 64 labels (vramctl's series
    /// carry at most 10, plus the target's); 1 KiB per label (vramctl cuts commands at 64
    /// characters); 200 000 points (a few MB of JSON).
    fn default() -> Self {
        Self {
            max_series: 5000,
            max_labels: 64,
            max_label_bytes: 1024,
            max_points: 200_000,
        }
    }
}

/// A series' labels, by name.
pub type Labels = BTreeMap<String, String>;

/// One series of an instant query: its labels and value at the query's time.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Labels (`__name__` included when the query kept it).
    pub labels: Labels,
    /// Unix time of the value, seconds.
    pub time_unix_s: f64,
    /// The value (`NaN` and infinities as Prometheus sends them).
    pub value: f64,
}

/// One series of a range query.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Labels.
    pub labels: Labels,
    /// `(unix seconds, value)`, oldest first.
    pub points: Vec<(f64, f64)>,
}

#[derive(Deserialize)]
struct Envelope {
    status: String,
    #[serde(default)]
    data: Option<Data>,
    #[serde(default, rename = "errorType")]
    error_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct Data {
    #[serde(rename = "resultType")]
    result_type: String,
    result: serde_json::Value,
}

#[derive(Deserialize)]
struct RawSample {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    value: (f64, String),
}

#[derive(Deserialize)]
struct RawSeries {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    #[serde(default)]
    values: Vec<(f64, String)>,
}

fn data(body: &[u8], want: &str) -> anyhow::Result<serde_json::Value> {
    let envelope: Envelope =
        serde_json::from_slice(body).context("Prometheus' answer is not its API's JSON")?;
    if envelope.status != "success" {
        bail!(
            "Prometheus answered {}: {}",
            cut(envelope.error_type.as_deref().unwrap_or("an error"), 64),
            cut(envelope.error.as_deref().unwrap_or("no reason given"), 512),
        );
    }
    let Some(data) = envelope.data else {
        bail!("Prometheus' answer has no data");
    };
    if data.result_type != want {
        bail!(
            "Prometheus answered a {} where a {want} was asked for",
            cut(&data.result_type, 32)
        );
    }
    Ok(data.result)
}

/// The series of an instant query's answer (`resultType` `vector`).
pub fn parse_vector(body: &[u8], limits: &Limits) -> anyhow::Result<Vec<Sample>> {
    let result = data(body, "vector")?;
    let raw: Vec<RawSample> =
        serde_json::from_value(result).context("Prometheus' vector is not a list of samples")?;
    if raw.len() > limits.max_series {
        bail!(
            "Prometheus answered {} series, more than the {} this view reads; narrow the query",
            raw.len(),
            limits.max_series
        );
    }
    raw.into_iter()
        .map(|s| {
            Ok(Sample {
                labels: bound_labels(s.metric, limits)?,
                time_unix_s: s.value.0,
                value: parse_value(&s.value.1)?,
            })
        })
        .collect()
}

/// The series of a range query's answer (`resultType` `matrix`).
pub fn parse_matrix(body: &[u8], limits: &Limits) -> anyhow::Result<Vec<Series>> {
    let result = data(body, "matrix")?;
    let raw: Vec<RawSeries> =
        serde_json::from_value(result).context("Prometheus' matrix is not a list of series")?;
    if raw.len() > limits.max_series {
        bail!(
            "Prometheus answered {} series, more than the {} this view reads",
            raw.len(),
            limits.max_series
        );
    }
    let points: usize = raw.iter().map(|s| s.values.len()).sum();
    if points > limits.max_points {
        bail!(
            "Prometheus answered {points} points, more than the {} this view reads",
            limits.max_points
        );
    }
    raw.into_iter()
        .map(|s| {
            let points = s
                .values
                .into_iter()
                .map(|(t, v)| Ok((t, parse_value(&v)?)))
                .collect::<anyhow::Result<_>>()?;
            Ok(Series {
                labels: bound_labels(s.metric, limits)?,
                points,
            })
        })
        .collect()
}

fn bound_labels(labels: BTreeMap<String, String>, limits: &Limits) -> anyhow::Result<Labels> {
    if labels.len() > limits.max_labels {
        bail!(
            "a series in Prometheus' answer has {} labels, more than {}",
            labels.len(),
            limits.max_labels
        );
    }
    Ok(labels
        .into_iter()
        .map(|(k, v)| {
            (
                cut(&k, limits.max_label_bytes).into_owned(),
                cut(&v, limits.max_label_bytes).into_owned(),
            )
        })
        .collect())
}

/// Prometheus writes values as strings: decimal, `NaN`, `+Inf`, `-Inf`.
fn parse_value(text: &str) -> anyhow::Result<f64> {
    match text {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => text.parse().with_context(|| {
            format!(
                "Prometheus answered a value that is not a number: {:?}",
                cut(text, 32)
            )
        }),
    }
}

/// `text` cut to at most `max_bytes` bytes on a character boundary, with `…` when cut.
pub fn cut(text: &str, max_bytes: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max_bytes {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!("{}…", &text[..end]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Vec<u8> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/fleet")
            .join(name);
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    #[test]
    fn a_real_vector_answer_parses() {
        let samples = parse_vector(&fixture("gpu_used.json"), &Limits::default()).expect("parse");
        assert_eq!(samples.len(), 4, "three hosts, four GPUs");
        assert!(samples.iter().all(|s| s.labels["job"] == "vramctl"));
        assert!(
            samples
                .iter()
                .all(|s| s.value > 0.0 && s.time_unix_s > 1.7e9)
        );
    }

    #[test]
    fn a_real_matrix_answer_parses() {
        let series = parse_matrix(&fixture("host_range.json"), &Limits::default()).expect("parse");
        assert_eq!(series.len(), 2, "host A's two GPUs");
        assert!(series.iter().all(|s| s.points.len() >= 2));
        assert!(series[0].points.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn a_real_error_answer_is_one_line_with_the_reason() {
        let err = parse_vector(&fixture("error_bad_query.json"), &Limits::default())
            .expect_err("an error answer");
        let text = format!("{err:#}");
        assert!(text.starts_with("Prometheus answered bad_data: "), "{text}");
        assert!(text.contains("parse error"), "{text}");
        assert!(!text.contains('\n'));
    }

    #[test]
    fn a_matrix_where_a_vector_was_asked_is_refused() {
        let err = parse_vector(&fixture("host_range.json"), &Limits::default()).expect_err("kind");
        assert!(
            format!("{err:#}").contains("a matrix where a vector"),
            "{err:#}"
        );
    }

    #[test]
    fn too_many_series_points_or_labels_are_refused_and_long_labels_cut() {
        let small = Limits {
            max_series: 3,
            max_labels: 64,
            max_label_bytes: 1024,
            max_points: 3,
        };
        assert!(parse_vector(&fixture("gpu_used.json"), &small).is_err());
        assert!(parse_matrix(&fixture("host_range.json"), &small).is_err());
        let few_labels = Limits {
            max_labels: 2,
            ..Limits::default()
        };
        assert!(parse_vector(&fixture("gpu_used.json"), &few_labels).is_err());
        let long = format!(
            r#"{{"status":"success","data":{{"resultType":"vector","result":[{{"metric":{{"instance":"{}"}},"value":[1.5,"NaN"]}}]}}}}"#,
            "é".repeat(600)
        );
        let samples = parse_vector(long.as_bytes(), &Limits::default()).expect("parse");
        let instance = &samples[0].labels["instance"];
        assert!(
            instance.len() <= 1024 + '…'.len_utf8(),
            "{}",
            instance.len()
        );
        assert!(instance.ends_with('…'));
        assert!(samples[0].value.is_nan());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for body in [
            &b""[..],
            b"<html>proxy error</html>",
            br#"{"status":"success"}"#,
            br#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"x"]}]}}"#,
            br#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"a":1},"value":[1,"1"]}]}}"#,
        ] {
            assert!(parse_vector(body, &Limits::default()).is_err());
        }
    }
}
