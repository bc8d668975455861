//! The client against a kubelet stand-in: a server generated from the same
//! `podresources/v1` proto (the only test double, at a boundary a test cannot reach: no
//! kubelet runs here), serving on a Unix socket in a temporary directory.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vramctl_kube::client::KubeletError;
use vramctl_kube::podresources_v1::{
    ContainerDevices, ContainerResources, NumaNode, PodResources, TopologyInfo,
};
use vramctl_kube::socket::SocketRefused;
use vramctl_kube::test_kubelet::{Behaviour, TestKubelet};
use vramctl_kube::{DeviceId, PodResourcesQuery};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const GPU0: &str = "GPU-8ad3f8a4-1a2b-3c4d-5e6f-0123456789ab";
const GPU1: &str = "GPU-19c0e4d2-7b3a-4f51-9e8d-abcdefabcdef";
const GPU2: &str = "GPU-2b7e1f90-1111-4222-8333-944455566677";
const MIG_A: &str = "MIG-1f2e3d4c-5b6a-5980-a1b2-c3d4e5f60718";
const MIG_B: &str = "MIG-6a5b4c3d-2e1f-5098-b7a6-0918f7e6d5c4";

/// The stand-in in a temporary directory of its own.
struct Server {
    kubelet: TestKubelet,
    dir: tempfile::TempDir,
}

impl Server {
    fn start(
        pods: Vec<PodResources>,
        behaviour: Behaviour,
    ) -> Result<Server, Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let kubelet = TestKubelet::start(&dir.path().join("kubelet.sock"), pods, behaviour)?;
        Ok(Server { kubelet, dir })
    }

    fn socket(&self) -> PathBuf {
        self.kubelet.socket().to_path_buf()
    }

    fn query(&self) -> PodResourcesQuery {
        query_for(&self.socket())
    }
}

fn query_for(path: &Path) -> PodResourcesQuery {
    PodResourcesQuery {
        socket_path: path.to_path_buf(),
        expected_owner_uid: rustix::process::geteuid().as_raw(),
        timeout: Duration::from_secs(2),
        ..PodResourcesQuery::default()
    }
}

fn devices(resource: &str, ids: &[&str]) -> ContainerDevices {
    ContainerDevices {
        resource_name: resource.into(),
        device_ids: ids.iter().map(|s| s.to_string()).collect(),
        topology: Some(TopologyInfo {
            nodes: vec![NumaNode { id: 0 }],
        }),
    }
}

fn container(name: &str, devices: Vec<ContainerDevices>) -> ContainerResources {
    ContainerResources {
        name: name.into(),
        devices,
        cpu_ids: vec![2, 3],
        ..Default::default()
    }
}

fn pod(namespace: &str, name: &str, containers: Vec<ContainerResources>) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: namespace.into(),
        containers,
        ..Default::default()
    }
}

/// A node as the kubelet describes it with the NVIDIA device plugin: a two-GPU training pod
/// with a sidecar, a pod without GPUs, two pods on MIG instances (mixed strategy), a pod
/// with another vendor's device, and a system pod.
fn node() -> Vec<PodResources> {
    vec![
        pod(
            "ml",
            "train-7f9c",
            vec![
                container("trainer", vec![devices("nvidia.com/gpu", &[GPU0, GPU1])]),
                container("log-shipper", vec![]),
            ],
        ),
        pod("web", "frontend-5d8b", vec![container("nginx", vec![])]),
        pod(
            "ml",
            "infer-a",
            vec![container(
                "server",
                vec![devices("nvidia.com/mig-1g.10gb", &[MIG_A])],
            )],
        ),
        pod(
            "research",
            "notebook",
            vec![container(
                "jupyter",
                vec![devices("nvidia.com/mig-3g.40gb", &[MIG_B])],
            )],
        ),
        pod(
            "net",
            "router",
            vec![container(
                "dpdk",
                vec![devices("intel.com/sriov_netdevice", &["0000:3b:02.1"])],
            )],
        ),
        pod(
            "kube-system",
            "nvidia-device-plugin-x7k2p",
            vec![container("nvidia-device-plugin-ctr", vec![])],
        ),
    ]
}

