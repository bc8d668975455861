//! `vramctl snapshot view FILE`: a thin shell over `vramctl_web::snapshot_mode` (open and
//! index the file, serve the page's snapshot mode): the address in, the URL out, the exit
//! code.

use std::io::Write;

use anyhow::Context;

use crate::cli::SnapshotViewArgs;
use crate::exit::Exit;

/// Runs `vramctl snapshot view`.
///
/// # Errors
/// The address cannot be listened on, FILE is not a snapshot, the server fails (exit 2).
pub fn run(args: &SnapshotViewArgs) -> anyhow::Result<Exit> {
    // Bound before the (seconds-long) reading, so a taken port fails at once.
    let listener = std::net::TcpListener::bind(args.listen.as_str()).with_context(|| {
        format!(
            "cannot listen on '{}'; choose another address with --listen",
            args.listen
        )
    })?;
    let mut address = listener
        .local_addr()
        .context("cannot read the bound address")?;
    if !address.ip().is_loopback() {
        crate::print_warning(&format!(
            "listening on {address}: anyone who can reach it can read this snapshot (its \
             stacks name files and functions); the default is loopback only"
        ));
    }
    let files = vramctl_web::snapshot_mode::open_files(std::slice::from_ref(&args.file))?;
    if address.ip().is_unspecified() {
        // A browser on this machine reaches an any-address listener through loopback.
        address.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let url = format!("http://{address}/#snapshot");
    let mut out = std::io::stdout().lock();
    writeln!(out, "vramctl: the snapshot is at {url} (Ctrl-C to stop)")
        .and_then(|()| out.flush())
        .context("cannot write to stdout")?;
    drop(out);
    if args.open {
        // Only when asked: a fixed program given our own URL.
        if let Err(err) = std::process::Command::new("xdg-open")
            .arg(&url)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
        {
            crate::print_warning(&format!(
                "cannot start xdg-open ({err}): open {url} yourself"
            ));
        }
    }
    vramctl_web::snapshot_mode::serve_files(listener, files).context("the HTTP server failed")?;
    Ok(Exit::Ok)
}
