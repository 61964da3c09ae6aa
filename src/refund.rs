//! Refunds by response: [`Refund`] says which responses give the request's
//! cost back, so that it is as if the request had not been counted.
//!
//! "Count only failed logins" refunds [`Successes`](Refund::Successes);
//! "don't charge for our own 5xx" refunds
//! [`ServerErrors`](Refund::ServerErrors). Set one with
//! [`RateLimitLayer::refund_when`](crate::RateLimitLayer::refund_when) (the
//! actix middleware has the same method).
//!
//! * A refunded response costs at most one extra store call
//!   ([`Limiter::refund`](crate::Limiter::refund)'s, on the keys and the
//!   limiter, the request's tier's, that decided the request): none when
//!   its units go back to a live local reservation, or when it spent
//!   nothing (a shadow limit's denial); other responses cost none.
//! * The response is not delayed: the refund runs as a task on the Tokio
//!   runtime (actix-web runs on Tokio too), but on the
//!   [`MemoryStore`](crate::MemoryStore), which refunds in process, at
//!   once, with no runtime needed. A refund that fails is logged
//!   (at most once a second), never turned into a response: the client was
//!   charged, and stays charged.
//! * Only what was spent is refunded: requests the middleware rejected, or
//!   let through unlimited when the store failed, or skipped, are never
//!   refunded; see [`Limiter::refund`](crate::Limiter::refund) for what a
//!   refund does per algorithm.
//! * The response's rate-limit headers are the decision's, before the
//!   refund.
//! * A gRPC response (`content-type: application/grpc...`) to a gRPC call
//!   (a `POST` whose `content-type` is gRPC's or gRPC-Web's; to any other
//!   request such a 200 says nothing of how it went, and it stays charged)
//!   is always HTTP 200; it is judged by its `grpc-status`, mapped to HTTP as
//!   `google.rpc.Code` maps it (3 `INVALID_ARGUMENT` is 400, 5 `NOT_FOUND`
//!   404, 13 `INTERNAL` 500, 14 `UNAVAILABLE` 503, ...), when that status
//!   is at its head (a trailers-only answer, as tonic answers a failed
//!   call). A `grpc-status` in the trailers (every served call) comes after
//!   the middleware has let the response go: such a call is refunded by its
//!   trailers only with a [`TrailersLayer`] outside the rate-limit layer
//!   (tonic: `Server::builder().layer(TrailersLayer::new()).layer(limit)`),
//!   and never without one, which a warning says once per layer. So
//!   [`Successes`](Refund::Successes) on gRPC needs that layer.
//! * A gRPC-Web response (`content-type: application/grpc-web...`) is
//!   judged by its `grpc-status` the same way, never by its 200. At its
//!   head, the layer reads it; gRPC-Web sends the trailers as the body's
//!   last frame, which a [`TrailersLayer`] outside reads as the body passes
//!   (binary and `-text` alike), as it reads a gRPC call's trailers; without
//!   one such calls are never refunded.
//!
//! ```
//! use redis_ratelimit::{Limiter, Quota, RateLimitLayer, key::PeerIp, refund::Refund};
//!
//! // A login route: 5 failed attempts per 15 minutes; successes are free.
//! let logins = RateLimitLayer::new(Limiter::new("5/15m".parse()?), PeerIp)
//!     .refund_when(Refund::Successes);
//! // Any rule over the status.
//! let api = RateLimitLayer::new(Limiter::new(Quota::per_second(10)), PeerIp)
//!     .refund_when(Refund::when(|s| s == http::StatusCode::SERVICE_UNAVAILABLE));
//! # let _ = (logins, api);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod deferred;
mod status;
mod trailers;
mod web;

use std::{fmt, str::FromStr, sync::Arc};

use http::StatusCode;
use smallvec::SmallVec;

use crate::{Decision, Error, Limiter, core::Throttle, key::Key};

#[cfg(feature = "actix")]
pub(crate) use self::status::grpc_call;
pub use self::trailers::{Trailers, TrailersBody, TrailersFuture, TrailersLayer};
pub(crate) use self::{
    deferred::{Deferred, Pending},
    status::{GRPC_STATUS, Outcome, RequestHead, ResponseHead, grpc_code, http_status_of_code},
};

/// Which responses give the request's cost back.
#[derive(Clone)]
#[non_exhaustive]
pub enum Refund {
    /// 5xx responses: don't charge clients for the server's own failures.
    ///
    /// Not the statuses that name the request as the cause, which a client
    /// can have at will: 501 `Not Implemented` (a method the server does
    /// not know) and 505 `HTTP Version Not Supported`; nor, for gRPC, 12
    /// `UNIMPLEMENTED` (a method the server does not have: tonic answers a
    /// call to any unknown path so) and 4 `DEADLINE_EXCEEDED` (the deadline
    /// is the client's own `grpc-timeout`). Were they refunded, a client
    /// could send such calls without end and never be limited.
    ///
    /// A server can answer other 5xx to what a client sent, too: tonic
    /// answers a message it cannot decode with 13 `INTERNAL`, and a call
    /// whose request stream the client reset with 13, 14 `UNAVAILABLE` or
    /// 2 `UNKNOWN`; a handler may answer 500 to input it did not expect.
    /// Each such call is refunded, at the cost of a second store call. So
    /// a client that only sends calls that fail so is not limited by this
    /// limit (the server does little for each). Where that matters, keep
    /// refunds off, or refund only [`Refund::when`] the status is one your
    /// service alone gives.
    ServerErrors,
    /// 4xx responses.
    ///
    /// Any client can have a 4xx at will: a 404 for a path that does not
    /// exist, a 405 for a method a route does not take, a 400 for a body
    /// it cannot parse. Each such request is refunded, at the cost of a
    /// second store call, so a client that sends only such requests is
    /// never limited by this limit. It suits a limit on work done (count
    /// only the requests served), not one against floods; for those,
    /// refund only [`Refund::when`] the status is one your handlers alone
    /// give.
    ClientErrors,
    /// 2xx responses: count only failures, such as failed logins.
    Successes,
    /// Responses whose status the function picks; see [`Refund::when`].
    When(Arc<dyn Fn(StatusCode) -> bool + Send + Sync>),
}

