//! TLS for the test doubles that stand in for HTTPS peers (the operator's distribution
//! endpoint, a validating webhook): a throwaway CA with one serving certificate for
//! 127.0.0.1/localhost, and a server for an axum router over it.

use std::sync::Arc;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::task::JoinSet;

/// A fresh CA (its PEM, for the client to trust) and a server configuration whose certificate
/// it signed, offering HTTP/2 and HTTP/1.1.
pub fn mint_tls() -> (String, Arc<rustls::ServerConfig>) {
    mint_tls_for(&["127.0.0.1".to_owned(), "localhost".to_owned()])
}

/// [`mint_tls`] with a certificate for `names` (host names or IP addresses).
pub fn mint_tls_for(names: &[String]) -> (String, Arc<rustls::ServerConfig>) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "lifeguard test CA");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf_key = KeyPair::generate().unwrap();
    let leaf_params = CertificateParams::new(names.to_vec()).unwrap();
    let leaf = leaf_params.signed_by(&leaf_key, &issuer).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::try_from(leaf_key.serialize_der()).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone()], key)
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    (ca_cert.pem(), Arc::new(config))
}

/// Serves `router` over TLS on `listener` until the returned set is aborted or dropped; the
/// connections' tasks live inside the accept task and end with it.
pub fn serve(
    listener: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    router: Router,
) -> JoinSet<()> {
    let mut set = JoinSet::new();
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    set.spawn(async move {
        let mut connections = JoinSet::new();
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let acceptor = acceptor.clone();
            let service = TowerToHyperService::new(router.clone());
            connections.spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    set
}
