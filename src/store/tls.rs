//! TLS for [`RedisStore`] (feature `tls`): rustls through redis-rs.
//!
//! A `rediss://` URL connects over TLS wherever a URL is taken
//! ([`connect`](RedisStore::connect), [`connect_lazy`](RedisStore::connect_lazy),
//! `cluster`, `sentinel`), checking the server's certificate against the
//! system's trust store. [`connect_with_tls`](RedisStore::connect_with_tls)
//! takes a CA of your own and a client certificate. redis-rs's `#insecure`
//! fragment (`rediss://host:6380/#insecure`) skips the certificate check: for
//! tests only.
//!
//! rustls needs a crypto provider; unless the process has installed one, the
//! store installs rustls's `ring` provider as the process default before its
//! first TLS connection.
//!
//! A child module of `redis.rs`, so that it reaches the store's constructors.

use redis::{Client, IntoConnectionInfo, RedisError, TlsCertificates};

use super::RedisStore;
use crate::Error;

/// Installs rustls's `ring` provider as the process default, unless one is
/// installed already (then this does nothing).
pub(super) fn install_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race to another thread's install is fine: one is installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// Whether `e` comes from TLS: a failed handshake, a certificate the other
/// side refused, or a TLS alert.
pub(super) fn is_tls_error(e: &RedisError) -> bool {
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(mut err) = next {
        // redis-rs keeps the error it wraps in an `Arc`: look inside it.
        if let Some(shared) = err.downcast_ref::<Shared>() {
            err = &**shared;
        }
        if err.is::<rustls::Error>() {
            return true;
        }
        // rustls's error arrives wrapped in an `io::Error`, whose `source`
        // skips it: look inside that too.
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && io
                .get_ref()
                .is_some_and(|inner| inner.is::<rustls::Error>())
        {
            return true;
        }
        next = err.source();
    }
    false
}

impl RedisStore {
    /// Like [`connect`](Self::connect), over TLS with your own certificates:
    /// `certs.root_cert` (PEM) is the CA that signed the server's certificate,
    /// used instead of the system's trust store, and `certs.client_tls` a
    /// client certificate and key (PEM), for a server started with
    /// `tls-auth-clients yes`. `url` must be a `rediss://` URL.
    ///
    /// A server whose certificate the CA did not sign, or that wants a
    /// client certificate it did not get, fails here with
    /// [`Error::Startup`] naming TLS. A plain `rediss://` URL needs no
    /// certificates: [`connect`](Self::connect) takes it, checking the server
    /// against the system's trust store.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use redis::{ClientTlsConfig, TlsCertificates};
    /// use redis_ratelimit::RedisStore;
    ///
    /// let certs = TlsCertificates {
    ///     root_cert: Some(std::fs::read("/etc/redis/tls/ca.crt")?),
    ///     // Only for a server with `tls-auth-clients yes`:
    ///     client_tls: Some(ClientTlsConfig {
    ///         client_cert: std::fs::read("/etc/redis/tls/client.crt")?,
    ///         client_key: std::fs::read("/etc/redis/tls/client.key")?,
    ///     }),
    /// };
    /// let store = RedisStore::connect_with_tls("rediss://redis.internal:6380", certs).await?;
    /// # Ok(()) }
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub async fn connect_with_tls(
        url: impl IntoConnectionInfo,
        certs: TlsCertificates,
    ) -> Result<Self, Error> {
        install_provider();
        Self::connect_client(Client::build_with_tls(url, certs)?).await
    }
}