#[test]
fn list_maps_gpus_and_mig_instances_to_pod_containers() -> TestResult {
    let server = Server::start(node(), Behaviour::Answer)?;
    let pods = server.query().list()?;
    assert_eq!(pods.len(), 6);

    let allocations = server.query().gpu_allocations()?;
    let by_uuid = allocations.by_uuid();
    let named = |uuid: &str| -> Vec<String> {
        by_uuid
            .get(uuid)
            .map(|owners| owners.iter().map(|o| o.to_string()).collect())
            .unwrap_or_default()
    };
    assert_eq!(named(GPU0), ["ml/train-7f9c/trainer"]);
    assert_eq!(named(GPU1), ["ml/train-7f9c/trainer"]);
    assert_eq!(named(MIG_A), ["ml/infer-a/server"]);
    assert_eq!(named(MIG_B), ["research/notebook/jupyter"]);
    // A GPU no pod holds, the network card and the GPU-less pods are in no entry.
    assert!(named(GPU2).is_empty());
    assert_eq!(by_uuid.len(), 4, "{by_uuid:?}");
    assert!(
        allocations
            .allocations
            .iter()
            .all(|a| matches!(a.device, DeviceId::Gpu { .. } | DeviceId::Mig { .. }))
    );
    Ok(())
}

#[test]
fn get_answers_one_pod_and_says_when_the_kubelet_does_not_serve_it() -> TestResult {
    let server = Server::start(node(), Behaviour::Answer)?;
    let pod = server.query().get("research", "notebook")?;
    assert_eq!(
        pod.map(|p| p.containers[0].name.clone()).as_deref(),
        Some("jupyter")
    );
    assert!(matches!(
        server.query().get("research", "absent"),
        Err(KubeletError::Call { .. })
    ));

    let old = Server::start(node(), Behaviour::NoGet)?;
    assert!(matches!(
        old.query().get("ml", "infer-a"),
        Err(KubeletError::Unsupported { method: "Get", .. })
    ));
    // List still works there.
    assert_eq!(old.query().list()?.len(), 6);
    Ok(())
}

#[test]
fn a_kubelet_that_never_answers_times_out() -> TestResult {
    let server = Server::start(node(), Behaviour::Hang)?;
    let mut query = server.query();
    query.timeout = Duration::from_millis(300);
    let started = Instant::now();
    let result = query.list();
    let waited = started.elapsed();
    assert!(
        matches!(result, Err(KubeletError::Timeout { .. })),
        "{result:?}"
    );
    assert!(waited < Duration::from_secs(2), "waited {waited:?}");
    Ok(())
}

