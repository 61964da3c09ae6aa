//! TLS material for the tests, made with rcgen (no external tool): a CA, a
//! certificate for the server at 127.0.0.1 and a client certificate, both
//! signed by the CA; and Redis servers that speak TLS with them.

use std::path::PathBuf;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use redis::{ClientTlsConfig, TlsCertificates};

use super::RedisServer;

/// A CA with a server and a client certificate, as PEM files in a temp dir.
pub struct Pki {
    dir: tempfile::TempDir,
    /// The CA's certificate (PEM).
    pub ca: String,
    /// The client's certificate (PEM), signed by the CA.
    pub client_cert: String,
    /// The client's private key (PEM).
    pub client_key: String,
}

/// A new CA: its certificate (PEM) and the issuer that signs with it.
fn ca(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), Issuer::new(params, key))
}

/// A leaf certificate for `names`, signed by `issuer`: (certificate, key).
fn leaf(
    names: &[&str],
    usage: ExtendedKeyUsagePurpose,
    issuer: &Issuer<'_, KeyPair>,
) -> (String, String) {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let mut params = CertificateParams::new(names).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "redis-ratelimit test");
    params.extended_key_usages = vec![usage];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

impl Pki {
    /// Makes the CA and both certificates, and writes the server's files.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir for certificates");
        let (ca, issuer) = ca("redis-ratelimit test CA");
        let server_names = ["127.0.0.1", "localhost"];
        let (server_cert, server_key) =
            leaf(&server_names, ExtendedKeyUsagePurpose::ServerAuth, &issuer);
        let (client_cert, client_key) =
            leaf(&["client"], ExtendedKeyUsagePurpose::ClientAuth, &issuer);
        for (name, pem) in [
            ("ca.crt", &ca),
            ("server.crt", &server_cert),
            ("server.key", &server_key),
        ] {
            std::fs::write(dir.path().join(name), pem).expect("write a PEM file");
        }
        Self {
            dir,
            ca,
            client_cert,
            client_key,
        }
    }

    fn path(&self, name: &str) -> String {
        let path: PathBuf = self.dir.path().join(name);
        path.to_str().expect("utf-8 temp dir").to_owned()
    }

    /// A Redis that speaks TLS only, with the server certificate; it asks
    /// for no client certificate unless `args` say `--tls-auth-clients yes`.
    pub fn server(&self, args: &[&str]) -> RedisServer {
        let certs = self.server_args();
        let mut all: Vec<&str> = certs.iter().map(String::as_str).collect();
        all.extend_from_slice(args);
        RedisServer::start_tls(&all)
    }

    /// The server certificate, its key and the CA, as `redis-server`
    /// arguments; no client certificate asked for.
    fn server_args(&self) -> Vec<String> {
        let (ca, cert, key) = (
            self.path("ca.crt"),
            self.path("server.crt"),
            self.path("server.key"),
        );
        [
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &ca,
            "--tls-auth-clients",
            "no",
        ]
        .map(String::from)
        .to_vec()
    }

    /// A sentinel that speaks TLS only, with the server certificate, and
    /// reaches the servers it monitors over TLS (`tls-replication`).
    pub fn sentinel(&self, conf: &str) -> RedisServer {
        let certs = self.server_args();
        let mut args: Vec<&str> = certs.iter().map(String::as_str).collect();
        args.extend(["--tls-replication", "yes"]);
        RedisServer::start_tls_sentinel(conf, &args)
    }

    /// Trust this CA; send the client certificate if `client`.
    pub fn certs(&self, client: bool) -> TlsCertificates {
        TlsCertificates {
            root_cert: Some(self.ca.clone().into_bytes()),
            client_tls: client.then(|| ClientTlsConfig {
                client_cert: self.client_cert.clone().into_bytes(),
                client_key: self.client_key.clone().into_bytes(),
            }),
        }
    }
}

/// The certificate (PEM) of a CA that signed nothing of the [`Pki`]'s.
pub fn other_ca() -> String {
    ca("some other CA").0
}
