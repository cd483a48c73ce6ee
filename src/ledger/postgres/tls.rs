//! TLS for ledger connections, on rustls with aws-lc-rs.
//!
//! tokio-postgres itself knows `disable`, `prefer` and `require`; it is told `require` for the
//! verifying modes, and the verification lives in the rustls configuration built here:
//!
//! - `prefer`, `require`: the handshake's signatures are checked (the connection is encrypted
//!   to whoever holds the key of the certificate shown), the certificate itself is not (libpq's
//!   behaviour: protects against passive eavesdropping only).
//! - `verify-ca`: the certificate must chain to a trusted root; any host name.
//! - `verify-full`: the chain, and the certificate must name the host connected to.
//!
//! Trusted roots: the system store (`rustls-native-certs`) plus the PEM file named by
//! `sslrootcert`, which must hold at least one usable certificate.

use std::path::Path;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::config::{PostgresLocation, RootCert, SslMode};
use crate::ledger::{LedgerError, Result};

/// The TLS connector for `location`'s `sslmode` and roots.
pub fn connector(location: &PostgresLocation) -> Result<MakeRustlsConnect> {
    Ok(MakeRustlsConnect::new(client_config(
        location.ssl_mode(),
        location.root_cert(),
    )?))
}

/// The rustls client configuration for `mode`.
pub fn client_config(mode: SslMode, root_cert: &RootCert) -> Result<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let verifier = verifier(mode, root_cert, &provider)?;
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| LedgerError::storage("set up TLS for PostgreSQL", e))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth())
}

/// What checks the server's certificate in `mode`.
fn verifier(
    mode: SslMode,
    root_cert: &RootCert,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn ServerCertVerifier>> {
    let supported = provider.signature_verification_algorithms;
    Ok(match mode {
        SslMode::Disable | SslMode::Prefer | SslMode::Require => Arc::new(Unverified { supported }),
        SslMode::VerifyCa => Arc::new(ChainOnly {
            roots: Arc::new(roots(root_cert)?),
            supported,
        }),
        SslMode::VerifyFull => WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots(root_cert)?),
            Arc::clone(provider),
        )
        .build()
        .map_err(|e| LedgerError::storage("set up TLS for PostgreSQL", e))?,
    })
}

/// The system store plus `sslrootcert`; at least one root.
fn roots(root_cert: &RootCert) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    let system = rustls_native_certs::load_native_certs();
    for error in &system.errors {
        tracing::debug!(%error, "some system trust roots could not be loaded");
    }
    roots.add_parsable_certificates(system.certs);
    if let RootCert::File(path) = root_cert {
        let certs = read_pem(path)?;
        let (added, _) = roots.add_parsable_certificates(certs);
        if added == 0 {
            return Err(LedgerError::Internal(format!(
                "sslrootcert {}: no certificate in it is a usable trust anchor",
                path.display()
            )));
        }
    }
    if roots.is_empty() {
        return Err(LedgerError::Internal(
            "sslmode verify-ca/verify-full: no trusted root certificates (give sslrootcert)".into(),
        ));
    }
    Ok(roots)
}

fn read_pem(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let what = || format!("read sslrootcert {}", path.display());
    let bytes = std::fs::read(path).map_err(|e| LedgerError::storage(what(), e))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| LedgerError::storage(what(), e))?;
    if certs.is_empty() {
        return Err(LedgerError::Internal(format!(
            "sslrootcert {} holds no PEM certificate",
            path.display()
        )));
    }
    Ok(certs)
}

/// Checks the handshake's signatures with the shown certificate's key, but not the certificate
/// (`prefer`, `require`).
#[derive(Debug)]
struct Unverified {
    supported: WebPkiSupportedAlgorithms,
}

/// Checks that the certificate chains to a trusted root, whatever names it holds (`verify-ca`).
#[derive(Debug)]
struct ChainOnly {
    roots: Arc<RootCertStore>,
    supported: WebPkiSupportedAlgorithms,
}

macro_rules! handshake_signatures {
    () => {
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(message, cert, dss, &self.supported)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(message, cert, dss, &self.supported)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.supported.supported_schemes()
        }
    };
}

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    handshake_signatures!();
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        let cert = rustls::server::ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.supported.all,
        )?;
        Ok(ServerCertVerified::assertion())
    }

    handshake_signatures!();
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// A CA, and a server certificate it signed for `names`.
    fn ca_and_server(names: &[&str]) -> (String, CertificateDer<'static>) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, &ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let params = rcgen::CertificateParams::new(names).unwrap();
        let server = params.signed_by(&key, &issuer).unwrap();
        (ca.pem(), server.der().clone())
    }

    fn verify(
        verifier: &Arc<dyn ServerCertVerifier>,
        cert: &CertificateDer<'_>,
        name: &str,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        verifier.verify_server_cert(
            cert,
            &[],
            &ServerName::try_from(name.to_owned()).unwrap(),
            &[],
            UnixTime::now(),
        )
    }

    #[test]
    fn verify_modes_check_what_libpq_checks() {
        let dir = tempfile::tempdir().unwrap();
        let (ca_pem, cert) = ca_and_server(&["db.internal"]);
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, ca_pem).unwrap();
        let (_, stranger) = ca_and_server(&["db.internal"]);
        let roots = RootCert::File(ca);

        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let full = verifier(SslMode::VerifyFull, &roots, &provider).unwrap();
        assert!(verify(&full, &cert, "db.internal").is_ok());
        assert!(verify(&full, &cert, "other.internal").is_err(), "name");
        assert!(verify(&full, &stranger, "db.internal").is_err(), "chain");

        let ca_only = verifier(SslMode::VerifyCa, &roots, &provider).unwrap();
        assert!(verify(&ca_only, &cert, "db.internal").is_ok());
        assert!(
            verify(&ca_only, &cert, "other.internal").is_ok(),
            "any name"
        );
        assert!(verify(&ca_only, &stranger, "db.internal").is_err(), "chain");

        for mode in [SslMode::Prefer, SslMode::Require, SslMode::Disable] {
            let open = verifier(mode, &RootCert::System, &provider).unwrap();
            assert!(verify(&open, &stranger, "anything").is_ok(), "{mode:?}");
            client_config(mode, &RootCert::System).expect("a configuration");
        }
    }

    #[test]
    fn a_root_file_must_hold_a_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let missing = RootCert::File(dir.path().join("missing.pem"));
        assert!(client_config(SslMode::VerifyFull, &missing).is_err());
        let empty: PathBuf = dir.path().join("empty.pem");
        std::fs::write(&empty, "no certificate\n").unwrap();
        let err = client_config(SslMode::VerifyCa, &RootCert::File(empty)).unwrap_err();
        assert!(err.to_string().contains("no PEM certificate"), "{err}");
    }
}
