//! What an import tells the user besides its summary (`import`, and `leaks`/`plot` reading
//! log files): its notes and the bad rows it skipped, on stderr.

use std::io::Write;

use vramctl_core::untrusted::Untrusted;
use vramctl_store::format::ImportReport;

/// Skipped rows listed one by one; more are counted.
const LIST_AT_MOST: usize = 20;

/// The skipped rows (the first few one by one) and the notes of a report, on stderr,
/// escaped: they quote the file's cells.
pub fn print_report_notes(err: &mut impl Write, report: &ImportReport) {
    for note in &report.notes {
        let _ = writeln!(err, "vramctl: note: {}", Untrusted(note));
    }
    for bad in report.skipped.iter().take(LIST_AT_MOST) {
        let _ = writeln!(err, "vramctl: skipped {}", Untrusted(&bad.to_string()));
    }
    let listed = report.skipped.len().min(LIST_AT_MOST) as u64;
    if report.skipped_total > listed {
        let _ = writeln!(
            err,
            "vramctl: skipped {} more bad rows",
            report.skipped_total - listed
        );
    }
    if report.dropped_values > 0 {
        let _ = writeln!(
            err,
            "vramctl: note: {} values no GPU can mean were dropped and stored as gaps with the \
             reason{}",
            report.dropped_values,
            report
                .dropped_example
                .as_ref()
                .map_or_else(String::new, |e| format!(" (the first: {e})"))
        );
    }
}
