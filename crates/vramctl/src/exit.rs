//! Exit codes, and which errors map to which.

use std::process::ExitCode;

use vramctl_gpu::InitError;

/// The documented exit codes (also in `vramctl --help`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0: success, including a closed pipe on stdout.
    Ok,
    /// 1: the condition the user asked about holds.
    ConditionHolds,
    /// 2: usage, input or runtime error.
    Usage,
    /// 3: no usable GPU driver.
    NoDriver,
    /// `run`: the supervised command's own code (128 + S for signal S; 126/127 when it
    /// could not be started), passed on.
    Passed(u8),
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> Self {
        ExitCode::from(match exit {
            Exit::Ok => 0,
            Exit::ConditionHolds => 1,
            Exit::Usage => 2,
            Exit::NoDriver => 3,
            Exit::Passed(code) => code,
        })
    }
}

/// Which exit code an error deserves.
pub fn classify(err: &anyhow::Error) -> Exit {
    for cause in err.chain() {
        // `vramctl status | head -1`: the reader left; that is not our failure.
        // Writers wrap the I/O error: serde_json and the csv crate (whose error names no
        // source, so the chain never reaches the io::Error inside it).
        let kind = cause
            .downcast_ref::<std::io::Error>()
            .map(std::io::Error::kind)
            .or_else(|| {
                cause
                    .downcast_ref::<serde_json::Error>()
                    .and_then(serde_json::Error::io_error_kind)
            })
            .or_else(|| match cause.downcast_ref::<csv::Error>()?.kind() {
                csv::ErrorKind::Io(io) => Some(io.kind()),
                _ => None,
            });
        if kind == Some(std::io::ErrorKind::BrokenPipe) {
            return Exit::Ok;
        }
        if cause.downcast_ref::<InitError>().is_some() {
            return Exit::NoDriver;
        }
    }
    Exit::Usage
}

/// What the user can do about an error, when we know.
pub fn hint(err: &anyhow::Error) -> Option<&'static str> {
    err.chain().find_map(|cause| {
        cause
            .downcast_ref::<InitError>()
            .map(InitError::hint)
            .or_else(|| {
                cause
                    .downcast_ref::<vramctl_store::StoreError>()
                    .and_then(vramctl_store::StoreError::hint)
            })
            .or_else(|| {
                cause
                    .downcast_ref::<vramctl_store::format::ImportError>()
                    .and_then(vramctl_store::format::ImportError::hint)
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broken_pipe_is_success() {
        let err = anyhow::Error::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
            .context("writing the table");
        assert_eq!(classify(&err), Exit::Ok);
    }

    #[test]
    fn broken_pipe_inside_a_csv_error_is_success() {
        let csv_err = csv::Error::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        let err = anyhow::Error::from(csv_err).context("writing the export");
        assert_eq!(classify(&err), Exit::Ok);
    }

    #[test]
    fn missing_driver_is_exit_3() {
        let err = anyhow::Error::from(InitError::LibraryNotLoaded {
            path: "libnvidia-ml.so.1".into(),
            reason: "not found".into(),
        });
        assert_eq!(classify(&err), Exit::NoDriver);
        assert!(hint(&err).is_some());
    }

    #[test]
    fn other_errors_are_exit_2() {
        assert_eq!(classify(&anyhow::anyhow!("bad flag")), Exit::Usage);
    }
}
