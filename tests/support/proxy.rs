//! A TCP proxy on loopback that a test can turn into a black hole and back: what a
//! partition that drops packets does to one client's connections (open ones and new ones
//! alike get no answer and no error), while every other client of the same server is
//! unaffected. For a partition between network namespaces, see `netns.rs`.
//!
//! The partition heals in one of two ways: [`TcpProxy::mend`] closes the connections it
//! swallowed, so their clients learn at once; [`TcpProxy::heal_stranding`] leaves them
//! open and silent for good, as connections to an API server instance that went away
//! without a reset are (its machine lost, a load balancer's backend gone), so a client
//! learns only from a timeout of its own.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct TcpProxy {
    address: SocketAddr,
    black_hole: watch::Sender<bool>,
    /// Whether the next heal leaves the swallowed connections open and silent.
    strand: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl TcpProxy {
    /// Forwards connections on a free loopback port to `upstream`.
    pub async fn start(upstream: SocketAddr) -> TcpProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let address = listener.local_addr().expect("its address");
        let (black_hole, _) = watch::channel(false);
        let (strand, _) = watch::channel(false);
        let holes = black_hole.clone();
        let strands = strand.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                tokio::spawn(forward(
                    client,
                    upstream,
                    holes.subscribe(),
                    strands.subscribe(),
                ));
            }
        });
        TcpProxy {
            address,
            black_hole,
            strand,
            task,
        }
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The partition: from now on nothing passes on any connection, open or new, and
    /// nobody is told.
    pub fn swallow(&self) {
        self.black_hole.send_replace(true);
    }

    /// The partition heals: new connections pass again. The connections it swallowed are
    /// closed, as their peers would long since have given up on them.
    pub fn mend(&self) {
        self.strand.send_replace(false);
        self.black_hole.send_replace(false);
    }

    /// The partition heals for new connections only: the ones it swallowed stay open and
    /// silent until the proxy's runtime ends.
    #[allow(dead_code)] // not every test binary that includes this module uses it
    pub fn heal_stranding(&self) {
        self.strand.send_replace(true);
        self.black_hole.send_replace(false);
    }
}

/// Forwards one client connection until either side closes it, holding it silently
/// while the proxy is a black hole, and for good once swallowed if the heal strands.
async fn forward(
    mut client: TcpStream,
    upstream: SocketAddr,
    mut hole: watch::Receiver<bool>,
    strand: watch::Receiver<bool>,
) {
    if *hole.borrow_and_update() {
        let _ = hole.wait_for(|swallowing| !swallowing).await;
        hold_if_stranded(&strand, client).await;
        return;
    }
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    let swallowed = tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => false,
        _ = hole.wait_for(|swallowing| *swallowing) => true,
    };
    if swallowed {
        // Both sockets stay open and unread until the partition heals.
        let _ = hole.wait_for(|swallowing| !swallowing).await;
        hold_if_stranded(&strand, (client, server)).await;
    }
}

/// Keeps `sockets` open and unread forever when the heal strands swallowed connections.
async fn hold_if_stranded<T>(strand: &watch::Receiver<bool>, sockets: T) {
    if *strand.borrow() {
        std::future::pending::<()>().await;
    }
    drop(sockets);
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
