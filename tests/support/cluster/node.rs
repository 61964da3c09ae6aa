//! One cluster-enabled `redis-server` process: its own temp dir and
//! `nodes.conf`, a port below 55535 whose bus port (+10000) is free too,
//! stdout kept for panic messages, killed on drop.

use std::{
    collections::hash_map::RandomState,
    hash::BuildHasher,
    io::{BufRead, BufReader},
    net::TcpListener,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex, mpsc},
    time::Duration,
};

/// One `redis-server` of the cluster.
pub(super) struct Node {
    pub(super) child: Option<Child>,
    pub(super) port: u16,
    node_timeout_ms: u64,
    dir: tempfile::TempDir,
    pub(super) log: Arc<Mutex<String>>,
}

pub(super) fn install_hint(bin: &str, e: std::io::Error) -> String {
    format!(
        "cannot run `{bin}` ({e}). The cluster tests need real redis-server and redis-cli \
         binaries: install them (Debian/Ubuntu: apt-get install -y redis-server redis-tools; \
         macOS: brew install redis) or set REDIS_SERVER_BIN and REDIS_CLI_BIN"
    )
}

pub(super) fn bin(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

/// A port whose cluster bus port (+10000) is free too, below 55535.
fn cluster_port() -> u16 {
    for _ in 0..100 {
        let port = 20_000 + (RandomState::new().hash_one(0u8) % 35_000) as u16;
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 10_000) {
            return port;
        }
    }
    panic!("no free port pair for a cluster node after 100 tries");
}

impl Node {
    /// Starts a cluster-enabled node, retrying on another port if one was
    /// taken in the meantime.
    pub(super) fn start(node_timeout_ms: u64) -> Self {
        for _ in 0..10 {
            let node = Node {
                child: None,
                port: cluster_port(),
                node_timeout_ms,
                dir: tempfile::tempdir().expect("temp dir for redis-server"),
                log: Arc::new(Mutex::new(String::new())),
            };
            if let Some(node) = node.spawn() {
                return node;
            }
        }
        panic!("could not start a cluster node after 10 tries");
    }

    fn spawn(mut self) -> Option<Self> {
        let node_timeout_ms = self.node_timeout_ms;
        let server = bin("REDIS_SERVER_BIN", "redis-server");
        let mut child = Command::new(&server)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--logfile", ""])
            .args(["--dir", self.dir.path().to_str().expect("utf-8 temp dir")])
            .args(["--cluster-enabled", "yes"])
            .args(["--cluster-config-file", "nodes.conf"])
            .args(["--cluster-node-timeout", &node_timeout_ms.to_string()])
            // Replicas sync at once, and may always take over.
            .args(["--repl-diskless-sync-delay", "0"])
            .args(["--cluster-replica-validity-factor", "0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("{}", install_hint(&server, e)));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        let log = self.log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                log.lock().unwrap().push_str(&(line.clone() + "\n"));
                if line.contains("Ready to accept connections") {
                    let _ = tx.send(true);
                }
            }
            let _ = tx.send(false);
        });
        if let Ok(true) = rx.recv_timeout(Duration::from_secs(20)) {
            self.child = Some(child);
            return Some(self);
        }
        let _ = child.kill();
        let _ = child.wait();
        let log = self.log.lock().unwrap().clone();
        assert!(
            log.contains("Address already in use"),
            "cluster node did not start on port {}:\n{log}",
            self.port
        );
        None
    }

    /// Starts a killed node again on its port, with its `nodes.conf` (so it
    /// rejoins with its identity and slots) and an empty dataset.
    pub(super) fn restart(&mut self) {
        self.kill();
        let placeholder = Node {
            child: None,
            port: self.port,
            node_timeout_ms: self.node_timeout_ms,
            dir: tempfile::tempdir().expect("temp dir"),
            log: self.log.clone(),
        };
        let node = std::mem::replace(self, placeholder);
        let port = node.port;
        match node.spawn() {
            Some(node) => *self = node,
            None => panic!("port {port} was taken during restart"),
        }
    }

    pub(super) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}
