//! A TCP proxy on loopback that a test can turn into a black hole and back: what a
//! partition that drops packets does to one client's connections (open ones and new ones
//! alike get no answer and no error), while every other client of the same server is
//! unaffected. For a partition between network namespaces, see `netns.rs`.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct TcpProxy {
    address: SocketAddr,
    black_hole: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl TcpProxy {
    /// Forwards connections on a free loopback port to `upstream`.
    pub async fn start(upstream: SocketAddr) -> TcpProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let address = listener.local_addr().expect("its address");
        let (black_hole, _) = watch::channel(false);
        let holes = black_hole.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                tokio::spawn(forward(client, upstream, holes.subscribe()));
            }
        });
        TcpProxy {
            address,
            black_hole,
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
        self.black_hole.send_replace(false);
    }
}

/// Forwards one client connection until either side closes it, holding it silently
/// while the proxy is a black hole.
async fn forward(mut client: TcpStream, upstream: SocketAddr, mut hole: watch::Receiver<bool>) {
    if *hole.borrow_and_update() {
        let _ = hole.wait_for(|swallowing| !swallowing).await;
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
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
