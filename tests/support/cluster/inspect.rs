//! Looking into a [`RedisCluster`]: who owns a slot, which nodes are
//! masters, keys and TTLs per master, loaded scripts; and moving a slot.

use std::{collections::BTreeMap, time::Duration};

use super::RedisCluster;

/// A line of `CLUSTER NODES`.
#[derive(Debug)]
struct NodeEntry {
    port: u16,
    flags: String,
    slots: Vec<std::ops::RangeInclusive<u16>>,
}

impl NodeEntry {
    /// `<id> <ip:port@bus-port> <flags> <master> <ping> <pong> <epoch> <link> <slots>...`
    fn parse(line: &str) -> Option<Self> {
        let fields: Vec<&str> = line.split(' ').collect();
        let port = fields
            .get(1)?
            .split(['@', ','])
            .next()?
            .rsplit(':')
            .next()?;
        let range = |r: &str| match r.split_once('-') {
            Some((lo, hi)) => Some(lo.parse().ok()?..=hi.parse().ok()?),
            None => r.parse().ok().map(|s| s..=s),
        };
        Some(Self {
            port: port.parse().ok()?,
            flags: fields.get(2)?.to_string(),
            // Skips migration entries such as `[42->-<id>]`.
            slots: fields.iter().skip(8).filter_map(|r| range(r)).collect(),
        })
    }
}

impl RedisCluster {
    /// `CLUSTER NODES` as seen by a live node: every node's port, flags and
    /// slot ranges.
    fn cluster_nodes(&self) -> Vec<NodeEntry> {
        let port = self.live_ports().next().expect("a live node");
        let text: String = self.query(port, redis::cmd("CLUSTER").arg("NODES"));
        text.lines().filter_map(NodeEntry::parse).collect()
    }

    /// The ports of the live masters (a failed master is not one).
    pub fn masters(&self) -> Vec<u16> {
        let live: Vec<u16> = self.live_ports().collect();
        let nodes = self.cluster_nodes().into_iter();
        nodes
            .filter(|n| n.flags.contains("master") && live.contains(&n.port))
            .filter(|n| !n.flags.contains("fail"))
            .map(|n| n.port)
            .collect()
    }

