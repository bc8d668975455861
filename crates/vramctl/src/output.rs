//! Presentation shared by the commands: units, tables, styles, charts, and `emit`, the
//! one way a report is printed as JSON or text.

pub mod chart;
pub mod emit;
pub mod owners;
pub mod style;
pub mod table;
pub mod terminal;
