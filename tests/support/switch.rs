//! A TCP proxy whose upstream can be moved: connections made after
//! [`switch_to`](SwitchProxy::switch_to) reach the new port, and those made
//! before stay with the node they reached. A DNS name or a virtual IP moved
//! to another node by a failover, while clients keep their connections.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU16, Ordering},
    },
};

use tokio::{
    io::copy_bidirectional,
    net::{TcpListener, TcpStream},
    task::JoinHandle,
};

/// A proxy to `127.0.0.1:<upstream>` on a free port; stops accepting on
/// drop (connections already made live on until either end closes).
pub struct SwitchProxy {
    addr: SocketAddr,
    upstream: Arc<AtomicU16>,
    accept: JoinHandle<()>,
}

impl SwitchProxy {
    pub async fn start(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let upstream = Arc::new(AtomicU16::new(upstream));
        let target = upstream.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let port = target.load(Ordering::SeqCst);
                tokio::spawn(async move {
                    // A node that is down refuses: so does the proxy, closing.
                    let Ok(mut server) = TcpStream::connect(("127.0.0.1", port)).await else {
                        return;
                    };
                    for socket in [&client, &server] {
                        socket.set_nodelay(true).unwrap();
                    }
                    let _ = copy_bidirectional(&mut client, &mut server).await;
                });
            }
        });
        Self {
            addr,
            upstream,
            accept,
        }
    }

    /// The `redis://` URL of the proxy.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Sends connections made from now on to `127.0.0.1:<port>`.
    pub fn switch_to(&self, port: u16) {
        self.upstream.store(port, Ordering::SeqCst);
    }
}

impl Drop for SwitchProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}
