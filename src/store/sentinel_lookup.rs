//! The lookups of the master for [`Sentinel`]: one at a time, each in a task
//! of its own, so that it ends, and installs the connection it made, even
//! when every call that waited for it has given up (each at its limiter's
//! timeout, which can be shorter than a lookup).
//!
//! A lookup asks the sentinels which master they name (redis-rs's
//! `async_get_client`, which asks them together but reads their answers in
//! the configured order, so a sentinel listed first that does not answer
//! holds a lookup 0.5 to 1.5 s: see the parent module), and checks that
//! master's `ROLE` on a connection of its own. Unless the connection in use
//! is to that address already, it then connects to it (within 1 s) and
//! installs the connection, numbered one more than the last. A lookup
//! starts when a call finds no connection or a broken one
//! ([`Sentinel::replace`]: such calls wait for it), or when a call on the
//! master went unanswered or was refused with `NOREPLICAS`
//! ([`Sentinel::suspect`]: calls go on using the connection in use
//! meanwhile).

use std::time::{Duration, Instant};

use redis::{
    AsyncConnectionConfig, ConnectionAddr, ErrorKind, RedisError, RedisResult,
    aio::MultiplexedConnection,
};
use tokio::runtime::Handle;

use super::{Master, Sentinel};

/// How long a failed lookup's error stands: calls that need a connection in
/// the meantime fail at once with it, rather than start another lookup.
const RETRY: Duration = Duration::from_millis(100);

/// The least time between the starts of two lookups for suspect calls
/// (stalled, or refused with `NOREPLICAS`).
const CHECK_EVERY: Duration = Duration::from_millis(500);

/// The most that [`CHECK_EVERY`] grows to for calls refused with
/// `NOREPLICAS`, doubling each time a lookup for them finds the master in
/// use: a master that is only short of replicas (one down for maintenance)
/// refuses writes for as long as that lasts, and a lookup every 500 ms
/// from every instance of a service (each a connection to the master, for
/// its `ROLE`) would be a steady load for nothing.
const REFUSED_CHECK_MAX: Duration = Duration::from_secs(4);

/// Why a call has the sentinels asked whether the master changed
/// ([`Sentinel::suspect`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Suspicion {
    /// Dropped unanswered after waiting [`STALLED`](super::STALLED).
    Stalled,
    /// Refused with `NOREPLICAS`.
    NoReplicas,
}

/// The connection in use and the lookups' state.
#[derive(Default)]
pub(super) struct State {
    current: Option<Current>,
    /// The last connection's number.
    generation: u64,
    /// Whether a lookup runs now.
    running: bool,
    /// The last lookup's error, if it failed.
    failed: Option<(Instant, RedisError)>,
    /// When the last lookup for suspect calls started.
    checked: Option<Instant>,
    /// The least time from it to a lookup for a call refused with
    /// `NOREPLICAS` (zero: [`CHECK_EVERY`]; see [`REFUSED_CHECK_MAX`]).
    refused_gap: Duration,
}

/// The connection in use.
struct Current {
    master: Master,
    /// The address it is connected to: a lookup that finds the sentinels
    /// naming this one keeps the connection.
    addr: ConnectionAddr,
}

impl State {
    /// The connection in use, if any.
    pub(super) fn master(&self) -> Option<Master> {
        self.current.as_ref().map(|current| current.master.clone())
    }
}

/// What a lookup found.
enum Found {
    /// The master the connection in use is to.
    Same,
    /// Another master, and a connection to it.
    New(MultiplexedConnection, ConnectionAddr),
}

impl Sentinel {
    /// Drops the connection numbered `broken` if it is still the one in use,
    /// and returns the connection in use, once there is one: if there is
    /// none, waits for the lookup running, or starts one, unless the last
    /// one failed less than [`RETRY`] ago (its error, then). The caller may
    /// drop this future at any time: the lookup goes on in its task.
    pub(super) async fn replace(&self, mut broken: Option<u64>) -> RedisResult<Master> {
        loop {
            let mut start = None;
            let mut ended = {
                let mut state = self.state();
                match &state.current {
                    Some(current) if Some(current.master.generation) == broken => {
                        state.current = None;
                    }
                    Some(current) => return Ok(current.master.clone()),
                    None => {}
                }
                if !state.running {
                    if let Some((at, e)) = &state.failed
                        && at.elapsed() < RETRY
                    {
                        return Err(e.clone());
                    }
                    let runtime = Handle::try_current().map_err(|_| {
                        RedisError::from((
                            ErrorKind::Client,
                            "no Tokio runtime to ask the sentinels on",
                        ))
                    })?;
                    start = Some((self.running(&mut state, None), runtime));
                }
                // Taken while the lookup runs: it cannot end unseen.
                self.shared.ended.subscribe()
            };
            // Spawned once the state is free: the lookup's end takes it.
            if let Some((lookup, runtime)) = start {
                runtime.spawn(lookup.run());
            }
            // The sender lives as long as `self`.
            let _ = ended.changed().await;
            let state = self.state();
            if let Some(current) = &state.current {
                return Ok(current.master.clone());
            }
            if let Some((_, e)) = &state.failed {
                return Err(e.clone());
            }
            // Dropped again since: another lookup.
            broken = None;
        }
    }

