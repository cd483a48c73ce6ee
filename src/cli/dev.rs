//! `lifeguard dev token`: sign a JWT with a local key.

use std::str::FromStr;

use anyhow::{Context, Result};
use jsonwebtoken::Algorithm;
use serde_json::json;

use std::path::Path;

use lifeguard::api::JwsAlgorithm;
use lifeguard::identity::dpop_mint::{DpopKey, ProofClaims};

use super::{DevDpopProofArgs, DevTokenArgs, DpopKeyAlg};

pub fn token(args: &DevTokenArgs) -> Result<()> {
    let key =
        std::fs::read(&args.key).with_context(|| format!("reading {}", args.key.display()))?;
    let alg = Algorithm::from_str(&args.alg).context("unknown algorithm")?;
    let now = jiff::Timestamp::now().as_second() - args.issued_ago.get().as_secs() as i64;
    let mut claims = json!({
        "iss": args.issuer,
        "aud": args.audience,
        "sub": args.subject,
        "iat": now,
        "nbf": now,
        "exp": now + args.ttl.get().as_secs() as i64,
        "scope": args.scope,
    });
    if let Some(t) = &args.tenant {
        claims["tid"] = json!(t);
    }
    if let Some(c) = &args.client {
        claims["client_id"] = json!(c);
    }
    if let Some(path) = &args.dpop_key {
        let alg = match args.dpop_alg {
            DpopKeyAlg::Es256 => JwsAlgorithm::ES256,
            DpopKeyAlg::EdDsa => JwsAlgorithm::EdDSA,
            DpopKeyAlg::Ps256 => JwsAlgorithm::PS256,
        };
        let key = dpop_key(path, Some(alg))?;
        claims["cnf"] = json!({"jkt": key.thumbprint()});
    }
    let token = lifeguard::identity::mint::mint_token(&key, alg, args.kid.as_deref(), &claims)?;
    println!("{token}");
    Ok(())
}

/// `lifeguard dev dpop-proof`: one proof for one request.
pub fn dpop_proof(args: &DevDpopProofArgs) -> Result<()> {
    let key = dpop_key(&args.dpop_key, None)?;
    let proof = key
        .proof(&ProofClaims {
            method: &args.htm,
            uri: &args.htu,
            access_token: args.token.as_deref(),
            iat: jiff::Timestamp::now().as_second(),
            jti: None,
            nonce: args.nonce.as_deref(),
        })
        .context("making the DPoP proof")?;
    println!("{proof}");
    Ok(())
}

/// The DPoP key in `path`; with `create`, a new one of that algorithm written there (mode
/// 0600) when the file does not exist.
fn dpop_key(path: &Path, create: Option<JwsAlgorithm>) -> Result<DpopKey> {
    match (std::fs::read_to_string(path), create) {
        (Ok(pem), _) => {
            DpopKey::from_pem(&pem).with_context(|| format!("reading {}", path.display()))
        }
        (Err(e), Some(alg)) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = DpopKey::generate_for(alg)?;
            write_private(path, &key.to_pem())
                .with_context(|| format!("writing the new DPoP key {}", path.display()))?;
            Ok(key)
        }
        (Err(e), _) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(text.as_bytes())
}
