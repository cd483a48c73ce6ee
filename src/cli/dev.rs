//! `lifeguard dev token`: sign a JWT with a local key.

use std::str::FromStr;

use anyhow::{Context, Result};
use jsonwebtoken::Algorithm;
use serde_json::json;

use super::DevTokenArgs;

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
    let token = lifeguard::identity::mint::mint_token(&key, alg, args.kid.as_deref(), &claims)?;
    println!("{token}");
    Ok(())
}
