//! A TCP proxy on loopback that a test can cut and mend: what a network partition does
//! to one client's connections (open ones reset, new ones refused), while every other
//! client of the same server is unaffected.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct TcpProxy {
    address: SocketAddr,
    cut: Arc<AtomicBool>,
    /// Bumped on every cut: the connections open before it end.
    generation: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl TcpProxy {
    /// Forwards connections on a free loopback port to `upstream`.
    pub async fn start(upstream: SocketAddr) -> TcpProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let address = listener.local_addr().expect("its address");
        let cut = Arc::new(AtomicBool::new(false));
        let (generation, _) = watch::channel(0u64);
        let refusing = cut.clone();
        let cuts = generation.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    continue;
                };
                if refusing.load(Ordering::SeqCst) {
                    // Closed at once: the client sees its connection reset.
                    let _ = client.set_zero_linger();
                    drop(client);
                    continue;
                }
                let mut ended = cuts.subscribe();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = ended.changed() => {
                            let _ = client.set_zero_linger();
                        }
                    }
                });
            }
        });
        TcpProxy {
            address,
            cut,
            generation,
            task,
        }
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The partition: open connections are reset, new ones refused.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.generation.send_modify(|generation| *generation += 1);
    }

    /// The partition heals.
    pub fn mend(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
