//! The HTTP side of the harness: a client ([`Caller`]) and what it gets back
//! ([`Reply`]), shared by the tower and actix tests.

use std::{net::IpAddr, time::Duration};

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};

/// The headers the rate limiter writes: what parity compares.
pub const RATE_LIMIT_HEADERS: [&str; 6] = [
    "ratelimit",
    "ratelimit-policy",
    "retry-after",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
];

/// A finished HTTP exchange.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    /// A header holding a plain integer, such as `retry-after`.
    pub fn int(&self, name: &str) -> u64 {
        let v = self.header(name);
        v.and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} is not an integer: {v:?} in {self:?}"))
    }

    /// A parameter of `RateLimit: "default";r=4;t=10`: `r` or `t`.
    pub fn ratelimit(&self, key: &str) -> u64 {
        let v = self.header("ratelimit");
        let v = v.unwrap_or_else(|| panic!("no ratelimit header: {self:?}"));
        v.split(';')
            .skip(1)
            .find_map(|p| p.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
            .unwrap_or_else(|| panic!("no integer {key}= in ratelimit: {v:?}"))
    }

    /// The body as JSON, asserting that it is `application/problem+json`.
    pub fn problem(&self) -> serde_json::Value {
        self.json_as("application/problem+json")
    }

    /// The body as JSON, asserting its `content-type`.
    pub fn json_as(&self, content_type: &str) -> serde_json::Value {
        let ct = self.header("content-type");
        assert_eq!(ct, Some(content_type), "{self:?}");
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {self:?}"))
    }

    /// Asserts a `text/plain` body.
    pub fn expect_text(&self, body: &str) {
        let ct = self.header("content-type");
        assert_eq!(ct, Some("text/plain; charset=utf-8"), "{self:?}");
        assert_eq!(self.body, body, "{self:?}");
    }

    /// The `pk` byte sequence of `RateLimit`, if it has one.
    pub fn pk(&self) -> Option<Vec<u8>> {
        let v = self
            .header("ratelimit")
            .unwrap_or_else(|| panic!("no ratelimit: {self:?}"));
        let list = sfv::Parser::new(v).parse::<sfv::List>().unwrap();
        let Some(sfv::ListEntry::Item(item)) = list.first() else {
            panic!("{v:?}")
        };
        let pk = item.params.get("pk")?;
        Some(
            pk.as_byte_sequence()
                .expect("pk is a byte sequence")
                .to_vec(),
        )
    }

    pub fn has_ratelimit_headers(&self) -> bool {
        ["ratelimit", "ratelimit-policy", "retry-after"]
            .iter()
            .any(|h| self.headers.contains_key(*h))
    }

    /// Every value of every rate-limit header, in a fixed order.
    pub fn rate_limit_headers(&self) -> Vec<(&'static str, Vec<String>)> {
        RATE_LIMIT_HEADERS
            .iter()
            .map(|&name| {
                let values = self.headers.get_all(name).iter();
                (
                    name,
                    values.map(|v| v.to_str().unwrap().to_owned()).collect(),
                )
            })
            .collect()
    }

    /// Asserts the status, showing the Redis `log` if it is wrong.
    pub fn expect(self, status: u16, log: &str) -> Self {
        assert_eq!(self.status.as_u16(), status, "{self:?}\n{log}");
        self
    }
}

/// Who sends requests: a client (which fixes the source IP) and an API key.
#[derive(Clone)]
pub struct Caller {
    client: Client<HttpConnector, Empty<Bytes>>,
    api_key: Option<&'static str>,
    accept: Option<&'static str>,
}

impl Caller {
    pub fn with_key(api_key: Option<&'static str>) -> Self {
        let client = Client::builder(TokioExecutor::new()).build_http();
        let accept = None;
        Self {
            client,
            api_key,
            accept,
        }
    }

    /// The same caller, sending `Accept: accept`.
    pub fn accepting(mut self, accept: &'static str) -> Self {
        self.accept = Some(accept);
        self
    }

    /// A caller whose requests come from `ip` (on Linux any 127.0.0.0/8
    /// address reaches 127.0.0.1), each on a new connection, so a new port.
    pub fn from_ip(ip: [u8; 4]) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_local_address(Some(IpAddr::from(ip)));
        let mut builder = Client::builder(TokioExecutor::new());
        let client = builder.pool_max_idle_per_host(0).build(connector);
        let (api_key, accept) = (None, None);
        Self {
            client,
            api_key,
            accept,
        }
    }

    /// The HTTP client, for requests with headers of their own.
    pub fn client(&self) -> Client<HttpConnector, Empty<Bytes>> {
        self.client.clone()
    }

    pub async fn get(&self, url: &str) -> Reply {
        let mut headers = Vec::new();
        headers.extend(self.api_key.map(|k| ("x-api-key", k)));
        headers.extend(self.accept.map(|a| ("accept", a)));
        get_with(&self.client, url, &headers).await
    }

    /// `n` requests, one after another.
    pub async fn get_n(&self, url: &str, n: usize) -> Vec<Reply> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(self.get(url).await);
        }
        out
    }

    pub async fn statuses(&self, url: &str, n: usize) -> Vec<u16> {
        let replies = self.get_n(url, n).await;
        replies.iter().map(|r| r.status.as_u16()).collect()
    }
}

/// `GET url` with `client`, and an `x-api-key` header if given; fails the
/// test after 30 s.
#[allow(dead_code)]
pub async fn get(
    client: &Client<HttpConnector, Empty<Bytes>>,
    url: &str,
    api_key: Option<&str>,
) -> Reply {
    let headers: Vec<_> = api_key.map(|k| ("x-api-key", k)).into_iter().collect();
    get_with(client, url, &headers).await
}

/// `GET url` from the local address `ip` (a peer such as a proxy), with
/// `X-Forwarded-For: xff`.
pub async fn get_forwarded(ip: [u8; 4], url: &str, xff: &str) -> Reply {
    let client = Caller::from_ip(ip).client();
    get_with(&client, url, &[("x-forwarded-for", xff)]).await
}

/// `GET url` with `client` and `headers`; fails the test after 30 s.
pub async fn get_with(
    client: &Client<HttpConnector, Empty<Bytes>>,
    url: &str,
    headers: &[(&str, &str)],
) -> Reply {
    let mut req = Request::get(url);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let req = req.body(Empty::new()).unwrap();
    let exchange = async {
        let res = client.request(req).await.expect("HTTP request");
        let (parts, body) = res.into_parts();
        let body = body.collect().await.expect("response body").to_bytes();
        let body = String::from_utf8(body.to_vec()).unwrap();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    };
    tokio::time::timeout(Duration::from_secs(30), exchange)
        .await
        .unwrap_or_else(|_| panic!("GET {url} hung for 30 s"))
}
