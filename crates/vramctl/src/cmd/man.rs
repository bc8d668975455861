//! `vramctl man --dir DIR`: a man page per command, from the clap definitions.
//!
//! A command of the binary rather than an xtask: the clap definitions live in the
//! binary target (`cli.rs`), so only the binary can render them without moving the CLI
//! into the library, and the pages are then exactly those of the binary a package ships.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use clap::CommandFactory;

use crate::cli::{Cli, ManArgs};
use crate::exit::Exit;

pub fn run(args: &ManArgs) -> anyhow::Result<Exit> {
    let dir = &args.dir;
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the directory '{}'", dir.display()))?;
    // `build` gives each subcommand its display name (`vramctl-status`), the page's title
    // and file name; the help subcommand gets no page (`vramctl help X` is `X --help`).
    let mut cli = Cli::command().disable_help_subcommand(true);
    cli.build();
    let mut written = Vec::new();
    write_pages(&cli, dir, &mut written)?;
    let mut out = std::io::stdout().lock();
    for path in written {
        writeln!(out, "{}", path.display()).context("writing the list of pages")?;
    }
    Ok(Exit::Ok)
}

/// The page of `command` and of each of its visible subcommands, depth first.
fn write_pages(
    command: &clap::Command,
    dir: &Path,
    written: &mut Vec<std::path::PathBuf>,
) -> anyhow::Result<()> {
    // Every page says whose it is and when it was built (the build date: reproducible
    // under SOURCE_DATE_EPOCH), not only the top one, which clap_mangen gives the version.
    let path = clap_mangen::Man::new(command.clone())
        .source(concat!("vramctl ", env!("CARGO_PKG_VERSION")))
        .date(env!("VRAMCTL_BUILD_DATE"))
        .generate_to(dir)
        .with_context(|| {
            format!(
                "cannot write the man page of '{}' into '{}'",
                command.get_display_name().unwrap_or(command.get_name()),
                dir.display()
            )
        })?;
    written.push(path);
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_pages(sub, dir, written)?;
    }
    Ok(())
}
