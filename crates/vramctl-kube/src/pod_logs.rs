//! Pod UID → namespace/name, from the kubelet's log directories.
//!
//! The pod-resources API names pods but carries no UID, and `/proc/PID/cgroup` carries the
//! UID but no name. The kubelet makes one directory per pod, `/var/log/pods/
//! <namespace>_<name>_<uid>/` (the CRI log layout, `kuberuntime.BuildPodLogsDirectory`);
//! namespaces and pod names are DNS labels/subdomains, which have no `_`, so the split is
//! unambiguous. Only directory names are read (no file is opened), at most
//! [`MAX_POD_DIRECTORIES`] of them; a name in any other form is skipped.

use std::collections::BTreeMap;
use std::path::Path;

/// More pods than a node runs (the kubelet's default `maxPods` is 110; large nodes 250-500).
pub const MAX_POD_DIRECTORIES: usize = 4096;

/// The kubelet's pod log directory.
pub const DEFAULT_POD_LOG_DIR: &str = "/var/log/pods";

/// A pod's namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct PodName {
    pub namespace: String,
    pub pod: String,
}

/// Pod UID (with dashes, as the cgroup parser gives it) → namespace and name. A missing or
/// unreadable directory gives an empty map: then pods are named by GPU only.
pub fn pod_names_by_uid(pod_log_dir: &Path) -> std::io::Result<BTreeMap<String, PodName>> {
    let mut names = BTreeMap::new();
    for (seen, entry) in std::fs::read_dir(pod_log_dir)?.enumerate() {
        if seen >= MAX_POD_DIRECTORIES {
            tracing::warn!(
                dir = %pod_log_dir.display(),
                "more than {MAX_POD_DIRECTORIES} pod log directories; the rest are not read"
            );
            break;
        }
        let Ok(entry) = entry else { continue };
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if let Some((uid, pod)) = parse_pod_directory(&name) {
            names.insert(uid, pod);
        }
    }
    Ok(names)
}

/// `<namespace>_<name>_<uid>` → (uid, name); `None` for any other form.
pub fn parse_pod_directory(name: &str) -> Option<(String, PodName)> {
    let mut parts = name.split('_');
    let (namespace, pod, uid) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || namespace.is_empty() || pod.is_empty() {
        return None;
    }
    let dns = |s: &str| {
        s.len() <= 253
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    };
    let uid_ok = uid.len() == 36 && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
    (dns(namespace) && dns(pod) && uid_ok).then(|| {
        (
            uid.to_ascii_lowercase(),
            PodName {
                namespace: namespace.to_string(),
                pod: pod.to_string(),
            },
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_log_directories_name_pod_uids() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let uid = "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b";
        for name in [
            format!("ml_train-7f9c_{uid}"),
            "kube-system_x_not-a-uid".to_string(),
            "a_b_c_d".to_string(),
            format!("UPPER_case_{uid}"),
        ] {
            std::fs::create_dir(dir.path().join(name))?;
        }
        let names = pod_names_by_uid(dir.path())?;
        assert_eq!(names.len(), 1, "{names:?}");
        assert_eq!(
            names[uid],
            PodName {
                namespace: "ml".into(),
                pod: "train-7f9c".into()
            }
        );
        Ok(())
    }
}