impl Refund {
    /// Refunds the responses whose status `f` picks.
    pub fn when<F>(f: F) -> Self
    where
        F: Fn(StatusCode) -> bool + Send + Sync + 'static,
    {
        Refund::When(Arc::new(f))
    }

    /// Whether a response with `status` is refunded.
    ///
    /// ```
    /// use http::StatusCode;
    /// use redis_ratelimit::refund::Refund;
    ///
    /// assert!(Refund::ServerErrors.applies(StatusCode::BAD_GATEWAY));
    /// assert!(!Refund::ServerErrors.applies(StatusCode::NOT_IMPLEMENTED));
    /// assert!(!Refund::ServerErrors.applies(StatusCode::TOO_MANY_REQUESTS));
    /// assert!(Refund::Successes.applies(StatusCode::NO_CONTENT));
    /// ```
    pub fn applies(&self, status: StatusCode) -> bool {
        match self {
            Refund::ServerErrors => {
                status.is_server_error()
                    && status != StatusCode::NOT_IMPLEMENTED
                    && status != StatusCode::HTTP_VERSION_NOT_SUPPORTED
            }
            Refund::ClientErrors => status.is_client_error(),
            Refund::Successes => status.is_success(),
            Refund::When(f) => f(status),
        }
    }
}

impl Refund {
    /// Whether a gRPC call that ended with `code` ([`grpc_code`]: `None`
    /// for a value that is none, read as 2 `UNKNOWN`) is refunded: as
    /// [`applies`](Self::applies) says of its HTTP status
    /// ([`http_status_of_code`]), but for
    /// [`ServerErrors`](Refund::ServerErrors), never 4 `DEADLINE_EXCEEDED`,
    /// whose deadline the client set.
    pub(crate) fn applies_to_grpc(&self, code: Option<u8>) -> bool {
        if matches!(self, Refund::ServerErrors) && code == Some(4) {
            return false;
        }
        self.applies(http_status_of_code(code))
    }
}

impl fmt::Debug for Refund {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refund::ServerErrors => f.write_str("ServerErrors"),
            Refund::ClientErrors => f.write_str("ClientErrors"),
            Refund::Successes => f.write_str("Successes"),
            Refund::When(_) => f.write_str("When(..)"),
        }
    }
}

/// A name that is not `server-errors`, `client-errors` or `successes`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown refund preset {0:?}: use `server-errors`, `client-errors` or `successes`")]
pub struct UnknownPreset(String);

impl FromStr for Refund {
    type Err = UnknownPreset;

    /// `server-errors`, `client-errors` or `successes` (ASCII case
    /// ignored).
    ///
    /// ```
    /// use redis_ratelimit::refund::Refund;
    ///
    /// let refund: Refund = "server-errors".parse().unwrap();
    /// assert!(matches!(refund, Refund::ServerErrors));
    /// assert!("5xx".parse::<Refund>().is_err());
    /// ```
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "server-errors" => Ok(Refund::ServerErrors),
            "client-errors" => Ok(Refund::ClientErrors),
            "successes" => Ok(Refund::Successes),
            _ => Err(UnknownPreset(s.to_owned())),
        }
    }
}

/// What a passed request spent, kept (only when refunds are on) until its
/// response says whether to give it back.
#[derive(Debug)]
pub(crate) struct Charged {
    limiter: Limiter,
    keys: SmallVec<[Key; 1]>,
    /// The request may be a gRPC call ([`status::grpc_call`]): only then is its
    /// response judged by its `grpc-status`.
    grpc: bool,
}

impl Charged {
    pub(crate) fn new(limiter: &Limiter, keys: SmallVec<[Key; 1]>, grpc: bool) -> Self {
        Self {
            limiter: limiter.clone(),
            keys,
            grpc,
        }
    }

    /// Whether the request may be a gRPC call ([`status::grpc_call`]).
    pub(crate) fn may_be_grpc(&self) -> bool {
        self.grpc
    }

    /// Gives `decision`'s cost back: in place on the memory store (no
    /// runtime needed), or else in a task of its own on the current Tokio
    /// runtime.
    pub(crate) fn refund(self, decision: &Decision) {
        let keys: SmallVec<[&[u8]; 1]> = self.keys.iter().map(Key::as_bytes).collect();
        let call = match self.limiter.refund_in_place(&keys, decision) {
            Ok(Some(call)) => call,
            Ok(None) => return,
            Err(e) => return failed(&e),
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if let Err(e) = call.await {
                        failed(&e);
                    }
                });
            }
            Err(_) => failed(&Error::UnexpectedReply(
                "no Tokio runtime to run the refund on".into(),
            )),
        }
    }
}

/// Logs a failed refund, at most once a second (with how many were not).
fn failed(e: &Error) {
    static THROTTLE: Throttle = Throttle::new();
    if let Some(unlogged) = THROTTLE.admit() {
        tracing::warn!(error = %e, unlogged, "rate limit: refund failed; the request stays charged");
    }
}
