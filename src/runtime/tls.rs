//! HTTPS serving for the control-plane ports (the operator's distribution and security-event
//! endpoint, the webhook's admission endpoints): rustls in front of the hardened HTTP/1.1
//! server of [`super::http`], and a serving certificate that follows its files.
//!
//! # Limits
//! [`serve_tls`] is [`super::http::serve_tls`]: the connection caps (total and per peer
//! address), the handshake, header-read and idle timeouts and the bounded head buffers of the
//! sidecar's client port, one implementation. ALPN follows the port's [`ServerLimits::http2`]:
//! a port that serves HTTP/2 (the operator's, so a sidecar's acknowledgements ride its stream's
//! connection) offers `h2` before `http/1.1`, with every stream admitted against the port's caps
//! as a connection would be and the HTTP/2 deadlines of [`super::http`]; any other port (the
//! webhook's) offers `http/1.1` only. The API server never calls webhooks over HTTP/2
//! (kubernetes/kubernetes#82090); controller-runtime and cert-manager turn HTTP/2 off on their
//! webhooks too.
//!
//! # Certificate rotation
//! cert-manager and the kubelet rotate a mounted Secret by swapping a symlink, which kills
//! file watches set on the old inode. So nothing is watched: every handshake asks the
//! [`ReloadingCertificate`], which looks at the files' modification time and size at most once
//! per [`RECHECK_INTERVAL`] (a `stat`, through the symlink) and re-reads them when either moved.
//! A pair that fails to load (caught mid-rotation, key not matching) is logged and the previous
//! certificate stays in use; the next check tries again.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::http::{ConnectionMetrics, ServerLimits};

/// How often a handshake may look at the certificate files.
pub const RECHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Why a certificate pair could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: no PEM certificate in the file")]
    NoCertificate { path: PathBuf },
    #[error("{path}: no usable PEM private key: {detail}")]
    Key { path: PathBuf, detail: String },
    #[error("the private key does not match the certificate or is unsupported: {0}")]
    Mismatch(String),
}

#[derive(Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    modified: Option<SystemTime>,
    len: u64,
}

fn stamp(path: &Path) -> Option<FileStamp> {
    let meta = std::fs::metadata(path).ok()?;
    Some(FileStamp {
        modified: meta.modified().ok(),
        len: meta.len(),
    })
}

struct Loaded {
    key: Arc<CertifiedKey>,
    stamps: (Option<FileStamp>, Option<FileStamp>),
    checked: Instant,
}

/// A serving certificate read from a PEM certificate chain and a PEM private key, re-read when
/// the files change.
pub struct ReloadingCertificate {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: Mutex<Loaded>,
}

impl fmt::Debug for ReloadingCertificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadingCertificate")
            .field("cert_path", &self.cert_path)
            .field("key_path", &self.key_path)
            .finish()
    }
}

