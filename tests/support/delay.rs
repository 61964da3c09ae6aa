//! A TCP proxy that holds every chunk for a while in each direction: a
//! Redis across a network, where loopback's round trip of microseconds
//! hides what waiting for an answer costs.

use std::{net::SocketAddr, time::Duration};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{
        TcpListener, TcpStream,
        tcp::{OwnedReadHalf, OwnedWriteHalf},
    },
    sync::mpsc,
    task::JoinHandle,
    time::Instant,
};

/// A proxy to `127.0.0.1:<upstream>` on a free port, delaying each chunk
/// `each_way` (so a round trip by twice that); stops accepting on drop.
pub struct DelayProxy {
    addr: SocketAddr,
    accept: JoinHandle<()>,
}

impl DelayProxy {
    pub async fn start(upstream: u16, each_way: Duration) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = TcpStream::connect(("127.0.0.1", upstream)).await.unwrap();
                for socket in [&client, &server] {
                    socket.set_nodelay(true).unwrap();
                }
                let (from_client, to_client) = client.into_split();
                let (from_server, to_server) = server.into_split();
                tokio::spawn(pipe(from_client, to_server, each_way));
                tokio::spawn(pipe(from_server, to_client, each_way));
            }
        });
        Self { addr, accept }
    }

    /// The `redis://` URL of the proxy.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Copies `from` to `to`, each chunk `delay` after it was read, in order.
async fn pipe(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, delay: Duration) {
    let (chunks, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    tokio::spawn(async move {
        while let Some((at, chunk)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
    });
    let mut buf = vec![0; 64 * 1024];
    while let Ok(n @ 1..) = from.read(&mut buf).await {
        if chunks
            .send((Instant::now() + delay, buf[..n].to_vec()))
            .is_err()
        {
            return;
        }
    }
}
