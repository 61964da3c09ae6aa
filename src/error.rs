//! Errors: [`Error`] from a check at run time, [`ConfigError`] at build time.

use std::time::Duration;

use crate::QuotaError;

/// Why a check could not be decided.
///
/// The tower layer answers these by its
/// [`OnStoreError`](crate::OnStoreError) policy;
/// business code calling [`Limiter::check`](crate::Limiter::check) sees them
/// directly.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Redis answered with an error, or the connection failed. Also what
    /// a [`MemoryStore`](crate::MemoryStore) lease call returns for the
    /// arguments the Redis store's script refuses (see
    /// [`LeaseStore`](crate::store::LeaseStore)).
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The bb8 pool could not hand out a connection in time.
    #[error("redis pool: {0}")]
    Pool(String),
    /// The store did not answer within the limiter's timeout. A Redis call
    /// that timed out may still have been applied; for a rate limit that only
    /// means the client may have been charged for a request it did not make.
    #[error("rate limit store did not answer within {0:?}")]
    Timeout(Duration),
    /// The circuit breaker is open after repeated store failures: the store
    /// was not called. See [`Breaker`](crate::Breaker).
    #[error("rate limit store failing: circuit breaker open, store not called")]
    CircuitOpen,
    /// The store failed its startup check
    /// ([`RedisStore::self_test`](crate::RedisStore::self_test)): Redis is
    /// unreachable, refused the password, failed the TLS handshake, named no
    /// master (Sentinel), or cannot run the limiter's scripts. The message
    /// names the cause.
    #[error("rate limit store failed its startup check: {0}")]
    Startup(String),
    /// The store's reply was not what the script returns.
    #[error("unexpected reply from the rate limit store: {0}")]
    UnexpectedReply(String),
    /// [`Limiter::check_each`](crate::Limiter::check_each) got neither one
    /// key nor one key per limit.
    #[error("{got} keys given for {limits} limits: pass one key, or one per limit")]
    KeyCount {
        /// The limiter's number of limits.
        limits: usize,
        /// The number of keys given.
        got: usize,
    },
    /// The request's cost is larger than the whole quota, so it could never
    /// be admitted, however long the client waited. Nothing was consumed.
    #[error("cost {cost} exceeds the quota's limit of {limit}; it can never be admitted")]
    CostExceedsLimit {
        /// The cost asked for.
        cost: u64,
        /// The quota's limit.
        limit: u64,
    },
    /// The store does not implement this operation (a custom
    /// [`Store`](crate::Store) written before it was added).
    #[error("the rate limit store does not support {0}")]
    Unsupported(&'static str),
    /// [`Limiter::refund`](crate::Limiter::refund) was given a decision made
    /// by another limiter. Nothing was refunded.
    #[error("the decision was made by another limiter")]
    ForeignDecision,
}

/// A configuration mistake, reported when the limiter or store is built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The quota was invalid.
    #[error(transparent)]
    Quota(#[from] QuotaError),
    /// Another live limiter on the same store instance already counts under
    /// these store keys (prefix, algorithm and name; see
    /// [`LimiterBuilder::name`](crate::LimiterBuilder::name)), or another
    /// live concurrency limiter holds its slots there (prefix and name; see
    /// [`ConcurrencyLimiterBuilder::name`](crate::concurrency::ConcurrencyLimiterBuilder::name)).
    #[error(
        "another live limiter on this store already counts under {0:?}: give this limit its own `.name(..)`, clone the existing limiter to share its counters, or opt in with `.share_counters()`"
    )]
    SharedCounters(String),
    /// A prefix or policy name used characters that do not belong in a Redis
    /// key or a header.
    #[error("invalid {what} {value:?}: use 1 to 64 ASCII letters, digits or -._~:@/+=")]
    InvalidName {
        /// What was being named (`"prefix"` or `"name"`).
        what: &'static str,
        /// The rejected value.
        value: String,
    },
    /// A shadow limit named no limit of the limiter.
    #[error("shadow_limit({0:?}) names no limit of this limiter")]
    UnknownLimit(String),
    /// Two limits of one limiter had the same name, or the same counter:
    /// an explicit name that spells an unnamed first limit's
    /// (`default.5-60000` beside an unnamed `5/1m`).
    #[error("limit name {0:?} is used twice; give every limit of a limiter its own name")]
    DuplicateName(String),
    /// A trusted proxy given to
    /// [`ClientIp::trust`](crate::key::ClientIp::trust) was neither an IP
    /// address nor a CIDR range.
    #[error(
        "trusted proxy {value:?} is neither an IP address nor a CIDR range; \
         use addresses or ranges such as 10.0.0.0/8, 192.168.1.7 or 2001:db8::/32"
    )]
    InvalidTrustedProxy {
        /// The rejected entry.
        value: String,
    },
    /// A network given to [`skip::Networks`](crate::skip::Networks) was
    /// neither an IP address nor a CIDR range.
    #[error(
        "network {value:?} is neither an IP address nor a CIDR range; \
         use addresses or ranges such as 127.0.0.0/8, ::1 or 10.1.2.3"
    )]
    InvalidNetwork {
        /// The rejected entry.
        value: String,
    },
    /// The store timeout was zero.
    #[error("store timeout must be above zero (it bounds every Redis call); try 200ms")]
    ZeroTimeout,
    /// The store timeout was 10 s or more: a refund or reset resent that
    /// late would take effect twice (see
    /// [`LimiterBuilder::timeout`](crate::LimiterBuilder::timeout)).
    #[error(
        "store timeout {0:?} is 10 s or more: a refund or reset sent again that late \
         would take effect twice; keep it under 10 s (try 200ms)"
    )]
    TimeoutTooLong(std::time::Duration),
    /// [`local_reservation`](crate::LimiterBuilder::local_reservation) was
    /// asked of a limiter it cannot serve exactly: a limit that is not a
    /// fixed window, several limits, or a store without
    /// [`Store::reserve`](crate::Store::reserve). The message says which.
    #[error("local_reservation: {0}")]
    Reservation(&'static str),
    /// A concurrency limit was 0 or above [`MAX_LIMIT`](crate::quota::MAX_LIMIT).
    #[error(
        "concurrency limit {0} is out of range: allow at least 1 request in flight (and at most 2^50)"
    )]
    ConcurrencyLimit(u64),
    /// A concurrency lease was shorter than three store timeouts, or longer
    /// than 366 days.
    #[error(
        "concurrency lease {lease:?} is out of range: use at least {min:?} (three store \
         timeouts, so a renewal sent a third into the lease lands before it ends) and at most 366 days"
    )]
    LeaseOutOfRange {
        /// The lease asked for.
        lease: Duration,
        /// The shortest lease the timeout allows.
        min: Duration,
    },
}

impl Error {
    /// A copy of a batch's error for each request in it.
    pub(crate) fn clone_for_batch(&self) -> Self {
        match self {
            Error::Redis(e) => Error::Redis(e.clone()),
            Error::Pool(s) => Error::Pool(s.clone()),
            Error::Timeout(d) => Error::Timeout(*d),
            Error::UnexpectedReply(s) => Error::UnexpectedReply(s.clone()),
            other => Error::UnexpectedReply(other.to_string()),
        }
    }
}
