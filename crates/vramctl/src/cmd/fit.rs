//! `vramctl fit` (placeholder until the search lands).
use crate::cli::{FitArgs, GlobalArgs};
use crate::exit::Exit;

/// Runs `fit`.
pub fn run(_global: &GlobalArgs, _args: &FitArgs) -> anyhow::Result<Exit> {
    anyhow::bail!("fit is not built yet")
}
