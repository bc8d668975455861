//! `vramctl completions SHELL`: the shell's completion script, from the clap definitions.

use std::io::Write;

use anyhow::Context;
use clap::CommandFactory;

use crate::cli::{Cli, CompletionsArgs};
use crate::exit::Exit;

pub fn run(args: &CompletionsArgs) -> anyhow::Result<Exit> {
    // Into memory first: clap_complete panics on a failed write, and a closed pipe
    // (`vramctl completions bash | head`) must exit 0 instead.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut Cli::command(), "vramctl", &mut script);
    std::io::stdout()
        .lock()
        .write_all(&script)
        .context("writing the completion script")?;
    Ok(Exit::Ok)
}
