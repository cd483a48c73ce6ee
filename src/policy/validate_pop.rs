//! Validation of `spec.identity.dpop`: how DPoP proofs are checked.

use std::time::Duration;

use crate::api::{ClientCertificatesSpec, DpopSpec, JwsAlgorithm};

use super::problem::Problems;

/// The narrowest `iat` window accepted: below it, ordinary clock skew between client and
/// sidecar refuses honest proofs.
pub const MIN_PROOF_WINDOW: Duration = Duration::from_secs(10);
/// The widest: a captured proof (and the replay cache remembering it) lives this long.
pub const MAX_PROOF_WINDOW: Duration = Duration::from_secs(15 * 60);

/// The proxies trusted without `trustedProxies`: a mesh proxy in the same pod.
pub const LOOPBACK: [&str; 2] = ["127.0.0.0/8", "::1/128"];

/// Headers a client certificate may not be read from: the request's credentials, and the
/// headers the sidecar sets for the server.
const RESERVED_HEADERS: [&str; 4] = ["authorization", "dpop", "cookie", "host"];

pub(super) fn validate_client_certificates(
    spec: Option<&ClientCertificatesSpec>,
    p: &mut Problems,
) {
    let Some(spec) = spec else {
        return;
    };
    let header = spec.header.to_ascii_lowercase();
    if http::HeaderName::from_bytes(header.as_bytes()).is_err() {
        p.error(
            "spec.identity.clientCertificates.header",
            format!("`{}` is not an HTTP header name", spec.header),
        );
    } else if RESERVED_HEADERS.contains(&header.as_str()) || header.starts_with("lifeguard-") {
        p.error(
            "spec.identity.clientCertificates.header",
            format!(
                "`{}` carries something else; name the header your proxy sets",
                spec.header
            ),
        );
    }
    for (i, range) in spec.trusted_proxies.iter().flatten().enumerate() {
        if range.parse::<ipnet::IpNet>().is_err() {
            p.error(
                format!("spec.identity.clientCertificates.trustedProxies[{i}]"),
                format!("`{range}` is not a CIDR range such as 10.0.0.0/8 or ::1/128"),
            );
        }
    }
    if spec.trusted_proxies.as_ref().is_some_and(Vec::is_empty) {
        p.error(
            "spec.identity.clientCertificates.trustedProxies",
            "must list at least one range (omit it for loopback only)",
        );
    }
}

