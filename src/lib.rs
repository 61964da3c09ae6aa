#![doc = include_str!("../docs/crate.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

#[cfg(feature = "actix")]
#[cfg_attr(docsrs, doc(cfg(feature = "actix")))]
pub mod actix;
pub mod algorithm;
pub mod breaker;
pub mod concurrency;
mod core;
mod decision;
mod deny_cache;
mod error;
mod future;
mod gate;
pub mod headers;
pub mod key;
mod keyspace;
mod layer;
mod limiter;
mod metrics;
mod per_thread;
pub mod quota;
mod random;
pub mod refund;
pub mod respond;
mod service;
pub mod skip;
pub mod store;
pub mod tier;

pub use crate::{
    algorithm::Algorithm,
    breaker::Breaker,
    concurrency::{ConcurrencyLimiter, InFlightLimitLayer},
    decision::{Decision, LimitDecision},
    error::{ConfigError, Error},
    future::ResponseFuture,
    gate::Gate,
    key::{Key, KeyError, KeyExtractor},
    keyspace::RAW_KEY_MAX,
    layer::{LimitLayer, RateLimitLayer},
    limiter::{DEFAULT_DENY_CACHE, DEFAULT_TIMEOUT, Limiter, LimiterBuilder},
    quota::{Quota, QuotaError},
    respond::{DefaultResponse, OnStoreError, Rejection, Respond},
    service::{LimitService, RateLimitService},
    store::{LimitCheck, LimitState, MemoryStore, RedisStore, Store},
    tier::Tiers,
};

/// The tower service, renamed [`RateLimitService`] so it does not clash with
/// `tower::limit::RateLimit`.
#[deprecated(note = "renamed `RateLimitService`")]
pub type RateLimit<S, K, R> = RateLimitService<S, K, R>;

/// The concurrency layer, renamed [`InFlightLimitLayer`] so it does not clash
/// with `tower::limit::ConcurrencyLimitLayer`.
#[deprecated(note = "renamed `InFlightLimitLayer`")]
pub type ConcurrencyLimitLayer<K, R = DefaultResponse> = InFlightLimitLayer<K, R>;

/// The README's code blocks, compiled as doc-tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
