//! The table of GPU memory per owner (`ps --by job`, `status --by job`).

use vramctl_observe::owner_totals::{Owner, OwnerTotal};
use vramctl_observe::units;

use crate::output::table::{Align, Table};

/// `JOB  USER  PARTITION  PROCS  GPUS  MEMORY`, one line per owner (cells escaped by the
/// table: a job's user and partition come from a process's environment).
pub fn owner_table(owners: &[OwnerTotal]) -> Vec<String> {
    let mut table = Table::new(&[
        ("JOB", Align::Left),
        ("USER", Align::Left),
        ("PARTITION", Align::Left),
        ("PROCS", Align::Right),
        ("GPUS", Align::Left),
        ("MEMORY", Align::Right),
    ]);
    for total in owners {
        let (job, user, partition) = match &total.owner {
            Owner::Job {
                job_id,
                user,
                partition,
            } => (
                job_id.to_string(),
                user.clone().unwrap_or_else(|| "-".into()),
                partition.clone().unwrap_or_else(|| "-".into()),
            ),
            Owner::None => ("(none)".into(), "-".into(), "-".into()),
        };
        let gpus: Vec<String> = total.gpus.iter().map(|g| g.index.to_string()).collect();
        let memory = units::bytes(total.used_bytes);
        table.push(vec![
            job,
            user,
            partition,
            total.processes.to_string(),
            gpus.join(","),
            if total.incomplete {
                format!(">= {memory}")
            } else {
                memory
            },
        ]);
    }
    table.render("")
}
