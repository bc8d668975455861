//! Which container a process runs in, under which runtime, and what the container is called.
//!
//! Two steps, both without executing anything:
//!
//! 1. [`parse_cgroup`] reads the text of `/proc/PID/cgroup`: the 64-hex-digit container id,
//!    the runtime its cgroup name gives away (`docker-<id>.scope`, `/docker/<id>`,
//!    `libpod-<id>.scope`, `cri-containerd-<id>.scope`, `crio-<id>.scope`,
//!    `nerdctl-<id>.scope`), the Kubernetes pod UID and QoS class (`kubepods…`), and whether
//!    the container sits in a user's delegated cgroup subtree (`user@UID.service`: a rootless
//!    runtime).
//! 2. [`ContainerNames`] finds the container's name in the runtime's own state files:
//!    Docker's `containers/<id>/config.v2.json` (`"Name"`), Podman's (containers/storage)
//!    `<driver>-containers/containers.json` (`"names"`), for rootful runtimes under the state
//!    root and for rootless ones under the owning user's home. containerd and CRI-O keep
//!    their names behind their APIs (the kubelet's pod-resources API names Kubernetes pods);
//!    for them the name is `None`.
//!
//! Everything read here is another user's input: a process's cgroup path inside a delegated
//! subtree is chosen by that user (it can name a cgroup `docker-<id of root's
//! container>.scope`), so a container under `user@UID.service` is only ever looked up in
//! that user's own state, never in the system's; state files are read with a size cap, as
//! regular files only (a FIFO would block), and below a user's home without following
//! symlinks; names stay untrusted text (escape them when printing).

use std::collections::HashMap;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags};
use serde::{Deserialize, Serialize};

/// The environment variable that moves the root under which runtimes' state is read (`/` by
/// default): for tests, and for reading a host's `/var/lib` mounted elsewhere.
pub const ROOT_ENV: &str = "VRAMCTL_CONTAINER_ROOT";

/// At most this many bytes of Docker's `config.v2.json` (one container; its environment and
/// labels make it a few KiB, rarely more).
const DOCKER_CONFIG_MAX_BYTES: u64 = 4 << 20;
/// At most this many bytes of Podman's `containers.json` (every container of one store, about
/// 1 KiB each).
const PODMAN_STATE_MAX_BYTES: u64 = 16 << 20;
/// At most this many names kept; past it the cache starts again (a user can create
/// containers without end; a tick needs only its GPU processes' few).
const CACHE_MAX_ENTRIES: usize = 4096;
/// A container whose name could not be found is looked up again after this long: its state
/// may not have been readable yet, or a daemon may have started after vramctl.
const RETRY_UNNAMED_MS: u64 = 60_000;
/// containers/storage's graph drivers, whose container stores are `<driver>-containers`.
const STORAGE_DRIVERS: [&str; 4] = ["overlay", "vfs", "btrfs", "zfs"];

/// The container runtime a cgroup name gives away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ContainerRuntime {
    /// Docker (`docker-<id>.scope`, `/docker/<id>`).
    Docker,
    /// Podman (`libpod-<id>.scope`, `/libpod_parent/libpod-<id>`).
    Podman,
    /// containerd: Kubernetes' CRI plugin (`cri-containerd-<id>.scope`) or nerdctl.
    Containerd,
    /// CRI-O (`crio-<id>.scope`).
    CriO,
}

impl ContainerRuntime {
    /// The name printed and written in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Docker => "docker",
            Self::Podman => "podman",
            Self::Containerd => "containerd",
            Self::CriO => "cri-o",
        }
    }
}

/// A Kubernetes pod's QoS class, from the kubelet's cgroup layout (`kubepods-burstable…`,
/// `kubepods-besteffort…`, a pod directly under `kubepods` is Guaranteed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PodQos {
    /// Requests equal limits for every resource.
    Guaranteed,
    /// Some requests below limits.
    Burstable,
    /// No requests or limits.
    BestEffort,
}

impl PodQos {
    /// The name printed and written in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Guaranteed => "guaranteed",
            Self::Burstable => "burstable",
            Self::BestEffort => "besteffort",
        }
    }
}

