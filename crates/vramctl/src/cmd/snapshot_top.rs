//! What `snapshot FILE --top` and `snapshot timeline` both print: the JSON schema version and
//! the top-groups document with its text lines. Kept apart from both commands so that
//! neither names the other's file (the architecture test forbids file-level cycles).

use serde::Serialize;
use vramctl_observe::units;

/// Version of the JSON of `snapshot` and `snapshot timeline` (docs/json.md).
pub(super) const SCHEMA: u32 = 1;

#[derive(Serialize)]
pub(super) struct TopDocument {
    pub(super) by: &'static str,
    /// Σ live (active) bytes over all groups, the share's denominator.
    pub(super) live_bytes: u64,
    pub(super) rows: Vec<vramctl_snapshot::top::TopRow>,
}

/// `top N by KEY (of X live)[where]:` and a line per group with its share.
pub(super) fn top_lines(t: &TopDocument, when: &str) -> Vec<String> {
    let mut out = vec![format!(
        "top {} by {}{when} (of {} live):",
        t.rows.len(),
        t.by,
        units::bytes(t.live_bytes)
    )];
    for r in &t.rows {
        #[allow(clippy::cast_precision_loss)]
        let share = if t.live_bytes == 0 {
            0.0
        } else {
            100.0 * r.bytes as f64 / t.live_bytes as f64
        };
        out.push(format!(
            "  {:>10}  {:>5.1}%  {:>5} block{}  {}",
            units::bytes(r.bytes),
            share,
            r.blocks,
            if r.blocks == 1 { " " } else { "s" },
            r.key
        ));
    }
    out
}
