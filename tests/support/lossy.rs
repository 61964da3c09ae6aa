//! A TCP proxy that can lose a reply: it passes a script call on to Redis,
//! lets Redis run it, then closes the client's connection instead of
//! passing the answer back. A link that drops there leaves the client
//! unable to tell a call Redis ran from one it never got. A lost reply can
//! be held: the connection stays open, its reply unsent, until the test
//! lets it go, so that the test can act between a call's first run and
//! the client's resend.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{
        TcpListener, TcpStream,
        tcp::{OwnedReadHalf, OwnedWriteHalf},
    },
    sync::Semaphore,
    task::JoinHandle,
};

/// A proxy to `127.0.0.1:<upstream>` on a free port that passes everything
/// on, but for the replies [`lose_next_reply`](Self::lose_next_reply) asks
/// it to lose; stops accepting on drop.
pub struct LossyProxy {
    addr: SocketAddr,
    armed: Arc<AtomicBool>,
    lost: Arc<AtomicU64>,
    hold: Arc<Hold>,
    accept: JoinHandle<()>,
}

/// Whether a lost reply is held, and the permit that lets it go.
struct Hold {
    next: AtomicBool,
    release: Semaphore,
}

impl LossyProxy {
    pub async fn start(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let armed = Arc::new(AtomicBool::new(false));
        let lost = Arc::new(AtomicU64::new(0));
        let hold = Arc::new(Hold {
            next: AtomicBool::new(false),
            release: Semaphore::new(0),
        });
        let (arm, count, held) = (armed.clone(), lost.clone(), hold.clone());
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = TcpStream::connect(("127.0.0.1", upstream)).await.unwrap();
                let (from_client, to_client) = client.into_split();
                let (from_server, to_server) = server.into_split();
                let doomed = Arc::new(AtomicBool::new(false));
                tokio::spawn(requests(
                    from_client,
                    to_server,
                    arm.clone(),
                    doomed.clone(),
                ));
                tokio::spawn(replies(
                    from_server,
                    to_client,
                    doomed,
                    count.clone(),
                    held.clone(),
                ));
            }
        });
        Self {
            addr,
            armed,
            lost,
            hold,
            accept,
        }
    }

    /// The `redis://` URL of the proxy.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Loses the reply to the next script call (`EVALSHA`), on whichever
    /// connection it comes: Redis runs it, and its connection is closed
    /// before the reply reaches the client.
    pub fn lose_next_reply(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// As [`lose_next_reply`](Self::lose_next_reply), but the connection
    /// is closed only at [`let_go`](Self::let_go): until then the client
    /// waits for a reply that Redis has sent and the proxy holds.
    pub fn lose_and_hold_next_reply(&self) {
        self.hold.next.store(true, Ordering::SeqCst);
        self.lose_next_reply();
    }

    /// Closes the connection whose reply is held.
    pub fn let_go(&self) {
        self.hold.release.add_permits(1);
    }

    /// How many replies were lost so far.
    pub fn lost(&self) -> u64 {
        self.lost.load(Ordering::SeqCst)
    }
}

impl Drop for LossyProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Copies the client's requests to Redis, dooming the connection (before
/// Redis can answer) at the first script call after the proxy was armed.
async fn requests(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    armed: Arc<AtomicBool>,
    doomed: Arc<AtomicBool>,
) {
    let mut buf = vec![0; 64 * 1024];
    while let Ok(n @ 1..) = from.read(&mut buf).await {
        let chunk = &buf[..n];
        let script = chunk.windows(7).any(|w| w.eq_ignore_ascii_case(b"EVALSHA"));
        if script && armed.swap(false, Ordering::SeqCst) {
            doomed.store(true, Ordering::SeqCst);
        }
        if to.write_all(chunk).await.is_err() {
            return;
        }
    }
}

/// Copies Redis's replies to the client, until the connection is doomed:
/// then the next reply (Redis ran the call) is dropped with both sockets.
async fn replies(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    doomed: Arc<AtomicBool>,
    lost: Arc<AtomicU64>,
    hold: Arc<Hold>,
) {
    let mut buf = vec![0; 64 * 1024];
    while let Ok(n @ 1..) = from.read(&mut buf).await {
        if doomed.load(Ordering::SeqCst) {
            lost.fetch_add(1, Ordering::SeqCst);
            if hold.next.swap(false, Ordering::SeqCst) {
                hold.release.acquire().await.unwrap().forget();
            }
            // Dropping the halves closes the client's side (it reads EOF);
            // Redis's closes once the client hangs up.
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