    /// The ports of the live replicas.
    pub fn replicas(&self) -> Vec<u16> {
        let live: Vec<u16> = self.live_ports().collect();
        let nodes = self.cluster_nodes().into_iter();
        nodes
            .filter(|n| n.flags.contains("slave") && live.contains(&n.port))
            .map(|n| n.port)
            .collect()
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`).
    pub fn slot_of(&self, key: &str) -> u16 {
        let port = self.live_ports().next().expect("a live node");
        self.query(port, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))
    }

    /// The port of the master that owns `key`'s slot, as `CLUSTER NODES` on
    /// a live node reports it.
    pub fn master_of(&self, key: &str) -> u16 {
        let slot = self.slot_of(key);
        let nodes = self.cluster_nodes();
        let owner = nodes
            .iter()
            .find(|n| n.slots.iter().any(|r| r.contains(&slot)));
        owner
            .unwrap_or_else(|| panic!("no owner for slot {slot}\n{nodes:?}"))
            .port
    }

    /// The slot ranges the node on `port` owns, as `CLUSTER NODES` on a
    /// live node reports them.
    pub fn slots_of(&self, port: u16) -> Vec<std::ops::RangeInclusive<u16>> {
        let nodes = self.cluster_nodes().into_iter();
        nodes
            .filter(|n| n.port == port)
            .flat_map(|n| n.slots)
            .collect()
    }

    /// The node ID of the node on `port`.
    pub fn node_id(&self, port: u16) -> String {
        self.query(port, redis::cmd("CLUSTER").arg("MYID"))
    }

    /// Starts moving `slot` from the master on `from` to the one on `to`, and
    /// moves its keys: `from` now answers `ASK` for them, `to` serves them
    /// after `ASKING`.
    pub fn migrate_slot(&self, slot: u16, from: u16, to: u16) {
        let setslot = |port: u16, state: &str, id: &str| {
            let cmd = redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg(state)
                .arg(id)
                .clone();
            let () = self.query(port, &cmd);
        };
        setslot(to, "IMPORTING", &self.node_id(from));
        setslot(from, "MIGRATING", &self.node_id(to));
        let getkeys = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(1000)
            .clone();
        let keys: Vec<String> = self.query(from, &getkeys);
        if !keys.is_empty() {
            let mut migrate = redis::cmd("MIGRATE");
            migrate
                .arg("127.0.0.1")
                .arg(to)
                .arg("")
                .arg(0)
                .arg(5000)
                .arg("KEYS")
                .arg(keys);
            let () = self.query(from, &migrate);
        }
    }

    /// Ends a [`migrate_slot`](Self::migrate_slot): every master now says
    /// the master on `to` owns `slot`, and `from` answers `MOVED`.
    pub fn finish_migration(&self, slot: u16, to: u16) {
        let id = self.node_id(to);
        for port in self.masters() {
            let cmd = redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("NODE")
                .arg(&id)
                .clone();
            let () = self.query(port, &cmd);
        }
    }

    /// Makes the node on `port` announce `announced` as its client port
    /// (`cluster-announce-port`; its bus port stays `port + 10000`), and
    /// waits until every node's `CLUSTER NODES` says so: a cluster client
    /// that follows the cluster's map (every one) then reaches the node at
    /// `announced` only, a proxy's port say. The helpers that read the map
    /// by a node's own port (`masters`, `master_of`...) no longer find it.
    pub fn announce(&self, port: u16, announced: u16) {
        let set = |name: &str, value: u16| {
            let cmd = redis::cmd("CONFIG").arg("SET").arg(name).arg(value).clone();
            let () = self.query(port, &cmd);
        };
        set("cluster-announce-bus-port", port + 10_000);
        set("cluster-announce-port", announced);
        let entry = format!(":{announced}@{}", port + 10_000);
        self.wait_until(Duration::from_secs(20), "the announced port", |c| {
            c.live_ports().all(|p| {
                let nodes: String = c.query(p, redis::cmd("CLUSTER").arg("NODES"));
                nodes.contains(&entry)
            })
        });
    }

    /// Waits until every replica has every write its master sent it.
    pub fn wait_replicated(&self) {
        self.wait_until(Duration::from_secs(10), "replication", |c| {
            c.replicas().into_iter().all(|port| {
                let info: String = c.query(port, redis::cmd("INFO").arg("replication"));
                let field = |name: &str| {
                    let line = info.lines().find(|l| l.starts_with(name));
                    line.and_then(|l| l.split(':').nth(1)).map(str::to_owned)
                };
                let Some(master) = field("master_port") else {
                    return false;
                };
                let master: String = c.query(
                    master.parse().unwrap(),
                    redis::cmd("INFO").arg("replication"),
                );
                let offset = field("slave_repl_offset");
                offset.is_some_and(|o| master.contains(&format!("master_repl_offset:{o}\r\n")))
            })
        });
    }

    /// `SCRIPT FLUSH` on every live node.
    pub fn flush_scripts(&self) {
        for port in self.live_ports() {
            let () = self.query(port, redis::cmd("SCRIPT").arg("FLUSH"));
        }
    }

    /// Whether the node on `port` has the script with SHA-1 `sha` loaded.
    pub fn has_script(&self, port: u16, sha: &str) -> bool {
        let found: Vec<bool> = self.query(port, redis::cmd("SCRIPT").arg("EXISTS").arg(sha));
        found == [true]
    }

    /// Every key of every live master, with its PTTL (`-1`: no TTL).
    pub fn keys_with_ttl(&self) -> BTreeMap<u16, Vec<(String, i64)>> {
        let mut out = BTreeMap::new();
        for port in self.masters() {
            let keys: Vec<String> = self.query(port, redis::cmd("KEYS").arg("*"));
            let ttls = keys.into_iter().map(|key| {
                let ttl = self.query(port, redis::cmd("PTTL").arg(&key));
                (key, ttl)
            });
            out.insert(port, ttls.collect());
        }
        out
    }

    /// The number of keys on each live master.
    pub fn keys_per_master(&self) -> BTreeMap<u16, usize> {
        let masters = self.masters().into_iter();
        masters
            .map(|p| (p, self.query(p, &redis::cmd("DBSIZE"))))
            .collect()
    }

    /// Panics, with the logs, if any key on any master has no TTL.
    pub fn assert_every_key_has_ttl(&self) {
        for (port, keys) in self.keys_with_ttl() {
            for (key, ttl) in keys {
                assert!(ttl != -1, "key {key} on {port} has no TTL\n{}", self.log());
            }
        }
    }
}
