//! The memory history: the recorder that `record` and `serve --record` run, reading a
//! window of it back (`sample_source`: the store, or CSV and nvidia-smi logs through the
//! importers), the leak scan over it, and what `history` and `plot` draw from it;
//! `time_window` settles the `--since`/`--until` of every command that reads it.

pub mod csv_record;
pub mod history_chart;
pub mod import_notes;
pub mod leak_scan;
pub mod recorder;
pub mod sample_source;
pub mod time_window;
