//! The listener and connection tasks: HTTP/1.1 on 127.0.0.1, with the ability to go away
//! (listener closed, open connections reset) and come back on the same port.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};
use hyper::body::Bytes;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::{AbortHandle, JoinHandle};

use super::faults::{Faults, RecordedRequest};
use super::resources::Registry;
use super::store::Store;
use super::tokens::Tokens;

pub type Body = UnsyncBoxBody<Bytes, std::io::Error>;

pub fn full_body(bytes: Bytes) -> Body {
    Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Changes kept for watch resumption before older versions answer 410 Gone.
const DEFAULT_HISTORY: usize = 10_000;

pub struct Shared {
    pub address: SocketAddr,
    pub store: Mutex<Store>,
    pub registry: Mutex<Registry>,
    pub faults: Mutex<Faults>,
    pub log: Mutex<Vec<RecordedRequest>>,
    pub bookmark_interval: Mutex<Duration>,
    /// Service account tokens issued through `serviceaccounts/{name}/token`.
    pub tokens: Mutex<Tokens>,
    /// Bumped to cut every open watch stream.
    pub drop_watches: tokio::sync::watch::Sender<u64>,
}

impl Shared {
    pub fn bookmark_interval(&self) -> Duration {
        self.bookmark_interval
            .lock()
            .map(|interval| *interval)
            .unwrap_or(Duration::from_secs(1))
    }
}

/// The accept loop and the connections it spawned, so both can be torn down on demand.
pub struct Listener {
    pub shared: Arc<Shared>,
    accept: Mutex<Option<JoinHandle<()>>>,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
}

impl Listener {
    pub async fn bind(address: std::net::SocketAddr) -> std::io::Result<Self> {
        let socket = TcpListener::bind(address).await?;
        let (drop_watches, _) = tokio::sync::watch::channel(0);
        let shared = Arc::new(Shared {
            address: socket.local_addr()?,
            store: Mutex::new(Store::new(DEFAULT_HISTORY)),
            registry: Mutex::new(Registry::default()),
            faults: Mutex::new(Faults::default()),
            log: Mutex::new(Vec::new()),
            bookmark_interval: Mutex::new(Duration::from_secs(1)),
            tokens: Mutex::new(Tokens::default()),
            drop_watches,
        });
        let listener = Self {
            shared,
            accept: Mutex::new(None),
            connections: Arc::new(Mutex::new(Vec::new())),
        };
        listener.serve(socket);
        Ok(listener)
    }

    fn serve(&self, socket: TcpListener) {
        let shared = self.shared.clone();
        let connections = self.connections.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = socket.accept().await else {
                    continue;
                };
                let shared = shared.clone();
                let connection = tokio::spawn(async move {
                    let service =
                        service_fn(move |request| super::routes::handle(shared.clone(), request));
                    // A client hanging up mid-request is routine (watch cancelled, client dropped).
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
                if let Ok(mut open) = connections.lock() {
                    open.retain(|handle| !handle.is_finished());
                    open.push(connection.abort_handle());
                }
            }
        });
        if let Ok(mut accept) = self.accept.lock() {
            *accept = Some(task);
        }
    }

    /// Closes the listening socket and resets every open connection.
    pub async fn stop(&self) {
        let task = self.accept.lock().ok().and_then(|mut accept| accept.take());
        if let Some(task) = task {
            task.abort();
            // Awaiting the cancelled task guarantees the socket is closed before we return.
            let _ = task.await;
        }
        self.abort_connections();
    }

    fn abort_connections(&self) {
        if let Ok(mut open) = self.connections.lock() {
            for handle in open.drain(..) {
                handle.abort();
            }
        }
    }

    /// Listens again on the same address.
    pub async fn restart(&self) -> std::io::Result<()> {
        let is_running = self
            .accept
            .lock()
            .map(|accept| accept.is_some())
            .unwrap_or(false);
        if is_running {
            return Ok(());
        }
        let socket = TcpListener::bind(self.shared.address).await?;
        self.serve(socket);
        Ok(())
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Ok(mut accept) = self.accept.lock()
            && let Some(task) = accept.take()
        {
            task.abort();
        }
        self.abort_connections();
    }
}