pub(super) fn validate_dpop(dpop: Option<&DpopSpec>, p: &mut Problems) {
    let Some(dpop) = dpop else {
        return;
    };
    if let Some(algorithms) = &dpop.algorithms {
        if algorithms.is_empty() {
            p.error(
                "spec.identity.dpop.algorithms",
                "must list at least one algorithm (omit it for the defaults)",
            );
        }
        let mut seen: Vec<JwsAlgorithm> = Vec::new();
        for (i, alg) in algorithms.iter().enumerate() {
            if seen.contains(alg) {
                p.error(
                    format!("spec.identity.dpop.algorithms[{i}]"),
                    format!("{alg:?} is listed twice"),
                );
            }
            seen.push(*alg);
        }
    }
    if let Some(window) = &dpop.proof_window {
        let value = window.get();
        if !(MIN_PROOF_WINDOW..=MAX_PROOF_WINDOW).contains(&value) {
            p.error(
                "spec.identity.dpop.proofWindow",
                format!("must be from 10s to 15m, not {window}"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::api::{CertificateHeaderFormat, JwsAlgorithm, McpServerPolicy, ProofOfPossession};
    use crate::policy::{CompileInput, CompileMode, DpopRules, compile};

    fn compiled(issuer: &str, identity: &str) -> crate::policy::Compilation {
        let yaml = format!(
            r#"
apiVersion: lifeguard.dev/v1alpha1
kind: McpServerPolicy
metadata: {{name: reports, namespace: team-a}}
spec:
  selector: {{}}
  resource: https://reports.example.com/mcp
  identity:
    issuers:
      - issuer: https://idp.example.com
        jwksUri: https://idp.example.com/jwks
{issuer}{identity}"#
        );
        let policy: McpServerPolicy = serde_saphyr::from_str(&yaml).unwrap();
        compile(CompileInput {
            policy: &policy,
            exceptions: &[],
            revocations: &[],
            mode: CompileMode::Cluster,
            now: "2026-12-06T12:00:00Z".parse().unwrap(),
        })
    }

    fn error_paths(c: &crate::policy::Compilation) -> Vec<String> {
        c.problems.iter().map(|p| p.problem.path.clone()).collect()
    }

    #[test]
    fn without_the_new_fields_a_policy_keeps_its_hash_and_gets_the_defaults() {
        let c = compiled("", "");
        let effective = c.effective.unwrap();
        assert_eq!(effective.dpop, None);
        assert_eq!(effective.dpop_rules(), &DpopRules::default());
        assert_eq!(
            effective.issuers[0].proof_of_possession,
            ProofOfPossession::Optional
        );
        assert!(!effective.requires_proof_of_possession());
        let json = serde_json::to_string(&effective).unwrap();
        for field in ["proofOfPossession", "dpop", "clientCertificates"] {
            assert!(
                !json.contains(field),
                "{field} serialized: old hashes would change"
            );
        }
    }

    #[test]
    fn the_fields_compile_with_their_defaults_applied() {
        let c = compiled(
            "        proofOfPossession: required\n",
            "    dpop: {algorithms: [EdDSA], proofWindow: 30s, requireNonce: true}\n    clientCertificates: {header: X-Forwarded-Client-Cert, format: xfcc}\n",
        );
        assert!(!c.has_errors(), "{:?}", c.problems);
        let effective = c.effective.unwrap();
        assert!(effective.requires_proof_of_possession());
        assert_eq!(
            effective.dpop,
            Some(DpopRules {
                algorithms: vec![JwsAlgorithm::EdDSA],
                proof_window_secs: 30,
                require_nonce: true,
            })
        );
        let certificates = effective.client_certificates.unwrap();
        assert_eq!(certificates.header, "x-forwarded-client-cert");
        assert_eq!(certificates.format, CertificateHeaderFormat::Xfcc);
        assert!(certificates.trusts("127.0.0.1".parse().unwrap()));
        assert!(certificates.trusts("::1".parse().unwrap()));
        assert!(certificates.trusts("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!certificates.trusts("10.0.0.7".parse().unwrap()));
    }

    #[test]
    fn bad_values_are_errors_naming_their_field() {
        for (identity, path) in [
            (
                "    dpop: {proofWindow: 5s}\n",
                "spec.identity.dpop.proofWindow",
            ),
            (
                "    dpop: {proofWindow: 1h}\n",
                "spec.identity.dpop.proofWindow",
            ),
            (
                "    dpop: {algorithms: []}\n",
                "spec.identity.dpop.algorithms",
            ),
            (
                "    dpop: {algorithms: [ES256, ES256]}\n",
                "spec.identity.dpop.algorithms[1]",
            ),
            (
                "    clientCertificates: {header: Authorization, format: pem}\n",
                "spec.identity.clientCertificates.header",
            ),
            (
                "    clientCertificates: {header: lifeguard-subject, format: pem}\n",
                "spec.identity.clientCertificates.header",
            ),
            (
                "    clientCertificates: {header: \"bad header\", format: pem}\n",
                "spec.identity.clientCertificates.header",
            ),
            (
                "    clientCertificates: {header: x-cert, format: pem, trustedProxies: [10.0.0.0/33]}\n",
                "spec.identity.clientCertificates.trustedProxies[0]",
            ),
            (
                "    clientCertificates: {header: x-cert, format: pem, trustedProxies: []}\n",
                "spec.identity.clientCertificates.trustedProxies",
            ),
        ] {
            let c = compiled("", identity);
            assert!(c.effective.is_none(), "{identity}");
            assert_eq!(error_paths(&c), vec![path.to_owned()], "{identity}");
        }
    }
}
