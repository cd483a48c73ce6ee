//! The client certificate a trusted proxy passes on in a header, as the RFC 8705 thumbprint
//! (`x5t#S256`: base64url SHA-256 of the DER certificate) a certificate-bound token names.
//! Pure: the caller decides whether the proxy is trusted.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::{self, PemObject};
use sha2::{Digest, Sha256};

use crate::api::CertificateHeaderFormat;

/// Longest header value read (a PEM certificate chain of a few kilobytes, URL-encoded).
pub const MAX_HEADER_BYTES: usize = 16 * 1024;

/// Why the header names no certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CertificateHeaderError {
    #[error("the certificate header is too long")]
    TooLong,
    #[error("the certificate header holds more than one element (more than one proxy wrote it)")]
    SeveralElements,
    #[error("the certificate header holds neither Hash nor Cert")]
    NoCertificate,
    #[error("the certificate header is not well-formed")]
    Malformed,
}

/// The `x5t#S256` thumbprint of the certificate in a header value written as `format` says.
pub fn certificate_thumbprint(
    value: &str,
    format: CertificateHeaderFormat,
) -> Result<String, CertificateHeaderError> {
    if value.len() > MAX_HEADER_BYTES {
        return Err(CertificateHeaderError::TooLong);
    }
    match format {
        CertificateHeaderFormat::Pem => pem_thumbprint(&percent_decoded(value)?),
        CertificateHeaderFormat::Xfcc => xfcc_thumbprint(value),
    }
}

/// Envoy's `x-forwarded-client-cert`: elements separated by `,`, each `key=value` pairs
/// separated by `;`, values possibly quoted. A proxy that sanitizes the header writes exactly
/// one element; more than one means a proxy appended to a value from further out, which is
/// refused rather than guessed at. `Hash` is the hex SHA-256 of the DER certificate; without
/// it, `Cert` (the URL-encoded PEM) is hashed.
fn xfcc_thumbprint(value: &str) -> Result<String, CertificateHeaderError> {
    let elements = split_outside_quotes(value, ',');
    let [element] = elements.as_slice() else {
        return Err(CertificateHeaderError::SeveralElements);
    };
    let mut hash = None;
    let mut cert = None;
    for pair in split_outside_quotes(element, ';') {
        let (key, raw) = pair
            .split_once('=')
            .ok_or(CertificateHeaderError::Malformed)?;
        let raw = raw.trim();
        let unquoted = raw
            .strip_prefix('"')
            .and_then(|r| r.strip_suffix('"'))
            .unwrap_or(raw);
        match key.trim().to_ascii_lowercase().as_str() {
            "hash" => hash = Some(unquoted),
            "cert" => cert = Some(unquoted),
            _ => {}
        }
    }
    if let Some(hash) = hash {
        let bytes = hex::decode(hash).map_err(|_| CertificateHeaderError::Malformed)?;
        if bytes.len() != 32 {
            return Err(CertificateHeaderError::Malformed);
        }
        return Ok(URL_SAFE_NO_PAD.encode(bytes));
    }
    match cert {
        Some(cert) => pem_thumbprint(&percent_decoded(cert)?),
        None => Err(CertificateHeaderError::NoCertificate),
    }
}

fn percent_decoded(value: &str) -> Result<String, CertificateHeaderError> {
    percent_encoding::percent_decode_str(value)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| CertificateHeaderError::Malformed)
}

/// The thumbprint of the first certificate of a PEM text (the client's own; a chain's other
/// certificates are its issuers).
fn pem_thumbprint(pem: &str) -> Result<String, CertificateHeaderError> {
    let der = CertificateDer::from_pem_slice(pem.as_bytes()).map_err(|e| match e {
        pem::Error::NoItemsFound => CertificateHeaderError::NoCertificate,
        _ => CertificateHeaderError::Malformed,
    })?;
    Ok(URL_SAFE_NO_PAD.encode(Sha256::digest(&der)))
}

/// `value` split at `separator`s that are not inside double quotes.
fn split_outside_quotes(value: &str, separator: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut quoted = false;
    let mut start = 0;
    for (i, c) in value.char_indices() {
        match c {
            '"' => quoted = !quoted,
            c if c == separator && !quoted => {
                parts.push(&value[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    parts.push(&value[start..]);
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A certificate made for this test (`rcgen`): its DER's SHA-256 is the thumbprint.
    fn certificate() -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["client.test".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let thumbprint = URL_SAFE_NO_PAD.encode(Sha256::digest(cert.der()));
        (cert.pem(), thumbprint)
    }

    fn url_encoded(text: &str) -> String {
        percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC).to_string()
    }

    #[test]
    fn an_escaped_pem_gives_the_rfc_8705_thumbprint() {
        let (pem, thumbprint) = certificate();
        let header = url_encoded(&pem);
        assert_eq!(
            certificate_thumbprint(&header, CertificateHeaderFormat::Pem),
            Ok(thumbprint)
        );
        assert_eq!(
            certificate_thumbprint("not a certificate", CertificateHeaderFormat::Pem),
            Err(CertificateHeaderError::NoCertificate)
        );
    }

    #[test]
    fn an_xfcc_element_gives_its_hash_or_its_certs_thumbprint() {
        let (pem, thumbprint) = certificate();
        let hash = hex::encode(URL_SAFE_NO_PAD.decode(&thumbprint).unwrap());
        let by_hash = format!(
            "By=spiffe://cluster.local/ns/a/sa/server;Hash={hash};Subject=\"CN=client,O=a;b\";URI=spiffe://cluster.local/ns/b/sa/client"
        );
        assert_eq!(
            certificate_thumbprint(&by_hash, CertificateHeaderFormat::Xfcc),
            Ok(thumbprint.clone())
        );
        let by_cert = format!("By=spiffe://x;Cert=\"{}\"", url_encoded(&pem));
        assert_eq!(
            certificate_thumbprint(&by_cert, CertificateHeaderFormat::Xfcc),
            Ok(thumbprint)
        );
    }

    #[test]
    fn ambiguous_or_broken_xfcc_values_name_no_certificate() {
        let hash = "a".repeat(64);
        for (value, error) in [
            (
                format!("Hash={hash},Hash={hash}"),
                CertificateHeaderError::SeveralElements,
            ),
            (
                "By=spiffe://x".to_owned(),
                CertificateHeaderError::NoCertificate,
            ),
            ("Hash=abc".to_owned(), CertificateHeaderError::Malformed),
            (
                format!("Hash={}", "z".repeat(64)),
                CertificateHeaderError::Malformed,
            ),
            ("garbage".to_owned(), CertificateHeaderError::Malformed),
            (
                "x".repeat(MAX_HEADER_BYTES + 1),
                CertificateHeaderError::TooLong,
            ),
        ] {
            assert_eq!(
                certificate_thumbprint(&value, CertificateHeaderFormat::Xfcc),
                Err(error),
                "{value:.40}"
            );
        }
    }
}