/// Which container and Kubernetes pod a process runs in, as its cgroup path says.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerInfo {
    /// The 64-hex-digit container id (Docker, containerd, CRI-O, Podman).
    pub container_id: Option<String>,
    /// The Kubernetes pod UID, with dashes.
    pub pod_uid: Option<String>,
    /// The runtime the container's cgroup name gives away; `None` for a bare id whose
    /// parent names no runtime (the kubelet's cgroupfs driver under any CRI runtime).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<ContainerRuntime>,
    /// The pod's QoS class, when a pod UID was found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_qos: Option<PodQos>,
    /// The user whose delegated cgroup subtree (`user@UID.service`) holds the container: a
    /// rootless runtime, whose id and name are that user's word.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootless_uid: Option<u32>,
    /// The container's name in its runtime's state ([`ContainerNames`]; not from the
    /// cgroup): untrusted text, the container's creator chose it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The cgroup v2 path (the `0::` line), e.g. `/user.slice/user-1000.slice/session-3.scope`:
    /// `None` without cgroup v2. Any process may name its own sub-cgroups: untrusted text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
}

impl ContainerInfo {
    /// The container's facts, `None` for a process in no container.
    pub fn facts(&self) -> Option<ContainerFacts> {
        Some(ContainerFacts {
            id: self.container_id.clone()?,
            runtime: self.runtime,
            name: self.name.clone(),
            rootless_uid: self.rootless_uid,
        })
    }
}

/// Finds a container id, runtime, pod UID and QoS, and the cgroup v2 path, in the text of
/// `/proc/PID/cgroup`.
///
/// Handles the cgroupfs layout (`/docker/<id>`, `/kubepods/burstable/pod<uid>/<id>`,
/// `/libpod_parent/libpod-<id>`) and the systemd one (`docker-<id>.scope`,
/// `cri-containerd-<id>.scope`, `crio-<id>.scope`, `libpod-<id>.scope`,
/// `kubepods-burstable-pod<uid_with_underscores>.slice`), as dcgm-exporter's pod mapper does,
/// and rootless runtimes under `user.slice/user-UID.slice/user@UID.service/…`.
pub fn parse_cgroup(text: &str) -> ContainerInfo {
    let mut info = ContainerInfo {
        cgroup: text
            .lines()
            .find_map(|line| line.strip_prefix("0::"))
            .map(str::to_owned),
        ..ContainerInfo::default()
    };
    for line in text.lines() {
        // hierarchy-ID:controller-list:path
        let Some(path) = line.splitn(3, ':').nth(2) else {
            continue;
        };
        let components: Vec<&str> = path.split('/').collect();
        for (at, component) in components.iter().enumerate().rev() {
            let ancestors = &components[..at];
            if info.container_id.is_none()
                && let Some(id) = hex_run(component, 64)
            {
                info.container_id = Some(id.to_owned());
                info.runtime = runtime_of(component, id, ancestors.last().copied());
                info.rootless_uid = ancestors.iter().find_map(|c| delegated_uid(c));
            }
            if info.pod_uid.is_none()
                && let Some(uid) = pod_uid(component)
            {
                info.pod_uid = Some(uid);
                info.pod_qos = pod_qos(&components[..=at]);
            }
        }
        if info.container_id.is_some() && info.pod_uid.is_some() {
            break;
        }
    }
    info
}

/// The runtime a cgroup component holding container id `id` names: by the prefix before the
/// id (`docker-`, `libpod-`, …), or for a bare id by its parent (`/docker/<id>`).
fn runtime_of(component: &str, id: &str, parent: Option<&str>) -> Option<ContainerRuntime> {
    let prefix = component.split(id).next().unwrap_or_default();
    match prefix {
        "docker-" => Some(ContainerRuntime::Docker),
        // The conmon scope holds Podman's (and CRI-O's) monitor, which belongs to the same
        // container.
        "libpod-" | "libpod-conmon-" => Some(ContainerRuntime::Podman),
        "cri-containerd-" | "nerdctl-" => Some(ContainerRuntime::Containerd),
        "crio-" | "crio-conmon-" => Some(ContainerRuntime::CriO),
        "" => match parent {
            Some("docker") => Some(ContainerRuntime::Docker),
            Some("libpod_parent") => Some(ContainerRuntime::Podman),
            _ => None,
        },
        _ => None,
    }
}

/// `user@UID.service`: systemd's per-user manager, whose subtree is delegated to that user.
fn delegated_uid(component: &str) -> Option<u32> {
    component
        .strip_prefix("user@")?
        .strip_suffix(".service")?
        .parse()
        .ok()
}

/// The QoS class from a pod's cgroup component and its ancestors: the kubelet puts
/// Burstable and BestEffort pods under their class's cgroup and Guaranteed ones directly
/// under `kubepods`.
fn pod_qos(path_to_pod: &[&str]) -> Option<PodQos> {
    if path_to_pod.iter().any(|c| c.contains("besteffort")) {
        Some(PodQos::BestEffort)
    } else if path_to_pod.iter().any(|c| c.contains("burstable")) {
        Some(PodQos::Burstable)
    } else if path_to_pod.iter().any(|c| c.contains("kubepods")) {
        Some(PodQos::Guaranteed)
    } else {
        None
    }
}

