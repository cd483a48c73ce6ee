//! Outbound TLS: the one rustls client configuration every HTTPS request of a Lifeguard process
//! uses (the control plane's distribution stream, issuers' JWKS).
//!
//! It trusts, together:
//! - the system's roots (the platform store `rustls-native-certs` finds);
//! - the PEM bundle named by `SSL_CERT_FILE`, when set. `rustls-native-certs` follows the
//!   OpenSSL convention that `SSL_CERT_FILE`/`SSL_CERT_DIR` *replace* the system store; here the
//!   bundle is added to the system's own directories instead, so pointing `SSL_CERT_FILE` at a
//!   private CA never drops the public roots;
//! - any extra CA files the caller names.
//!
//! [`pinned_client_config`] trusts only the CA files it is given (neither the system roots
//! nor `SSL_CERT_FILE`): the sidecar's policy stream uses it when `--control-plane-ca` is
//! set, so a public or environment-supplied CA can never vouch for a fake control plane.
//!
//! ALPN offers HTTP/2 first, then HTTP/1.1.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// Environment variable naming an extra PEM bundle of trusted roots.
pub const SSL_CERT_FILE: &str = "SSL_CERT_FILE";

/// Why the client configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsConfigError {
    #[error("cannot read the CA file {path}: {reason}")]
    CaFile { path: PathBuf, reason: String },
    #[error("the CA file {path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error("the CA file {path}: no certificate in it is a usable trust anchor")]
    Unusable { path: PathBuf },
    #[error("a pinned TLS configuration needs at least one CA file")]
    NoCaFile,
    #[error("TLS setup: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The client configuration trusting the system roots, `SSL_CERT_FILE` and `extra_ca_files`
/// (each of which must hold at least one usable certificate).
pub fn client_config(extra_ca_files: &[PathBuf]) -> Result<rustls::ClientConfig, TlsConfigError> {
    let mut roots = RootCertStore::empty();
    let system = system_roots();
    let (added, ignored) = roots.add_parsable_certificates(system);
    tracing::debug!(added, ignored, "system trust roots loaded");
    add_ca_files(&mut roots, extra_ca_files)?;
    with_roots(roots)
}

/// The client configuration trusting only `ca_files` (each must hold at least one usable
/// certificate; at least one file must be named).
pub fn pinned_client_config(ca_files: &[PathBuf]) -> Result<rustls::ClientConfig, TlsConfigError> {
    if ca_files.is_empty() {
        return Err(TlsConfigError::NoCaFile);
    }
    let mut roots = RootCertStore::empty();
    add_ca_files(&mut roots, ca_files)?;
    with_roots(roots)
}

fn add_ca_files(roots: &mut RootCertStore, ca_files: &[PathBuf]) -> Result<(), TlsConfigError> {
    for path in ca_files {
        let certs = read_pem_certificates(path)?;
        let (added, _) = roots.add_parsable_certificates(certs);
        if added == 0 {
            return Err(TlsConfigError::Unusable { path: path.clone() });
        }
    }
    Ok(())
}

fn with_roots(roots: RootCertStore) -> Result<rustls::ClientConfig, TlsConfigError> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// The system store plus `SSL_CERT_FILE`. Unreadable locations are logged, not fatal: a
/// container without a CA bundle still trusts the CA files it was given.
fn system_roots() -> Vec<CertificateDer<'static>> {
    let env_file = std::env::var_os(SSL_CERT_FILE).filter(|v| !v.is_empty());
    let env_dir = std::env::var_os("SSL_CERT_DIR").filter(|v| !v.is_empty());
    let mut certs = Vec::new();
    let mut keep = |result: rustls_native_certs::CertificateResult, what: &str| {
        for error in &result.errors {
            tracing::warn!(%error, what, "some trust roots could not be loaded");
        }
        certs.extend(result.certs);
    };
    // With either variable set, this reads those instead of the system store…
    keep(rustls_native_certs::load_native_certs(), "native store");
    if env_file.is_some() || env_dir.is_some() {
        // …so read the system's own directories too.
        for dir in openssl_probe::candidate_cert_dirs() {
            keep(
                rustls_native_certs::load_certs_from_paths(None, Some(dir)),
                "system directory",
            );
        }
    }
    certs
}

/// Every certificate of a PEM file; fails when there is none.
fn read_pem_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsConfigError> {
    let fail = |reason: String| TlsConfigError::CaFile {
        path: path.to_owned(),
        reason,
    };
    let bytes = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| fail(e.to_string()))?;
    if certs.is_empty() {
        return Err(TlsConfigError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca_pem() -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.self_signed(&key).unwrap().pem()
    }

    #[test]
    fn an_extra_ca_is_trusted_and_http2_is_offered_first() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, ca_pem()).unwrap();
        let config = client_config(&[ca]).expect("config");
        assert_eq!(
            config.alpn_protocols,
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        );
    }

    #[test]
    fn a_pinned_configuration_needs_a_ca_and_trusts_only_it() {
        assert!(matches!(
            pinned_client_config(&[]),
            Err(TlsConfigError::NoCaFile)
        ));
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, ca_pem()).unwrap();
        assert!(pinned_client_config(&[ca]).is_ok());
    }

    #[test]
    fn a_ca_file_must_exist_and_hold_a_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        assert!(matches!(
            client_config(std::slice::from_ref(&missing)),
            Err(TlsConfigError::CaFile { .. })
        ));
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "no certificate here\n").unwrap();
        let err = client_config(std::slice::from_ref(&empty)).unwrap_err();
        assert!(matches!(err, TlsConfigError::NoCertificate { .. }), "{err}");
    }
}
