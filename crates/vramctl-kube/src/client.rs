//! A client of the kubelet's pod-resources API (`v1.PodResourcesLister`).
//!
//! Each call opens the socket checked by [`crate::socket`], runs on its own current-thread
//! tokio runtime for the length of the call (nothing above this crate needs tokio), and is
//! bounded: the whole call (connect, HTTP/2 handshake, answer) by `timeout`, the answer's
//! size by `max_response_bytes`. The kubelet answers `List` since Kubernetes 1.20 (GA);
//! `Get` only where its `KubeletPodResourcesGet` feature gate is on (1.27+), else
//! [`KubeletError::Unsupported`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::transport::{Endpoint, Uri};

use crate::allocation::GpuAllocations;
use crate::podresources_v1::pod_resources_lister_client::PodResourcesListerClient;
use crate::podresources_v1::{GetPodResourcesRequest, ListPodResourcesRequest, PodResources};
use crate::socket::{self, SocketRefused};

/// Where the kubelet serves the API on every node (`--pod-resources-endpoint` is not a flag).
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// The kubelet's own client allows 16 MiB (`podresources.DefaultMaxMsgSize`); a node's
/// `List` with hundreds of pods is well below that.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// The kubelet answers from memory in milliseconds; a second is a hung kubelet, and a
/// one-shot `status` must not wait longer.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// Why the kubelet could not be asked or did not answer.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    #[error("kubelet socket refused: {0}")]
    Refused(#[from] SocketRefused),
    #[error("kubelet at {path}: no answer within {timeout_ms} ms")]
    Timeout { path: PathBuf, timeout_ms: u128 },
    #[error("kubelet at {path}: answer larger than {max_bytes} bytes")]
    TooLarge { path: PathBuf, max_bytes: usize },
    #[error("kubelet at {path}: {method} is not served (feature gate off or an old kubelet)")]
    Unsupported { path: PathBuf, method: &'static str },
    #[error("kubelet at {path}: {context}: {message}")]
    Call {
        path: PathBuf,
        context: &'static str,
        message: String,
    },
}

/// One way to ask the kubelet: which socket, whose it must be, and the bounds.
#[derive(Debug, Clone)]
pub struct PodResourcesQuery {
    pub socket_path: PathBuf,
    /// Besides root, whose socket is accepted: the caller's effective uid (0 for root, so
    /// then only root's).
    pub expected_owner_uid: u32,
    pub timeout: Duration,
    pub max_response_bytes: usize,
}

impl Default for PodResourcesQuery {
    fn default() -> Self {
        PodResourcesQuery {
            socket_path: PathBuf::from(DEFAULT_SOCKET),
            expected_owner_uid: 0,
            timeout: DEFAULT_TIMEOUT,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
        }
    }
}

impl PodResourcesQuery {
    /// The default socket and bounds, accepting a socket of root or of this process's
    /// effective user (root: root's only).
    pub fn for_this_user(socket_path: PathBuf) -> Self {
        PodResourcesQuery {
            socket_path,
            expected_owner_uid: rustix::process::geteuid().as_raw(),
            ..PodResourcesQuery::default()
        }
    }

    /// `List`: every pod of the node with its containers' resources.
    pub fn list(&self) -> Result<Vec<PodResources>, KubeletError> {
        let max = self.max_response_bytes;
        self.call("List", move |mut client| async move {
            client = client.max_decoding_message_size(max);
            client
                .list(ListPodResourcesRequest {})
                .await
                .map(|r| r.into_inner().pod_resources)
        })
    }

    /// `Get`: one pod by namespace and name; `Ok(None)` when the answer names no pod.
    pub fn get(&self, namespace: &str, pod: &str) -> Result<Option<PodResources>, KubeletError> {
        let max = self.max_response_bytes;
        let request = GetPodResourcesRequest {
            pod_name: pod.to_string(),
            pod_namespace: namespace.to_string(),
        };
        self.call("Get", move |mut client| async move {
            client = client.max_decoding_message_size(max);
            client
                .get(request)
                .await
                .map(|r| r.into_inner().pod_resources)
        })
    }

    /// `List`, reduced to the NVIDIA GPUs each container holds.
    pub fn gpu_allocations(&self) -> Result<GpuAllocations, KubeletError> {
        Ok(GpuAllocations::from_pod_resources(&self.list()?))
    }

    fn call<T, F, Fut>(&self, method: &'static str, request: F) -> Result<T, KubeletError>
    where
        T: Send,
        F: FnOnce(PodResourcesListerClient<tonic::transport::Channel>) -> Fut + Send,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        let checked = socket::open_checked(&self.socket_path, self.expected_owner_uid)?;
        let connect_path = checked.connect_path();
        let run = || self.run_on_own_runtime(method, &connect_path, request);
        // A runtime cannot be started inside another one's thread; a caller that is itself
        // async (the exporter) gets the call on a scoped thread instead.
        let result = if tokio::runtime::Handle::try_current().is_ok() {
            std::thread::scope(|scope| {
                scope.spawn(run).join().unwrap_or_else(|_| {
                    Err(self.call_error("the call's thread", "panicked".into()))
                })
            })
        } else {
            run()
        };
        // The descriptor that pins the checked socket lives until the call is over.
        drop(checked);
        result
    }

    fn run_on_own_runtime<T, F, Fut>(
        &self,
        method: &'static str,
        connect_path: &Path,
        request: F,
    ) -> Result<T, KubeletError>
    where
        F: FnOnce(PodResourcesListerClient<tonic::transport::Channel>) -> Fut,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| self.call_error("starting a runtime", e.to_string()))?;
        let path = connect_path.to_path_buf();
        let answer = runtime.block_on(async {
            tokio::time::timeout(self.timeout, async {
                // The URI is required by the HTTP/2 layer and never resolved: the connector
                // below always dials the checked socket.
                let endpoint = Endpoint::try_from("http://kubelet.invalid")
                    .map_err(|e| self.call_error("endpoint", e.to_string()))?
                    .connect_timeout(self.timeout)
                    .timeout(self.timeout);
                let channel = endpoint
                    .connect_with_connector(tower::service_fn(move |_: Uri| {
                        let path = path.clone();
                        async move {
                            tokio::net::UnixStream::connect(path)
                                .await
                                .map(TokioIo::new)
                        }
                    }))
                    .await
                    .map_err(|e| self.call_error("connecting", error_chain(&e)))?;
                request(PodResourcesListerClient::new(channel))
                    .await
                    .map_err(|status| self.status_error(method, &status))
            })
            .await
        });
        // Dropping the runtime ends the connection's background task with it.
        drop(runtime);
        match answer {
            Ok(result) => result,
            Err(_) => Err(KubeletError::Timeout {
                path: self.socket_path.clone(),
                timeout_ms: self.timeout.as_millis(),
            }),
        }
    }

    fn status_error(&self, method: &'static str, status: &tonic::Status) -> KubeletError {
        match status.code() {
            tonic::Code::Unimplemented => KubeletError::Unsupported {
                path: self.socket_path.clone(),
                method,
            },
            // tonic's decoder refuses a message over the limit with OutOfRange.
            tonic::Code::OutOfRange | tonic::Code::ResourceExhausted
                if status.message().contains("message length too large")
                    || status.message().contains("larger than") =>
            {
                KubeletError::TooLarge {
                    path: self.socket_path.clone(),
                    max_bytes: self.max_response_bytes,
                }
            }
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => KubeletError::Timeout {
                path: self.socket_path.clone(),
                timeout_ms: self.timeout.as_millis(),
            },
            _ => self.call_error(method, format!("{:?}: {}", status.code(), status.message())),
        }
    }

    fn call_error(&self, context: &'static str, message: String) -> KubeletError {
        KubeletError::Call {
            path: self.socket_path.clone(),
            context,
            message,
        }
    }
}

/// An error with its sources, `a: b: c` (tonic's transport errors say little at the top).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}
