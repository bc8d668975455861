//! Presentation shared by the commands: units, tables, styles, charts.

pub mod chart;
pub mod style;
pub mod table;
pub mod terminal;