/// A run of exactly `len` lowercase hex digits in `text`, bounded by non-hex characters.
fn hex_run(text: &str, len: usize) -> Option<&str> {
    let bytes = text.as_bytes();
    let mut start = 0;
    while start < bytes.len() {
        if !is_lower_hex(bytes[start]) {
            start += 1;
            continue;
        }
        let end = bytes[start..]
            .iter()
            .position(|b| !is_lower_hex(*b))
            .map_or(bytes.len(), |n| start + n);
        if end - start == len {
            return text.get(start..end);
        }
        start = end;
    }
    None
}

fn is_lower_hex(b: u8) -> bool {
    b.is_ascii_digit() || (b'a'..=b'f').contains(&b)
}

/// `pod<uid>` in a cgroup path component, the UID's `_` (systemd escaping) made `-`.
fn pod_uid(component: &str) -> Option<String> {
    let mut rest = component;
    while let Some(at) = rest.find("pod") {
        let candidate: String = rest[at + 3..]
            .chars()
            .take(36)
            .map(|c| if c == '_' { '-' } else { c })
            .collect();
        let shape_ok = candidate.len() == 36
            && candidate.char_indices().all(|(i, c)| match i {
                8 | 13 | 18 | 23 => c == '-',
                _ => c.is_ascii_hexdigit(),
            });
        if shape_ok {
            return Some(candidate.to_ascii_lowercase());
        }
        rest = &rest[at + 3..];
    }
    None
}

/// What is known of one container: what its cgroup said and the name its runtime's state
/// gives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerFacts {
    /// The 64-hex-digit container id.
    pub id: String,
    /// The runtime, when the cgroup name gives it away.
    pub runtime: Option<ContainerRuntime>,
    /// The container's name in its runtime (untrusted text: the container's creator chose
    /// it); `None` when its state could not be read or the runtime keeps names elsewhere.
    pub name: Option<String>,
    /// Set for a rootless container: the user whose cgroup subtree holds it.
    pub rootless_uid: Option<u32>,
}

/// How a user's home directory is found (`getpwuid`'s answer by default).
type HomeOf = Box<dyn Fn(u32) -> Option<PathBuf> + Send + Sync>;

/// The cache's key: a rootless container is looked up in its user's state only, so the
/// same id under another user (or the system) is another entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct NameKey {
    id: String,
    runtime: Option<ContainerRuntime>,
    rootless_uid: Option<u32>,
}

/// Container names from runtimes' state files, read once per container (and again after
/// [`RETRY_UNNAMED_MS`] while unnamed).
pub struct ContainerNames {
    root: PathBuf,
    home_of: HomeOf,
    /// Per container, its name (or `None`) and when (monotonic ms) it was read.
    names: HashMap<NameKey, (Option<String>, u64)>,
    /// How many state files were opened, for tests of the cache.
    reads: u64,
}

impl std::fmt::Debug for ContainerNames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContainerNames")
            .field("root", &self.root)
            .field("names", &self.names.len())
            .finish_non_exhaustive()
    }
}

