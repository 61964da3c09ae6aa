//! [`InnerError`]: an inner service's `Err`, settled as the answer it
//! becomes.

use std::{cell::RefCell, fmt};

use actix_web::{HttpResponse, ResponseError, http::StatusCode, http::header::HeaderMap};

/// An error of the service inside the middleware, as the middleware passes
/// it on: still an `Err`, with the same status, body and text, and the
/// rate-limit headers on its response.
///
/// In actix-web an `Err` from the services inside a middleware (a
/// `wrap_fn`, actix-web-httpauth's 401, actix-cors's refusal) is what the
/// client gets, turned into a response by
/// [`ResponseError::error_response`]. The middleware settles it as that
/// response: it refunds the request if the response's status is one to
/// refund, and writes the `RateLimit` headers on it, as it does on a
/// response. It stays an `Err`, as actix-web's own middlewares (`Logger`,
/// `Compress`, `DefaultHeaders`, `ErrorHandlers`) pass errors on, so the
/// middlewares outside see what they saw without the rate limit, but for
/// its type: to downcast the error, go through [`cause`](Self::cause).
///
/// ```
/// use actix_web::{Error, error::InternalError};
/// use redis_ratelimit::actix::InnerError;
///
/// /// The inner service's error, through the rate limit's wrapping.
/// fn inner(e: &Error) -> &Error {
///     e.as_error::<InnerError>().map_or(e, InnerError::cause)
/// }
/// # let e = Error::from(actix_web::error::ErrorServiceUnavailable("down"));
/// # assert!(inner(&e).as_error::<InternalError<&str>>().is_some());
/// ```
pub struct InnerError {
    cause: actix_web::Error,
    /// The cause's response as settled, until actix-web takes it: some
    /// errors build their response once only (`InternalError::from_response`
    /// hands its response over at the first call, and a bare 500 after).
    settled: RefCell<Option<HttpResponse>>,
    /// Its status and headers, for the calls after that.
    status: StatusCode,
    headers: HeaderMap,
}

impl InnerError {
    /// `cause`, settled by `finish` on the response it becomes.
    pub(crate) fn new(cause: actix_web::Error, finish: impl FnOnce(&mut HttpResponse)) -> Self {
        let mut res = cause.error_response();
        finish(&mut res);
        Self {
            cause,
            status: res.status(),
            headers: res.headers().clone(),
            settled: RefCell::new(Some(res)),
        }
    }

    /// The inner service's error, as the middleware got it (under nested
    /// rate limits, the next one's `InnerError`).
    pub fn cause(&self) -> &actix_web::Error {
        &self.cause
    }
}

impl ResponseError for InnerError {
    /// The settled response's.
    fn status_code(&self) -> StatusCode {
        self.status
    }

    /// The settled response, the first time; after, the cause's response
    /// again, with the status and headers it was settled with.
    fn error_response(&self) -> HttpResponse {
        if let Some(res) = self.settled.borrow_mut().take() {
            return res;
        }
        let mut res = self.cause.error_response();
        *res.status_mut() = self.status;
        *res.headers_mut() = self.headers.clone();
        res
    }
}

/// The cause's text: logs read as they would without the rate limit.
impl fmt::Display for InnerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.cause, f)
    }
}

/// The cause's.
impl fmt::Debug for InnerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.cause, f)
    }
}
