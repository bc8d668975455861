//! A kubelet stand-in for tests (feature `test-kubelet`): the server generated from the
//! same `podresources/v1` proto, answering a given `List`, on a Unix socket. No kubelet
//! runs where the tests run, so this is the boundary's only double; the client under test
//! is the real one, over a real socket and a real HTTP/2 connection.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use crate::podresources_v1::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use crate::podresources_v1::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, GetPodResourcesRequest,
    GetPodResourcesResponse, ListPodResourcesRequest, ListPodResourcesResponse, PodResources,
};

/// How the stand-in answers.
#[derive(Debug, Clone, Copy)]
pub enum Behaviour {
    /// `List` and `Get` answer from the pods given.
    Answer,
    /// `List` and `Get` never complete (a hung kubelet).
    Hang,
    /// `Get` is not served, as on a kubelet with the `KubeletPodResourcesGet` gate off.
    NoGet,
}

struct Kubelet {
    pods: Arc<Vec<PodResources>>,
    behaviour: Behaviour,
}

#[tonic::async_trait]
impl PodResourcesLister for Kubelet {
    async fn list(
        &self,
        _request: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        if let Behaviour::Hang = self.behaviour {
            std::future::pending::<()>().await;
        }
        Ok(Response::new(ListPodResourcesResponse {
            pod_resources: self.pods.as_ref().clone(),
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _request: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        Err(Status::unimplemented("not used by vramctl"))
    }

    async fn get(
        &self,
        request: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        match self.behaviour {
            Behaviour::Hang => std::future::pending::<()>().await,
            Behaviour::NoGet => {
                return Err(Status::unimplemented(
                    "PodResources API Get method disabled",
                ));
            }
            Behaviour::Answer => {}
        }
        let request = request.into_inner();
        let pod = self
            .pods
            .iter()
            .find(|p| p.name == request.pod_name && p.namespace == request.pod_namespace)
            .cloned()
            .ok_or_else(|| Status::not_found("pod not found"))?;
        Ok(Response::new(GetPodResourcesResponse {
            pod_resources: Some(pod),
        }))
    }
}

/// A server on its own thread and runtime; stops when dropped.
#[derive(Debug)]
pub struct TestKubelet {
    socket: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestKubelet {
    /// Binds `socket` (which must not exist) and serves `pods` until dropped.
    ///
    /// # Errors
    /// When the runtime cannot start or the socket cannot be bound.
    pub fn start(
        socket: &Path,
        pods: Vec<PodResources>,
        behaviour: Behaviour,
    ) -> std::io::Result<TestKubelet> {
        let path = socket.to_path_buf();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let listener = {
            let _guard = runtime.enter();
            tokio::net::UnixListener::bind(&path)?
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let service = PodResourcesListerServer::new(Kubelet {
            pods: Arc::new(pods),
            behaviour,
        });
        let thread = std::thread::spawn(move || {
            // One service, no router: tonic's `router` feature would bring axum in.
            let serve = tonic::transport::Server::builder().serve_with_incoming_shutdown(
                service,
                UnixListenerStream::new(listener),
                async {
                    let _ = stopped.await;
                },
            );
            if let Err(e) = runtime.block_on(serve) {
                eprintln!("test kubelet: {e}");
            }
        });
        Ok(TestKubelet {
            socket: path,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The socket it serves on.
    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

impl Drop for TestKubelet {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