impl ContainerNames {
    /// Reads state under `root` (`/` on a host); homes are the password database's, taken
    /// under `root` too.
    pub fn new(root: PathBuf) -> Self {
        let home_root = root.clone();
        let home_of: HomeOf = Box::new(move |uid| {
            let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)).ok()??;
            Some(under_root(&home_root, &user.dir))
        });
        Self::with_homes(root, home_of)
    }

    /// The root from [`ROOT_ENV`], `/` when unset or empty.
    pub fn from_env() -> Self {
        let root = std::env::var_os(ROOT_ENV)
            .filter(|r| !r.is_empty())
            .map_or_else(|| PathBuf::from("/"), PathBuf::from);
        Self::new(root)
    }

    /// Reads state under `root`, users' homes as `home_of` says (for tests).
    pub fn with_homes(root: PathBuf, home_of: HomeOf) -> Self {
        Self {
            root,
            home_of,
            names: HashMap::new(),
            reads: 0,
        }
    }

    /// How many state files have been opened so far.
    pub fn reads(&self) -> u64 {
        self.reads
    }

    /// The name of the container `info` names, looked up (cached per container) at
    /// monotonic time `now_ms`; `None` for a process in no container or a container whose
    /// name cannot be read.
    pub fn name(&mut self, info: &ContainerInfo, now_ms: u64) -> Option<String> {
        let id = info.container_id.clone()?;
        let key = NameKey {
            id: id.clone(),
            runtime: info.runtime,
            rootless_uid: info.rootless_uid,
        };
        let cached = self.names.get(&key).and_then(|(name, read_ms)| {
            let fresh = name.is_some() || now_ms.saturating_sub(*read_ms) < RETRY_UNNAMED_MS;
            fresh.then(|| name.clone())
        });
        match cached {
            Some(name) => name,
            None => {
                let name = self.look_up(&key);
                if self.names.len() >= CACHE_MAX_ENTRIES {
                    self.names.clear();
                }
                self.names.insert(key, (name.clone(), now_ms));
                name
            }
        }
    }

    /// `info` with its container's name filled in ([`name`](Self::name)), as facts.
    pub fn facts(&mut self, info: &ContainerInfo, now_ms: u64) -> Option<ContainerFacts> {
        let mut info = info.clone();
        info.name = self.name(&info, now_ms);
        info.facts()
    }

    fn look_up(&mut self, key: &NameKey) -> Option<String> {
        let result = match (key.runtime, key.rootless_uid) {
            (Some(ContainerRuntime::Docker), None) => {
                let dir = self.root.join("var/lib/docker/containers").join(&key.id);
                self.read_system(&dir.join("config.v2.json"), DOCKER_CONFIG_MAX_BYTES)
                    .and_then(|bytes| docker_name(bytes.as_deref(), &key.id))
            }
            (Some(ContainerRuntime::Docker), Some(uid)) => {
                let path = [".local", "share", "docker", "containers", key.id.as_str()];
                self.read_in_home(uid, &path, "config.v2.json", DOCKER_CONFIG_MAX_BYTES)
                    .and_then(|bytes| docker_name(bytes.as_deref(), &key.id))
            }
            (Some(ContainerRuntime::Podman), None) => {
                let store = self.root.join("var/lib/containers/storage");
                first_name(STORAGE_DRIVERS.iter().map(|driver| {
                    let state = store.join(format!("{driver}-containers/containers.json"));
                    self.read_system(&state, PODMAN_STATE_MAX_BYTES)
                        .and_then(|bytes| podman_name(bytes.as_deref(), &key.id))
                }))
            }
            (Some(ContainerRuntime::Podman), Some(uid)) => {
                first_name(STORAGE_DRIVERS.iter().map(|driver| {
                    let store = format!("{driver}-containers");
                    let path = [".local", "share", "containers", "storage", store.as_str()];
                    self.read_in_home(uid, &path, "containers.json", PODMAN_STATE_MAX_BYTES)
                        .and_then(|bytes| podman_name(bytes.as_deref(), &key.id))
                }))
            }
            // containerd and CRI-O keep names behind their APIs; the kubelet names pods.
            (Some(ContainerRuntime::Containerd | ContainerRuntime::CriO) | None, _) => Ok(None),
        };
        match result {
            Ok(name) => name,
            Err(why) => {
                tracing::debug!(container = %key.id, "no container name: {why}");
                None
            }
        }
    }

    /// A root-owned state file (its path may pass through symlinks an administrator made,
    /// such as `/var/lib/docker` moved to another disk); a missing file is `Ok(None)`.
    fn read_system(&mut self, path: &Path, max_bytes: u64) -> Result<Option<Vec<u8>>, String> {
        let flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK;
        match rustix::fs::open(path, flags, Mode::empty()) {
            Ok(fd) => {
                self.reads += 1;
                read_regular(fd, max_bytes)
                    .map(Some)
                    .map_err(|e| format!("{}: {e}", path.display()))
            }
            Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR) => Ok(None),
            Err(e) => Err(format!("{}: {e}", path.display())),
        }
    }

    /// A file in a user's home, at `dirs/…/file`: the home is opened as the password
    /// database names it, everything below it without following symlinks (the user could
    /// point them at another user's or the system's files); a missing file is `Ok(None)`.
    fn read_in_home(
        &mut self,
        uid: u32,
        dirs: &[&str],
        file: &str,
        max_bytes: u64,
    ) -> Result<Option<Vec<u8>>, String> {
        let home = (self.home_of)(uid).ok_or_else(|| format!("uid {uid} has no home"))?;
        let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let context = |e: rustix::io::Errno| format!("{} of uid {uid}: {e}", home.display());
        let mut dir = match rustix::fs::open(&home, dir_flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(e) => return Err(context(e)),
        };
        for name in dirs {
            dir = match rustix::fs::openat(
                dir.as_fd(),
                *name,
                dir_flags | OFlags::NOFOLLOW,
                Mode::empty(),
            ) {
                Ok(fd) => fd,
                Err(rustix::io::Errno::NOENT) => return Ok(None),
                // ELOOP or ENOTDIR: a symlink or something else where a directory belongs.
                Err(e) => return Err(context(e)),
            };
        }
        let flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOFOLLOW;
        match rustix::fs::openat(dir.as_fd(), file, flags, Mode::empty()) {
            Ok(fd) => {
                self.reads += 1;
                read_regular(fd, max_bytes)
                    .map(Some)
                    .map_err(|e| context_text(&home, uid, &e))
            }
            Err(rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(context(e)),
        }
    }
}

