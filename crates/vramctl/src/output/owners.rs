//! The per-owner table `ps --by` and `status --by` print: one row per GPU and owner, the
//! owner last so that it is the column cut to fit the terminal (the numbers take 28
//! columns, so an 80-column terminal leaves the owner 52; a pipe cuts nothing).

use vramctl_observe::owners::{OwnerKey, OwnerTotal};
use vramctl_observe::units;

use crate::output::table::{Align, Table};
use crate::output::terminal::fit_line;

/// The table's lines, each prefixed with `indent`.
pub fn owner_table(
    key: OwnerKey,
    totals: &[OwnerTotal],
    indent: &str,
    width: Option<usize>,
) -> Vec<String> {
    let header = key.as_str().to_ascii_uppercase();
    let mut table = Table::new(&[
        ("GPU", Align::Right),
        ("PROCS", Align::Right),
        ("MEMORY", Align::Right),
        (header.as_str(), Align::Left),
    ]);
    for total in totals {
        table.push(vec![
            total.gpu.to_string(),
            total.processes.to_string(),
            total
                .used_bytes
                .map_or_else(|| "-".to_owned(), units::bytes),
            total.display_label(key).to_owned(),
        ]);
    }
    if let Some(width) = width {
        let room = width.saturating_sub(indent.chars().count() + table.width_before_last());
        table.fit_last(|_, cell| fit_line(cell, Some(room.max(12))));
    }
    table.render(indent)
}
