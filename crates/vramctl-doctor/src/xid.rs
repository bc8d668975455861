//! Xid events in the kernel log: a pure parser of `NVRM: Xid` lines and the catalog of what
//! the common codes mean (`docs/doctor.md`, "Kernel log").
//!
//! The driver writes one line per event, `NVRM: Xid (PCI:DDDD:BB:DD): CODE, <details>`, in
//! every log form we read: `/dev/kmsg` records (`PRIO,SEQ,USEC,FLAGS;message`), `dmesg`
//! (`[  SEC.USEC] message`) and `journalctl -k` (`Mon DD HH:MM:SS host kernel: message`).
//! The details differ by code and driver (`pid=…, name=…` since R470); the parser keeps them
//! as text.

use serde::Serialize;

/// One Xid event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct XidEvent {
    /// The Xid code.
    pub code: u32,
    /// The GPU's PCI address as the driver writes it (`0000:3b:00`: domain, bus, device).
    pub pci: String,
    /// Microseconds since boot, where the log form carries it (`/dev/kmsg`, `dmesg`).
    pub since_boot_us: Option<u64>,
    /// The rest of the line after the code.
    pub details: String,
}

/// What one Xid code usually means and what to do about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XidMeaning {
    /// Its usual meaning, short.
    pub meaning: &'static str,
    /// How serious it is for the machine.
    pub severity: XidSeverity,
    /// The one-line action.
    pub action: &'static str,
}

/// How an Xid is judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum XidSeverity {
    /// A program's fault (a bad access, a killed or stuck context): the GPU is fine.
    Application,
    /// The GPU or driver needs attention (a reset, a restart of the work).
    Reset,
    /// The board or its link may be faulty.
    Hardware,
}

/// The codes the issue names and a few neighbours, from NVIDIA's Xid catalog
/// (<https://docs.nvidia.com/deploy/xid-errors/>) and the page retirement and A100 memory
/// error documents (`docs/doctor.md` cites each).
pub fn meaning(code: u32) -> Option<XidMeaning> {
    use XidSeverity::{Application, Hardware, Reset};
    let (meaning, severity, action) = match code {
        13 => (
            "graphics engine exception (often an out-of-bounds access in a kernel)",
            Application,
            "debug the program named in the line (compute-sanitizer); the GPU is fine",
        ),
        31 => (
            "GPU memory page fault (an illegal address in a kernel)",
            Application,
            "debug the program named in the line (compute-sanitizer); the GPU is fine",
        ),
        32 => (
            "invalid or corrupted push buffer stream",
            Reset,
            "restart the program; if it repeats, check the PCIe link and reset the GPU",
        ),
        43 => (
            "GPU stopped processing (a context was stopped, usually after a fault)",
            Application,
            "restart the program; the GPU is fine",
        ),
        45 => (
            "preemptive cleanup (contexts ended after an earlier error or a kill)",
            Application,
            "look at the Xid before it; nothing to do if it was a kill",
        ),
        48 => (
            "double-bit ECC error (uncorrectable memory error)",
            Hardware,
            "reset the GPU; if it repeats, contact the vendor (RMA)",
        ),
        61 | 62 => (
            "internal micro-controller error",
            Reset,
            "reset the GPU (nvidia-smi -r) or reboot",
        ),
        63 => (
            "ECC page retirement or row remap recorded",
            Reset,
            "reset the GPU when idle so the retirement or remap takes effect",
        ),
        64 => (
            "ECC page retirement or row remap failed",
            Hardware,
            "reset the GPU; if it repeats, contact the vendor (RMA)",
        ),
        74 => (
            "NVLink error",
            Hardware,
            "reset the GPU; if it repeats, check the NVLink bridge or board",
        ),
        79 => (
            "GPU has fallen off the bus",
            Hardware,
            "reboot; check power, cooling and seating; if it repeats, contact the vendor",
        ),
        92 => (
            "high single-bit ECC error rate",
            Hardware,
            "watch the ECC counters; contact the vendor if they keep rising",
        ),
        94 => (
            "contained ECC error (only the programs using that memory were hit)",
            Reset,
            "restart the affected programs; reset the GPU when idle to remap the row",
        ),
        95 => (
            "uncontained ECC error (every program on the GPU was hit)",
            Reset,
            "reset the GPU (nvidia-smi -r) before running more work",
        ),
        109 => (
            "context switch timeout",
            Application,
            "restart the program; if it repeats, update the driver",
        ),
        119 | 120 => (
            "GSP firmware error or RPC timeout",
            Reset,
            "reset the GPU or reboot; update the driver if it repeats",
        ),
        154 => (
            "GPU recovery action changed (the line names it: reset, reboot or drain)",
            Reset,
            "do what the line says (GPU reset, node reboot, or drain and reset)",
        ),
        _ => return None,
    };
    Some(XidMeaning {
        meaning,
        severity,
        action,
    })
}

const MARKER: &str = "NVRM: Xid (";