#[test]
fn a_socket_that_accepts_but_never_speaks_times_out() -> TestResult {
    // Not even the HTTP/2 handshake comes back: the connect phase is bounded too.
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("kubelet.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&path)?;
    let mut query = query_for(&path);
    query.timeout = Duration::from_millis(300);
    let started = Instant::now();
    let result = query.list();
    assert!(
        matches!(result, Err(KubeletError::Timeout { .. })),
        "{result:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    Ok(())
}

#[test]
fn an_answer_over_the_size_limit_is_refused() -> TestResult {
    let many: Vec<PodResources> = (0..2000)
        .map(|i| {
            pod(
                "batch",
                &format!("job-{i:05}-{}", "x".repeat(40)),
                vec![container(
                    "worker",
                    vec![devices("nvidia.com/gpu", &[GPU0])],
                )],
            )
        })
        .collect();
    let server = Server::start(many, Behaviour::Answer)?;
    let mut query = server.query();
    query.max_response_bytes = 64 * 1024;
    let result = query.list();
    assert!(
        matches!(
            result,
            Err(KubeletError::TooLarge {
                max_bytes: 65536,
                ..
            })
        ),
        "{result:?}"
    );
    // The same answer under the default limit is read whole.
    assert_eq!(server.query().list()?.len(), 2000);
    Ok(())
}

#[test]
fn paths_that_are_not_the_kubelets_socket_are_refused() -> TestResult {
    let server = Server::start(node(), Behaviour::Answer)?;
    let dir = tempfile::tempdir()?;

    let file = dir.path().join("kubelet.sock");
    std::fs::write(&file, b"not a socket")?;
    assert!(matches!(
        query_for(&file).list(),
        Err(KubeletError::Refused(SocketRefused::NotASocket { .. }))
    ));

    // A symlink to a real, answering socket is still refused: never followed.
    let link = dir.path().join("link.sock");
    std::os::unix::fs::symlink(server.socket(), &link)?;
    assert!(matches!(
        query_for(&link).list(),
        Err(KubeletError::Refused(SocketRefused::Symlink { .. }))
    ));
    // ... and so is a symlinked directory on the way.
    let dir_link = dir.path().join("dirlink");
    std::os::unix::fs::symlink(server.dir.path(), &dir_link)?;
    assert!(matches!(
        query_for(&dir_link.join("kubelet.sock")).list(),
        Err(KubeletError::Refused(SocketRefused::Open { .. }))
    ));

    // A socket neither root's nor the expected user's: as root, one given to nobody; as a
    // user, one's own socket when only root's is accepted.
    let euid = rustix::process::geteuid().as_raw();
    let mut other_owner = server.query();
    other_owner.expected_owner_uid = 0;
    if euid == 0 {
        std::os::unix::fs::lchown(server.socket(), Some(65534), Some(65534))?;
    }
    assert!(matches!(
        other_owner.list(),
        Err(KubeletError::Refused(SocketRefused::WrongOwner { owner_uid, .. })) if owner_uid != 0
    ));
    if euid == 0 {
        // Given to the expected user, it is accepted again.
        other_owner.expected_owner_uid = 65534;
        assert_eq!(other_owner.list()?.len(), 6);
        std::os::unix::fs::lchown(server.socket(), Some(0), Some(0))?;
    }

    // A directory on the way that anyone may write to (no sticky bit).
    std::fs::set_permissions(server.dir.path(), std::fs::Permissions::from_mode(0o777))?;
    assert!(matches!(
        server.query().list(),
        Err(KubeletError::Refused(
            SocketRefused::WritableDirectory { .. }
        ))
    ));
    std::fs::set_permissions(server.dir.path(), std::fs::Permissions::from_mode(0o700))?;
    assert_eq!(server.query().list()?.len(), 6);

    assert!(matches!(
        query_for(&dir.path().join("absent.sock")).list(),
        Err(KubeletError::Refused(SocketRefused::Open { .. }))
    ));
    assert!(matches!(
        query_for(Path::new("relative/kubelet.sock")).list(),
        Err(KubeletError::Refused(SocketRefused::NotAbsolute { .. }))
    ));
    Ok(())
}

#[test]
fn the_call_works_from_inside_an_async_caller() -> TestResult {
    // The exporter calls from a tokio thread; the client must not start a runtime there.
    let server = Server::start(node(), Behaviour::Answer)?;
    let query = server.query();
    let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    let count = runtime.block_on(async { query.list().map(|p| p.len()) })?;
    assert_eq!(count, 6);
    Ok(())
}

#[test]
fn a_view_names_processes_by_pod_uid_and_gpus_by_allocation() -> TestResult {
    let server = Server::start(node(), Behaviour::Answer)?;
    let logs = tempfile::tempdir()?;
    let uid = "6f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b";
    std::fs::create_dir(logs.path().join(format!("ml_train-7f9c_{uid}")))?;
    let view = vramctl_kube::KubeletView::read(&server.query(), logs.path());
    assert_eq!(view.allocations_error, None);
    let pod = view.pod_of_process(Some(uid), &[GPU1]);
    assert_eq!(
        pod.map(|p| format!(
            "{}/{}/{}",
            p.namespace,
            p.pod,
            p.container.unwrap_or_default()
        )),
        Some("ml/train-7f9c/trainer".to_string())
    );
    assert_eq!(view.allocated_to(MIG_B), ["research/notebook/jupyter"]);

    // No socket there: nothing asked, the pod still named from its UID.
    let absent = query_for(&logs.path().join("absent.sock"));
    let view = vramctl_kube::KubeletView::read(&absent, logs.path());
    assert!(view.allocations.is_none());
    assert!(view.allocations_error.is_some());
    let pod = view.pod_of_process(Some(uid), &[GPU1]);
    assert_eq!(pod.as_ref().map(|p| p.pod.as_str()), Some("train-7f9c"));
    assert_eq!(pod.and_then(|p| p.container), None);
    Ok(())
}
