//! Presentation shared by the commands: units, tables, styles, charts.

// Used by cmd/plot.rs, merged separately; remove this allow when it lands.
#[allow(dead_code)]
pub mod chart;
pub mod style;
pub mod table;
pub mod terminal;