/// The Xid events in `text`, in order: any mix of `/dev/kmsg`, `dmesg` and `journalctl -k`
/// lines; lines that are not Xid events are skipped.
pub fn parse_log(text: &str) -> Vec<XidEvent> {
    text.lines().filter_map(parse_line).collect()
}

/// One line, if it is an Xid event.
pub fn parse_line(line: &str) -> Option<XidEvent> {
    let at = line.find(MARKER)?;
    let prefix = &line[..at];
    let rest = &line[at + MARKER.len()..];
    // `PCI:0000:3b:00): 79, …`
    let close = rest.find("):")?;
    let pci = rest[..close].trim();
    let pci = pci.strip_prefix("PCI:").unwrap_or(pci).to_owned();
    let after = rest[close + 2..].trim_start();
    let digits_end = after
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(after.len());
    let code: u32 = after[..digits_end].parse().ok()?;
    let details = after[digits_end..]
        .trim_start_matches(',')
        .trim()
        .to_owned();
    Some(XidEvent {
        code,
        pci,
        since_boot_us: since_boot_us(prefix),
        details,
    })
}

/// The time since boot in the line's prefix: `/dev/kmsg`'s third field (µs), or `dmesg`'s
/// `[  SEC.USEC]`.
fn since_boot_us(prefix: &str) -> Option<u64> {
    if let Some((head, _)) = prefix.split_once(';') {
        let mut fields = head.split(',');
        let (_prio, _seq, usec) = (fields.next()?, fields.next()?, fields.next()?);
        return usec.trim().parse().ok();
    }
    let open = prefix.find('[')?;
    let close = prefix[open..].find(']')? + open;
    let (secs, micros) = prefix[open + 1..close].trim().split_once('.')?;
    let secs: u64 = secs.parse().ok()?;
    let micros: u64 = format!("{micros:0<6}").get(..6)?.parse().ok()?;
    secs.checked_mul(1_000_000)?.checked_add(micros)
}

/// The recovery action a code-154 line names (`GPU Reset Required`, `Node Reboot
/// Required`, `Drain and Reset`), as the driver words it in the text after `to 0x…`.
pub fn recovery_action(details: &str) -> Option<&str> {
    let (_, to) = details.rsplit_once(" to ")?;
    let open = to.find('(')?;
    let close = to.rfind(')')?;
    (open < close).then(|| to[open + 1..close].trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Recorded kernel-log lines (`testdata/doctor/kernel-log/`, each file's header says
    /// where its lines come from).
    fn fixture(name: &str) -> String {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/doctor/kernel-log")
            .join(name);
        std::fs::read_to_string(&path).expect("fixture")
    }

    #[test]
    fn kmsg_records_give_code_address_and_time_since_boot() {
        let events = parse_log(&fixture("kmsg.txt"));
        let codes: Vec<u32> = events.iter().map(|e| e.code).collect();
        assert_eq!(codes, [31, 43, 79]);
        assert_eq!(events[0].pci, "0000:00:06");
        assert_eq!(events[0].since_boot_us, Some(3_201_223_417));
        assert!(events[0].details.starts_with("pid=4242, name=python3"));
        assert_eq!(events[2].details, "GPU has fallen off the bus.");
    }

    #[test]
    fn dmesg_lines_give_seconds_since_boot() {
        let events = parse_log(&fixture("dmesg.txt"));
        let codes: Vec<u32> = events.iter().map(|e| e.code).collect();
        assert_eq!(codes, [119, 94, 63, 154]);
        assert_eq!(events[0].since_boot_us, Some(84_738_325));
        assert_eq!(
            recovery_action(&events[3].details),
            Some("GPU Reset Required")
        );
    }

    #[test]
    fn journal_lines_have_no_time_since_boot_but_are_events() {
        let events = parse_log(&fixture("journal.txt"));
        let codes: Vec<u32> = events.iter().map(|e| e.code).collect();
        assert_eq!(codes, [79, 48]);
        assert_eq!(events[0].pci, "0000:44:00");
        assert_eq!(events[0].since_boot_us, None);
    }

    #[test]
    fn lines_that_merely_mention_xid_are_not_events() {
        assert_eq!(
            parse_line("NVRM: loading NVIDIA UNIX Open Kernel Module 570"),
            None
        );
        assert_eq!(parse_line("NVRM: Xid (PCI:0000:44:00): , garbled"), None);
        assert_eq!(parse_line("user: grep 'Xid' in my notes"), None);
    }

    #[test]
    fn every_code_the_issue_names_has_a_meaning() {
        for code in [31, 43, 45, 48, 63, 64, 74, 79, 92, 94, 95, 119, 154] {
            assert!(meaning(code).is_some(), "Xid {code}");
        }
        assert_eq!(meaning(79).map(|m| m.severity), Some(XidSeverity::Hardware));
        assert_eq!(
            meaning(31).map(|m| m.severity),
            Some(XidSeverity::Application)
        );
        assert_eq!(meaning(1), None);
    }
}
