//! Where the history database is, from the global flags and the environment: one rule
//! for every command and for the audit sink.

use anyhow::Context;

use crate::cli::GlobalArgs;

/// The history database: `--db` / `VRAMCTL_DB`, else `$XDG_STATE_HOME/vramctl/history.db`,
/// else `~/.local/state/vramctl/history.db`.
pub fn db_path(global: &GlobalArgs) -> anyhow::Result<std::path::PathBuf> {
    if let Some(path) = &global.db {
        return Ok(path.clone());
    }
    let state = std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|home| std::path::PathBuf::from(home).join(".local/state"))
        })
        .context("cannot find where to keep the history; set --db or VRAMCTL_DB")?;
    Ok(state.join("vramctl/history.db"))
}
