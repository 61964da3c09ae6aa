//! Batching on a Redis Cluster: a round's requests grouped by the node that
//! holds their hash slot, from a slot map the batching task reads with
//! `CLUSTER SLOTS` (in the background every `ROUTER_AGE`, and before the next
//! round after a failed call, or in the background at once if it cannot be
//! read before that round's requests are due).
//!
//! A script call may only declare keys of one hash slot, so grouping by slot
//! alone sent about one request per call when clients spread over many
//! slots (100,000 keys over 16,384 slots). A node's fixed-window requests go
//! in one call instead: the first request's keys declared, the others
//! carried in `ARGV` (`lua/decide_fixed.lua`'s "A batch per node"); so do a
//! node's requests of one sliding-window or GCRA limit alike (the same
//! quota and cost: `lua/decide.lua`'s compact form). Any other request
//! (several limits of another algorithm, a cost of 0), and every request
//! while no slot map could be read, are still grouped by slot, with every
//! key declared.

use std::{collections::HashMap, time::Duration};

use redis::{
    Cmd, Value,
    cluster_async::ClusterConnection,
    cluster_routing::{RoutingInfo, SingleNodeRoutingInfo, Slot},
};

use super::{Batched, MAX_BATCH};
use crate::{
    Algorithm, Quota,
    store::{BoxFuture, LimitCheck},
};

/// Which node (by its place in `CLUSTER SLOTS`'s reply) holds each slot.
#[derive(Debug, Default)]
pub(in crate::store) struct SlotMap(HashMap<Slot, u16>);

/// A group of a round on a cluster.
#[derive(Debug, PartialEq)]
pub(in crate::store) enum Group {
    /// Fixed-window requests on one node: several slots in one call.
    Node(u16),
    /// Requests of one sliding-window or GCRA limit on one node, alike (this
    /// quota and cost): several slots in one call.
    Alike(u16, Quota, u64),
    /// Any other request: one slot per call.
    Slot(Slot),
}

impl Batched for ClusterConnection {
    type Group = Group;
    type Router = SlotMap;

    /// Calls of a round go to different nodes or slots at once: with one
    /// call a round, a burst of 1000 requests on 10 slots waited for 8
    /// rounds in turn, past the limiter's timeout.
    const ROUND: usize = 8 * MAX_BATCH;

    /// No rounds beyond the two: a round goes as one call per node (or
    /// per slot, for requests of several limits of another algorithm than
    /// the fixed window), so a round of
    /// 16 requests would be calls of a few each. On 3 masters (loopback)
    /// they took script calls from 0.24 to 0.29 a request, for no more
    /// requests a second.
    const FILLS: bool = false;

    /// A call to a node that does not answer (frozen, cut off) gives its
    /// round's permit back after this, and goes on awaiting its requests'
    /// deadlines: with the permit held until it ended, every round with a
    /// request for that node held the others' requests for as long, up to
    /// the limiter's timeout. So a round waits for a permit 50 ms at most
    /// (while rounds come no faster than two every 50 ms), and a node
    /// slower than that (frozen, say) can be sent two rounds' worth of
    /// requests (up to `ROUND` each) every 50 ms until their deadlines, or
    /// until the breaker of its keys opens.
    const DETACH: Option<Duration> = Some(Duration::from_millis(50));

    fn router(&self) -> BoxFuture<'static, SlotMap> {
        let mut conn = self.clone();
        Box::pin(async move {
            let mut cmd = Cmd::new();
            cmd.arg("CLUSTER").arg("SLOTS");
            let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
            match conn.route_command(cmd, routing).await {
                Ok(reply) => SlotMap::parse(&reply).unwrap_or_default(),
                // No map: every request grouped by its slot, as before.
                Err(_) => SlotMap::default(),
            }
        })
    }

    fn group(map: &SlotMap, checks: &[LimitCheck], cost: u64) -> Group {
        let key = checks.first().map_or("", |check| check.key.as_str());
        let slot = Slot::for_key(key);
        let fixed = (checks.iter()).all(|c| c.quota.algorithm() == Algorithm::FixedWindow);
        match (map.0.get(&slot), checks) {
            (Some(node), _) if fixed => Group::Node(*node),
            (Some(node), [check]) if cost > 0 => Group::Alike(*node, check.quota, cost),
            _ => Group::Slot(slot),
        }
    }

    fn spread(group: &Group) -> bool {
        matches!(group, Group::Node(_) | Group::Alike(..))
    }
}

impl SlotMap {
    /// `CLUSTER SLOTS`'s reply: per range, its first and last slot, then
    /// its master (host, port, ...) and replicas. `None` if it is not one.
    fn parse(reply: &Value) -> Option<SlotMap> {
        let Value::Array(ranges) = reply else {
            return None;
        };
        let mut nodes: Vec<String> = Vec::new();
        let mut map = HashMap::with_capacity(16_384);
        for range in ranges {
            let Value::Array(range) = range else {
                return None;
            };
            let (Some(Value::Int(first)), Some(Value::Int(last)), Some(Value::Array(master))) =
                (range.first(), range.get(1), range.get(2))
            else {
                return None;
            };
            let name = format!("{:?}", master.get(..2)?);
            let node = match nodes.iter().position(|n| *n == name) {
                Some(i) => i,
                None => {
                    nodes.push(name);
                    nodes.len() - 1
                }
            };
            let node = u16::try_from(node).ok()?;
            for slot in *first..=*last {
                map.insert(Slot::new(u16::try_from(slot).ok()?)?, node);
            }
        }
        Some(SlotMap(map))
    }
}