fn load_pair(cert_path: &Path, key_path: &Path) -> Result<CertifiedKey, CertificateError> {
    let cert_pem = std::fs::read(cert_path).map_err(|source| CertificateError::Read {
        path: cert_path.to_owned(),
        source,
    })?;
    let key_pem = std::fs::read(key_path).map_err(|source| CertificateError::Read {
        path: key_path.to_owned(),
        source,
    })?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .filter_map(Result::ok)
        .collect();
    if chain.is_empty() {
        return Err(CertificateError::NoCertificate {
            path: cert_path.to_owned(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| CertificateError::Key {
        path: key_path.to_owned(),
        detail: e.to_string(),
    })?;
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    let certified = CertifiedKey::from_der(chain, key, &provider)
        .map_err(|e| CertificateError::Mismatch(e.to_string()))?;
    Ok(certified)
}

impl ReloadingCertificate {
    /// Loads the pair once; fails when it cannot (a server must not start without one).
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Self, CertificateError> {
        let stamps = (stamp(cert_path), stamp(key_path));
        let key = Arc::new(load_pair(cert_path, key_path)?);
        Ok(Self {
            cert_path: cert_path.to_owned(),
            key_path: key_path.to_owned(),
            current: Mutex::new(Loaded {
                key,
                stamps,
                checked: Instant::now(),
            }),
        })
    }

    /// The certificate to present now, re-reading the files when they changed.
    pub fn current(&self) -> Arc<CertifiedKey> {
        let mut loaded = match self.current.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        if loaded.checked.elapsed() >= RECHECK_INTERVAL {
            loaded.checked = Instant::now();
            let stamps = (stamp(&self.cert_path), stamp(&self.key_path));
            if stamps != loaded.stamps {
                match load_pair(&self.cert_path, &self.key_path) {
                    Ok(key) => {
                        tracing::info!(cert = %self.cert_path.display(), "serving certificate reloaded");
                        loaded.key = Arc::new(key);
                        loaded.stamps = stamps;
                    }
                    Err(error) => {
                        // Keep serving the previous pair; the next check tries again.
                        tracing::warn!(%error, "serving certificate changed but does not load; keeping the previous one");
                    }
                }
            }
        }
        loaded.key.clone()
    }

    /// A rustls server configuration that presents this certificate and offers HTTP/1.1, and
    /// HTTP/2 first when `http2` (see the module documentation).
    pub fn server_config(self: Arc<Self>, http2: bool) -> rustls::ServerConfig {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        // The provider's defaults support the safe protocol versions; this cannot fail for
        // the built-in provider.
        let builder = match rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
        {
            Ok(b) => b,
            Err(e) => unreachable!("aws-lc-rs supports the default protocol versions: {e}"),
        };
        let mut config = builder
            .with_no_client_auth()
            .with_cert_resolver(self as Arc<dyn ResolvesServerCert>);
        config.alpn_protocols = alpn(http2);
        config
    }
}

/// The protocols a port offers in ALPN, most preferred first.
fn alpn(http2: bool) -> Vec<Vec<u8>> {
    if http2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    }
}

impl ResolvesServerCert for ReloadingCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// Serves `router` over TLS on `listener` under `limits` until `shutdown`, then gives requests
/// in flight [`ServerLimits::shutdown_grace`] to finish. Long-lived streams (the policy stream)
/// are expected to end themselves when `shutdown` fires. Refusals and timeouts are counted in
/// `metrics`.
pub async fn serve_tls(
    listener: TcpListener,
    router: Router,
    certificate: Arc<ReloadingCertificate>,
    limits: ServerLimits,
    metrics: ConnectionMetrics,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let http2 = limits.http2.is_some();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(certificate.server_config(http2)));
    super::http::serve_tls(listener, router, limits, metrics, shutdown, acceptor).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_pair(dir: &Path, name: &str) -> (PathBuf, PathBuf, String) {
        let certified = rcgen::generate_simple_self_signed(vec![name.to_owned()]).unwrap();
        let cert = dir.join("tls.crt");
        let key = dir.join("tls.key");
        std::fs::write(&cert, certified.cert.pem()).unwrap();
        std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
        (cert, key, certified.cert.pem())
    }

    #[test]
    fn a_rotated_pair_is_picked_up_and_a_broken_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key, first_pem) = write_pair(dir.path(), "first.example");
        let reloading = ReloadingCertificate::load(&cert, &key).unwrap();
        let first = reloading.current();
        let first_der = CertificateDer::from_pem_slice(first_pem.as_bytes()).unwrap();
        assert_eq!(first.cert[0], first_der);

        // Rotation: new files, and the recheck interval has passed.
        let (_, _, second_pem) = write_pair(dir.path(), "second.example");
        reloading.current.lock().unwrap().checked = Instant::now() - RECHECK_INTERVAL;
        let second_der = CertificateDer::from_pem_slice(second_pem.as_bytes()).unwrap();
        assert_eq!(reloading.current().cert[0], second_der);

        // A half-written certificate keeps the previous pair in use.
        std::fs::write(&cert, "-----BEGIN CERTIFICATE-----\nnot base64").unwrap();
        reloading.current.lock().unwrap().checked = Instant::now() - RECHECK_INTERVAL;
        assert_eq!(reloading.current().cert[0], second_der);
    }

    #[test]
    fn a_missing_or_mismatched_pair_is_refused_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, _key, _) = write_pair(dir.path(), "a.example");
        let err = ReloadingCertificate::load(&cert, &dir.path().join("absent.key")).unwrap_err();
        assert!(matches!(err, CertificateError::Read { .. }), "{err}");
        let other = rcgen::generate_simple_self_signed(vec!["b.example".into()]).unwrap();
        let other_key = dir.path().join("other.key");
        std::fs::write(&other_key, other.signing_key.serialize_pem()).unwrap();
        let err = ReloadingCertificate::load(&cert, &other_key).unwrap_err();
        assert!(matches!(err, CertificateError::Mismatch(_)), "{err}");
    }
}