fn context_text(home: &Path, uid: u32, e: &str) -> String {
    format!("{} of uid {uid}: {e}", home.display())
}

/// `path` (absolute) taken under `root`.
fn under_root(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

/// The contents of an opened file if it is a regular file of at most `max_bytes` (a FIFO or
/// device could block or never end).
fn read_regular(fd: OwnedFd, max_bytes: u64) -> Result<Vec<u8>, String> {
    let stat = rustix::fs::fstat(&fd).map_err(|e| e.to_string())?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Err("not a regular file".to_owned());
    }
    let mut bytes = Vec::new();
    std::fs::File::from(fd)
        .take(max_bytes + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > max_bytes {
        return Err(format!("larger than {max_bytes} bytes"));
    }
    Ok(bytes)
}

/// The first name found in the stores tried in turn, else the first error, else `None`.
fn first_name(
    answers: impl Iterator<Item = Result<Option<String>, String>>,
) -> Result<Option<String>, String> {
    let mut error = None;
    for answer in answers {
        match answer {
            Ok(Some(name)) => return Ok(Some(name)),
            Ok(None) => {}
            Err(why) => {
                error.get_or_insert(why);
            }
        }
    }
    error.map_or(Ok(None), Err)
}

/// The name in a Docker `config.v2.json` (`"Name": "/web"`), if its `"ID"` is `id`; no
/// file, no name.
fn docker_name(bytes: Option<&[u8]>, id: &str) -> Result<Option<String>, String> {
    let Some(bytes) = bytes else {
        return Ok(None);
    };
    #[derive(Deserialize)]
    struct Config {
        #[serde(rename = "ID")]
        id: String,
        #[serde(rename = "Name")]
        name: Option<String>,
    }
    let config: Config = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    if config.id != id {
        return Err(format!("config.v2.json names container {}", config.id));
    }
    Ok(config
        .name
        .map(|n| n.strip_prefix('/').unwrap_or(&n).to_owned())
        .filter(|n| !n.is_empty()))
}

/// The first name of container `id` in a containers/storage `containers.json`; no file, no
/// name.
fn podman_name(bytes: Option<&[u8]>, id: &str) -> Result<Option<String>, String> {
    let Some(bytes) = bytes else {
        return Ok(None);
    };
    #[derive(Deserialize)]
    struct Container {
        id: String,
        #[serde(default)]
        names: Vec<String>,
    }
    let containers: Vec<Container> = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    Ok(containers
        .into_iter()
        .find(|c| c.id == id)
        .and_then(|c| c.names.into_iter().next()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f0c2b7a9d8e4f61a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f70819";
    const OTHER: &str = "fb586a2034754d4324e01f1a653c99495681c49780cf39389dd3b3fc6c4dc313";
    const UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";

    /// Runtime, QoS and rootless owner, as parsed.
    type Parsed = (Option<ContainerRuntime>, Option<PodQos>, Option<u32>);

    fn parsed(text: &str) -> Parsed {
        let info = parse_cgroup(text);
        (info.runtime, info.pod_qos, info.rootless_uid)
    }

    #[test]
    fn cgroup_names_give_away_the_runtime_qos_and_rootless_owner() {
        use ContainerRuntime::*;
        let pod = UID.replace('-', "_");
        let cases: Vec<(String, Parsed)> = vec![
            (
                format!("0::/system.slice/docker-{ID}.scope\n"),
                (Some(Docker), None, None),
            ),
            (
                format!("12:memory:/docker/{ID}\n"),
                (Some(Docker), None, None),
            ),
            (
                format!("0::/machine.slice/libpod-{ID}.scope/container\n"),
                (Some(Podman), None, None),
            ),
            // Podman's cgroupfs manager, as `podman run` wrote it on this machine (v1 + v2).
            (
                format!(
                    "9:name=systemd:/libpod_parent/libpod-{ID}\n0::/libpod_parent/libpod-{ID}\n"
                ),
                (Some(Podman), None, None),
            ),
            (
                format!(
                    "0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope/container\n"
                ),
                (Some(Podman), None, Some(1000)),
            ),
            (
                format!(
                    "0::/user.slice/user-1001.slice/user@1001.service/app.slice/docker-{ID}.scope\n"
                ),
                (Some(Docker), None, Some(1001)),
            ),
            (
                format!(
                    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{pod}.slice/cri-containerd-{ID}.scope\n"
                ),
                (Some(Containerd), Some(PodQos::Burstable), None),
            ),
            (
                format!("0::/kubepods.slice/kubepods-pod{pod}.slice/crio-{ID}.scope\n"),
                (Some(CriO), Some(PodQos::Guaranteed), None),
            ),
            // The kubelet's cgroupfs driver: a bare id, whatever the CRI runtime.
            (
                format!("11:devices:/kubepods/besteffort/pod{UID}/{ID}\n"),
                (None, Some(PodQos::BestEffort), None),
            ),
            (
                format!("0::/kubepods/pod{UID}/{ID}\n"),
                (None, Some(PodQos::Guaranteed), None),
            ),
            // kind and other nested kubelets prefix their own slice.
            (
                format!(
                    "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{pod}.slice/cri-containerd-{ID}.scope\n"
                ),
                (Some(Containerd), Some(PodQos::BestEffort), None),
            ),
            (
                format!("0::/system.slice/nerdctl-{ID}.scope\n"),
                (Some(Containerd), None, None),
            ),
            (
                format!("0::/some.slice/unknown-{ID}.scope\n"),
                (None, None, None),
            ),
            // A user's own session: no container, so no rootless owner either.
            (
                "0::/user.slice/user-1000.slice/user@1000.service/app.slice/x.scope\n".into(),
                (None, None, None),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(parsed(&text), want, "{text}");
            assert_eq!(
                parse_cgroup(&text).container_id.is_some(),
                want.0.is_some() || text.contains(ID),
                "{text}"
            );
        }
    }

    /// A state root in a temporary directory, homes under `<root>/home/<uid>`.
    struct Root {
        dir: tempfile::TempDir,
    }

    impl Root {
        fn new() -> Self {
            Self {
                dir: tempfile::tempdir().expect("tempdir"),
            }
        }
        fn path(&self, rel: &str) -> PathBuf {
            self.dir.path().join(rel)
        }
        fn write(&self, rel: &str, text: &str) -> PathBuf {
            let path = self.path(rel);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(&path, text).expect("write");
            path
        }
        fn names(&self) -> ContainerNames {
            let homes = self.dir.path().join("home");
            ContainerNames::with_homes(
                self.dir.path().to_owned(),
                Box::new(move |uid| Some(homes.join(uid.to_string()))),
            )
        }
    }

    fn info(cgroup: &str) -> ContainerInfo {
        parse_cgroup(cgroup)
    }

    fn docker(id: &str) -> ContainerInfo {
        info(&format!("0::/system.slice/docker-{id}.scope\n"))
    }

    fn rootless(runtime: &str, uid: u32, id: &str) -> ContainerInfo {
        info(&format!(
            "0::/user.slice/user-{uid}.slice/user@{uid}.service/user.slice/{runtime}-{id}.scope\n"
        ))
    }

    /// Docker's config.v2.json, abbreviated from a real one (the fields around the two read).
    fn docker_config(id: &str, name: &str) -> String {
        format!(
            r#"{{"StreamConfig":{{}},"State":{{"Running":true,"Paused":false,"Pid":48213,"ExitCode":0,"StartedAt":"2026-12-04T21:02:11.5Z"}},"ID":"{id}","Created":"2026-12-04T21:02:10.9Z","Managed":false,"Path":"python","Args":["train.py"],"Config":{{"Hostname":"{short}","Env":["PATH=/usr/bin","NVIDIA_VISIBLE_DEVICES=all"],"Cmd":["python","train.py"],"Image":"pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime","Labels":{{}}}},"Image":"sha256:0c1d","NetworkSettings":{{}},"LogPath":"/var/lib/docker/containers/{id}/{id}-json.log","Name":"{name}","Driver":"overlay2","RestartCount":0}}"#,
            short = &id[..12]
        )
    }

    /// containers/storage's containers.json, as `podman create` wrote it on this machine.
    fn podman_state(entries: &[(&str, &str)]) -> String {
        let items: Vec<String> = entries
            .iter()
            .map(|(id, name)| {
                format!(
                    r#"{{"id":"{id}","names":["{name}"],"image":"92cf02604d7759b89f53509bd0eca95525e5196cc2a3e2c222aff339093c9444","layer":"4c2cb42c3ddfd5589d6b3f039ffb61eab749af5ba84c6720d0ef0b15e2d51718","metadata":"{{\"image-name\":\"localhost/bb:test\",\"name\":\"{name}\",\"created-at\":1796423473}}","created":"2026-12-04T22:31:13.482588374Z","flags":{{"MountLabel":"","ProcessLabel":""}}}}"#
                )
            })
            .collect();
        format!("[{}]", items.join(","))
    }

    fn name_of(names: &mut ContainerNames, info: &ContainerInfo, now_ms: u64) -> Option<String> {
        names.facts(info, now_ms).and_then(|f| f.name)
    }

    #[test]
    fn docker_and_podman_names_come_from_their_state_files() {
        let root = Root::new();
        root.write(
            &format!("var/lib/docker/containers/{ID}/config.v2.json"),
            &docker_config(ID, "/trainer"),
        );
        root.write(
            "var/lib/containers/storage/vfs-containers/containers.json",
            &podman_state(&[(ID, "other"), (OTHER, "shape-test")]),
        );
        let mut names = root.names();
        let facts = names.facts(&docker(ID), 0).expect("a container");
        assert_eq!(
            facts,
            ContainerFacts {
                id: ID.into(),
                runtime: Some(ContainerRuntime::Docker),
                name: Some("trainer".into()),
                rootless_uid: None,
            }
        );
        let podman = info(&format!("0::/libpod_parent/libpod-{OTHER}\n"));
        assert_eq!(
            name_of(&mut names, &podman, 0).as_deref(),
            Some("shape-test")
        );
        // Not a container: no facts, nothing read.
        let reads = names.reads();
        assert_eq!(
            names.facts(&info("0::/user.slice/user-0.slice/session-1.scope\n"), 0),
            None
        );
        // CRI runtimes keep names behind their APIs: known id and runtime, no name.
        let cri = info(&format!(
            "0::/kubepods.slice/kubepods-pod{}.slice/cri-containerd-{ID}.scope\n",
            UID.replace('-', "_")
        ));
        let facts = names.facts(&cri, 0).expect("a container");
        assert_eq!(
            (facts.runtime, facts.name),
            (Some(ContainerRuntime::Containerd), None)
        );
        assert_eq!(names.reads(), reads);
    }

    #[test]
    fn names_are_read_once_per_container_and_unnamed_ones_retried_later() {
        let root = Root::new();
        let config = format!("var/lib/docker/containers/{ID}/config.v2.json");
        root.write(&config, &docker_config(ID, "/trainer"));
        let mut names = root.names();
        for tick_ms in [0, 1_000, 120_000] {
            assert_eq!(
                name_of(&mut names, &docker(ID), tick_ms).as_deref(),
                Some("trainer")
            );
        }
        assert_eq!(names.reads(), 1, "a named container is read once");

        // A container whose state is not there yet: unnamed, asked again only after a minute.
        assert_eq!(name_of(&mut names, &docker(OTHER), 0), None);
        root.write(
            &format!("var/lib/docker/containers/{OTHER}/config.v2.json"),
            &docker_config(OTHER, "/late"),
        );
        assert_eq!(name_of(&mut names, &docker(OTHER), 30_000), None);
        assert_eq!(
            name_of(&mut names, &docker(OTHER), 61_000).as_deref(),
            Some("late")
        );
    }

    #[test]
    fn malformed_oversized_and_mismatched_state_names_nothing() {
        let root = Root::new();
        let config = format!("var/lib/docker/containers/{ID}/config.v2.json");
        let mut names = root.names();
        for text in [
            "not json".to_owned(),
            r#"{"Name":"/no-id"}"#.to_owned(),
            // Another container's config copied under this id.
            docker_config(OTHER, "/impostor"),
            // Over the cap: never read whole.
            format!(
                r#"{{"ID":"{ID}","Name":"/big","Pad":"{}"}}"#,
                "x".repeat(5 << 20)
            ),
        ] {
            root.write(&config, &text);
            names = root.names();
            assert_eq!(
                name_of(&mut names, &docker(ID), 0),
                None,
                "{}",
                &text[..text.len().min(60)]
            );
        }
        let state = "var/lib/containers/storage/overlay-containers/containers.json";
        root.write(state, r#"{"id":"not an array"}"#);
        let podman = info(&format!("0::/machine.slice/libpod-{ID}.scope/container\n"));
        assert_eq!(name_of(&mut names, &podman, 0), None);
        root.write(state, &podman_state(&[(OTHER, "someone-else")]));
        let mut names = root.names();
        assert_eq!(name_of(&mut names, &podman, 0), None);
    }

    #[test]
    fn rootless_containers_are_named_from_their_users_home_only() {
        let root = Root::new();
        // The system has a container with this id, named "system-db".
        root.write(
            &format!("var/lib/docker/containers/{ID}/config.v2.json"),
            &docker_config(ID, "/system-db"),
        );
        root.write(
            "var/lib/containers/storage/overlay-containers/containers.json",
            &podman_state(&[(ID, "system-pod")]),
        );
        let mut names = root.names();
        // User 1000 puts a process in a cgroup claiming that id: its own state has none, so
        // no name, and never the system's.
        assert_eq!(name_of(&mut names, &rootless("docker", 1000, ID), 0), None);
        assert_eq!(name_of(&mut names, &rootless("libpod", 1000, ID), 0), None);
        assert_eq!(
            name_of(&mut names, &docker(ID), 0).as_deref(),
            Some("system-db")
        );

        root.write(
            "home/1001/.local/share/containers/storage/overlay-containers/containers.json",
            &podman_state(&[(OTHER, "alice-train")]),
        );
        root.write(
            &format!("home/1001/.local/share/docker/containers/{ID}/config.v2.json"),
            &docker_config(ID, "/alice-docker"),
        );
        let facts = names
            .facts(&rootless("libpod", 1001, OTHER), 0)
            .expect("a container");
        assert_eq!(facts.name.as_deref(), Some("alice-train"));
        assert_eq!(facts.rootless_uid, Some(1001));
        assert_eq!(
            name_of(&mut names, &rootless("docker", 1001, ID), 0).as_deref(),
            Some("alice-docker")
        );
    }

    #[test]
    fn symlinks_and_fifos_below_a_home_are_not_followed_or_opened() {
        let root = Root::new();
        let secret = root.write(
            "etc/secret.json",
            &podman_state(&[(OTHER, "from-a-symlink")]),
        );
        let storage = "home/1002/.local/share/containers/storage";
        std::fs::create_dir_all(root.path(storage)).expect("mkdir");
        // The store directory is a symlink to a directory the user does not own.
        std::fs::create_dir_all(root.path("etc/store")).expect("mkdir");
        std::fs::copy(&secret, root.path("etc/store/containers.json")).expect("copy");
        std::os::unix::fs::symlink(
            root.path("etc/store"),
            root.path(&format!("{storage}/overlay-containers")),
        )
        .expect("symlink");
        // The state file itself is a symlink.
        std::fs::create_dir_all(root.path(&format!("{storage}/vfs-containers"))).expect("mkdir");
        std::os::unix::fs::symlink(
            &secret,
            root.path(&format!("{storage}/vfs-containers/containers.json")),
        )
        .expect("symlink");
        let mut names = root.names();
        let podman = rootless("libpod", 1002, OTHER);
        assert_eq!(name_of(&mut names, &podman, 0), None);

        // A FIFO where the state belongs: opening it must not block, reading it is refused.
        let fifo_home = "home/1003/.local/share/containers/storage/btrfs-containers";
        std::fs::create_dir_all(root.path(fifo_home)).expect("mkdir");
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            root.path(&format!("{fifo_home}/containers.json")),
            Mode::from_raw_mode(0o600),
        )
        .expect("mkfifo");
        let started = std::time::Instant::now();
        assert_eq!(
            name_of(&mut names, &rootless("libpod", 1003, OTHER), 0),
            None
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        // And the real file, once it is a plain file, is read.
        std::fs::remove_file(root.path(&format!("{storage}/vfs-containers/containers.json")))
            .expect("rm");
        root.write(
            &format!("{storage}/vfs-containers/containers.json"),
            &podman_state(&[(OTHER, "plain")]),
        );
        let mut names = root.names();
        assert_eq!(name_of(&mut names, &podman, 0).as_deref(), Some("plain"));
    }

    #[test]
    fn the_root_comes_from_the_environment_variable_or_is_slash() {
        // Only the constructor's choice is tested; the environment is not changed here
        // (tests run in parallel threads).
        let names = ContainerNames::new(PathBuf::from("/srv/host"));
        assert_eq!(names.root, Path::new("/srv/host"));
        assert_eq!(
            under_root(Path::new("/srv/host"), Path::new("/home/a")),
            Path::new("/srv/host/home/a")
        );
    }
}