    /// A call on the connection numbered `generation` says the master may
    /// have been replaced while it stays reachable: the call was dropped
    /// before its reply came, after waiting [`STALLED`](super::STALLED) or
    /// more (the master may be frozen), or the master refused it with
    /// `NOREPLICAS` (it may be cut off from its replicas and sentinels).
    /// Starts a lookup, unless one runs, that connection is no longer in
    /// use, or the last such lookup started less than [`CHECK_EVERY`] ago
    /// (for `NOREPLICAS`, up to [`REFUSED_CHECK_MAX`] ago, once lookups
    /// for it found the same master). Cheap, and never waits: it runs in
    /// the drop of the call's future, or as the refused call returns.
    pub(super) fn suspect(&self, generation: u64, suspicion: Suspicion) {
        let Ok(runtime) = Handle::try_current() else {
            return;
        };
        let lookup = {
            let mut state = self.state();
            let in_use = state
                .current
                .as_ref()
                .is_some_and(|current| current.master.generation == generation);
            let gap = match suspicion {
                Suspicion::Stalled => CHECK_EVERY,
                Suspicion::NoReplicas => state.refused_gap.max(CHECK_EVERY),
            };
            if !in_use || state.running || state.checked.is_some_and(|at| at.elapsed() < gap) {
                return;
            }
            state.checked = Some(Instant::now());
            self.running(&mut state, Some(suspicion))
        };
        let why = match suspicion {
            Suspicion::Stalled => "a call went unanswered",
            Suspicion::NoReplicas => "the master cannot reach its replicas (NOREPLICAS)",
        };
        tracing::debug!(master = %self.shared.name, "{why}: asking the sentinels whether the master changed");
        runtime.spawn(lookup.run());
    }

    /// Marks a lookup as running (`state` says none does), for a suspect
    /// call if `suspicion` says why: the caller spawns it once it no longer
    /// holds the state.
    fn running(&self, state: &mut State, suspicion: Option<Suspicion>) -> Running {
        state.running = true;
        Running {
            sentinel: self.clone(),
            outcome: None,
            refused: suspicion == Some(Suspicion::NoReplicas),
        }
    }

    /// Asks the sentinels for the master, and connects to it unless the
    /// connection in use is to it.
    async fn look_up(&self) -> RedisResult<Found> {
        let client = {
            let mut sentinels = self.shared.client.lock().await;
            sentinels.async_get_client().await?
        };
        let client = super::super::tcp::tuned_client(&client)?;
        let addr = client.get_connection_info().addr().clone();
        let same = self
            .state()
            .current
            .as_ref()
            .is_some_and(|current| current.addr == addr);
        if same {
            return Ok(Found::Same);
        }
        // As the ConnectionManager's: the limiter's timeout bounds calls.
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(1)))
            .set_response_timeout(None);
        let conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        Ok(Found::New(conn, addr))
    }
}

/// The lookup running. Its drop, however it ends (done, a panic, or its
/// task dropped with the runtime), records its outcome, lets the next
/// lookup start and wakes the calls that wait for it.
struct Running {
    sentinel: Sentinel,
    outcome: Option<RedisResult<Found>>,
    /// It was started for a call refused with `NOREPLICAS`.
    refused: bool,
}

impl Running {
    async fn run(mut self) {
        self.outcome = Some(self.sentinel.look_up().await);
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let sentinel = &self.sentinel;
        let name = &sentinel.shared.name;
        {
            let mut state = sentinel.state();
            state.running = false;
            match self.outcome.take() {
                Some(Ok(Found::Same)) => {
                    state.failed = None;
                    if self.refused {
                        let gap = state.refused_gap.max(CHECK_EVERY) * 2;
                        state.refused_gap = gap.min(REFUSED_CHECK_MAX);
                    }
                }
                Some(Ok(Found::New(conn, addr))) => {
                    if state.current.is_some() {
                        tracing::warn!(master = %name, %addr, "the sentinels name another master: moving to it");
                    } else {
                        tracing::info!(master = %name, %addr, "connected to the master the sentinels name");
                    }
                    state.generation += 1;
                    state.failed = None;
                    state.refused_gap = CHECK_EVERY;
                    let master = Master {
                        conn,
                        generation: state.generation,
                    };
                    state.current = Some(Current { master, addr });
                }
                Some(Err(e)) => state.failed = Some((Instant::now(), e)),
                None => {
                    let e = (ErrorKind::Client, "the lookup of the master did not finish");
                    state.failed = Some((Instant::now(), e.into()));
                }
            }
        }
        sentinel
            .shared
            .ended
            .send_modify(|ended| *ended = ended.wrapping_add(1));
    }
}
