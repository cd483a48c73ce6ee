//! `sslmode` against a real handshake: a proxy in front of the test server answers
//! PostgreSQL's SSLRequest, terminates TLS with a certificate from a CA of its own, and
//! forwards the decrypted stream.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use super::support::{POOL, TestDb, scope, server};
use crate::ledger::conformance::{UNLIMITED, fresh_owner, reservation};
use crate::ledger::{LedgerError, PostgresLedger, PostgresLocation, ReserveOutcome, TaskLedger};

/// PostgreSQL's SSLRequest: length 8, code 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 4, 210, 22, 47];

struct TlsProxy {
    port: u16,
    ca_file: PathBuf,
    _dir: tempfile::TempDir,
    /// Connections that negotiated TLS, and that did not.
    encrypted: Arc<AtomicUsize>,
    plain: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TlsProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TlsProxy {
    /// A proxy whose certificate names `names`.
    async fn start(names: &[&str]) -> Self {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, &ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let cert = rcgen::CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, ca.pem()).unwrap();

        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from(cert.der().to_vec())],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let target = {
            let s = server();
            format!("{}:{}", s.first_host(), s.first_port())
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (encrypted, plain): (Arc<AtomicUsize>, Arc<AtomicUsize>) = Default::default();
        let counts = (Arc::clone(&encrypted), Arc::clone(&plain));
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((mut inbound, _)) = listener.accept().await {
                let (acceptor, target) = (acceptor.clone(), target.clone());
                let (encrypted, plain) = (Arc::clone(&counts.0), Arc::clone(&counts.1));
                connections.spawn(async move {
                    let mut first = [0u8; 8];
                    inbound.read_exact(&mut first).await?;
                    let mut outbound = TcpStream::connect(&target).await?;
                    if first == SSL_REQUEST {
                        inbound.write_all(b"S").await?;
                        let mut tls = acceptor.accept(inbound).await?;
                        encrypted.fetch_add(1, Ordering::SeqCst);
                        tokio::io::copy_bidirectional(&mut tls, &mut outbound).await?;
                    } else {
                        plain.fetch_add(1, Ordering::SeqCst);
                        outbound.write_all(&first).await?;
                        tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await?;
                    }
                    std::io::Result::Ok(())
                });
            }
        });
        Self {
            port,
            ca_file,
            _dir: dir,
            encrypted,
            plain,
            task,
        }
    }

    fn location(&self, db: &TestDb, host: &str, params: &str) -> PostgresLocation {
        let s = server();
        let user = s.user().map(|u| format!("{u}@")).unwrap_or_default();
        let url = format!(
            "postgres://{user}{host}:{}/{}?{params}",
            self.port,
            db.name()
        );
        let location: PostgresLocation = url.parse().unwrap();
        let location = location.with_pool_size(POOL);
        match s.pg().get_password() {
            Some(p) => location.with_password(std::str::from_utf8(p).unwrap()),
            None => location,
        }
    }
}

async fn works(location: &PostgresLocation) {
    let ledger = PostgresLedger::open(location, scope("ns/tls", "r"))
        .await
        .unwrap_or_else(|e| panic!("{location:?}: {e}"));
    let r = reservation(&fresh_owner(), UNLIMITED);
    assert_eq!(ledger.reserve(r).await.unwrap(), ReserveOutcome::Reserved);
}

async fn refused(location: &PostgresLocation) -> String {
    let err = PostgresLedger::open(location, scope("ns/tls", "r"))
        .await
        .expect_err("the server's certificate is refused");
    assert!(matches!(err, LedgerError::Storage { .. }), "{err}");
    err.to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn ssl_modes_verify_what_they_promise() {
    let db = TestDb::create().await;
    let proxy = TlsProxy::start(&["localhost"]).await;
    let ca = format!("sslrootcert={}", proxy.ca_file.display());

    // verify-full: our CA and the name connected to.
    works(&proxy.location(&db, "localhost", &format!("sslmode=verify-full&{ca}"))).await;
    let wrong_name =
        refused(&proxy.location(&db, "127.0.0.1", &format!("sslmode=verify-full&{ca}"))).await;
    assert!(wrong_name.contains("certificate"), "{wrong_name}");
    let unknown_ca = refused(&proxy.location(&db, "localhost", "sslmode=verify-full")).await;
    assert!(unknown_ca.contains("certificate"), "{unknown_ca}");

    // verify-ca: our CA, any name; still not an unknown CA.
    works(&proxy.location(&db, "127.0.0.1", &format!("sslmode=verify-ca&{ca}"))).await;
    refused(&proxy.location(&db, "127.0.0.1", "sslmode=verify-ca")).await;

    // require and prefer: encrypted, unverified.
    let before = proxy.encrypted.load(Ordering::SeqCst);
    works(&proxy.location(&db, "127.0.0.1", "sslmode=require")).await;
    works(&proxy.location(&db, "127.0.0.1", "")).await;
    assert!(proxy.encrypted.load(Ordering::SeqCst) > before);
    assert_eq!(proxy.plain.load(Ordering::SeqCst), 0, "never in the clear");

    // disable: in the clear.
    works(&proxy.location(&db, "127.0.0.1", "sslmode=disable")).await;
    assert!(proxy.plain.load(Ordering::SeqCst) > 0);
}
