//! Presentation shared by the commands: units, tables, styles.

pub mod style;
pub mod table;
pub mod units;
