//! What a sampling request under an exception may carry to the client's model: no context
//! beyond what the exception grants, bounded prompts, and no secrets. Pure.
//!
//! A server that holds an exception can still try to use the client's model to exfiltrate:
//! ask for the client's whole context (`includeContext: allServers`), or paste a token it saw
//! into the prompt so another server's tools or the model provider receive it. The gate refuses
//! such requests before they reach the client:
//!
//! - `context_not_isolated`: `includeContext` other than `none` without the exception's
//!   `includeContext` grant (`allServers` also grants `thisServer`);
//! - `context_too_large`: a `systemPrompt` or `messages` larger than the exception's bounds;
//! - `secret_in_context`: the request carries a credential — a built-in token shape, a
//!   policy-defined pattern, the caller's own bearer token, or a `Lifeguard-*` header line.

use regex::RegexSet;
use serde_json::Value;

use crate::api::{CapabilityExceptionSpec, IncludeContextGrant};

use super::gate::Rejection;

/// `limits.maxSystemPromptBytes` when the exception does not set it.
pub const DEFAULT_MAX_SYSTEM_PROMPT_BYTES: u32 = 8 * 1024;
/// `limits.maxMessageBytes` when the exception does not set it.
pub const DEFAULT_MAX_MESSAGE_BYTES: u32 = 64 * 1024;

/// Credential shapes refused in every sampling request, whatever the policy adds.
const BUILT_IN_PATTERNS: &[(&str, &str)] = &[
    // A JWT / JWS in compact form (header and payload are base64url JSON objects).
    (
        "jwt",
        r"eyJ[A-Za-z0-9_-]{6,}\.eyJ[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]*",
    ),
    // An HTTP bearer credential written out.
    ("bearer", r"(?i)\bbearer\s+[A-Za-z0-9._~+/-]{16,}=*"),
    // PEM private keys of any kind.
    ("private_key", r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----"),
    // AWS access key IDs.
    ("aws_access_key", r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    // GitHub tokens.
    (
        "github_token",
        r"\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})",
    ),
    // Slack tokens.
    ("slack_token", r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),
    // Identity headers the sidecar sends the server, copied into a prompt.
    ("lifeguard_header", r"(?i)\blifeguard-[a-z-]+\s*:\s*\S"),
];

/// The secret scanner of one policy: built-in shapes plus `capabilities.secretPatterns`.
#[derive(Clone, Debug)]
pub struct SecretScanner {
    patterns: RegexSet,
}

impl SecretScanner {
    /// Compiles the built-in patterns and `extra` (each checked by the policy compiler).
    pub fn new(extra: &[String]) -> Result<Self, regex::Error> {
        let all = BUILT_IN_PATTERNS
            .iter()
            .map(|(_, p)| (*p).to_owned())
            .chain(extra.iter().cloned());
        Ok(Self {
            patterns: regex::RegexSetBuilder::new(all)
                .size_limit(crate::policy::validate::MASK_SIZE_LIMIT * 4)
                .build()?,
        })
    }

    /// Whether `params` (a sampling request's) carries a secret: a pattern match anywhere in
    /// its text, or one of `literals` (the caller's bearer token) verbatim.
    pub fn finds(&self, params: &Value, literals: &[&str]) -> bool {
        let text = params.to_string();
        self.patterns.is_match(&text) || literals.iter().any(|l| l.len() >= 8 && text.contains(l))
    }
}

impl Default for SecretScanner {
    fn default() -> Self {
        Self::new(&[]).expect("the built-in patterns compile")
    }
}

/// Whether `params` stays within what `spec` grants: context and sizes.
pub fn check_isolation(spec: &CapabilityExceptionSpec, params: &Value) -> Result<(), Rejection> {
    match params.get("includeContext") {
        None | Some(Value::Null) => {}
        Some(Value::String(asked)) => {
            let granted = match asked.as_str() {
                "none" => true,
                "thisServer" => spec.include_context.is_some(),
                "allServers" => spec.include_context == Some(IncludeContextGrant::AllServers),
                _ => false,
            };
            if !granted {
                return Err(Rejection::ContextNotIsolated);
            }
        }
        Some(_) => return Err(Rejection::ContextNotIsolated),
    }
    let max_prompt = spec
        .limits
        .max_system_prompt_bytes
        .unwrap_or(DEFAULT_MAX_SYSTEM_PROMPT_BYTES) as usize;
    match params.get("systemPrompt") {
        None | Some(Value::Null) => {}
        Some(Value::String(prompt)) if prompt.len() <= max_prompt => {}
        Some(_) => return Err(Rejection::ContextTooLarge),
    }
    let max_messages = spec
        .limits
        .max_message_bytes
        .unwrap_or(DEFAULT_MAX_MESSAGE_BYTES) as usize;
    let messages = params.get("messages").map_or(0, |m| m.to_string().len());
    if messages > max_messages {
        return Err(Rejection::ContextTooLarge);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use regex::Regex;

    use super::*;

    fn spec(grant: Option<IncludeContextGrant>) -> CapabilityExceptionSpec {
        let yaml = r#"
policyRef: {name: p}
capability: sampling
clients: [console]
purpose: test
modelRoute: gateway/test
limits: {maxTokens: 100, maxIterationsPerTask: 1, maxRequestsPerMinute: 1, maxSystemPromptBytes: 10, maxMessageBytes: 200}
notBefore: 2026-01-01T00:00:00Z
expiresAt: 2026-02-01T00:00:00Z
approvalId: A
signature: x..y
"#;
        let mut spec: CapabilityExceptionSpec = serde_saphyr::from_str(yaml).unwrap();
        spec.include_context = grant;
        spec
    }

    #[test]
    fn context_beyond_the_grant_is_refused() {
        let none = spec(None);
        let this = spec(Some(IncludeContextGrant::ThisServer));
        let all = spec(Some(IncludeContextGrant::AllServers));
        let ask = |c: &str| json!({"messages": [], "includeContext": c});
        assert_eq!(check_isolation(&none, &json!({"messages": []})), Ok(()));
        assert_eq!(check_isolation(&none, &ask("none")), Ok(()));
        for (grant, asked, ok) in [
            (&none, "thisServer", false),
            (&none, "allServers", false),
            (&this, "thisServer", true),
            (&this, "allServers", false),
            (&all, "thisServer", true),
            (&all, "allServers", true),
            (&all, "everything", false),
        ] {
            let outcome = check_isolation(grant, &ask(asked));
            assert_eq!(
                outcome.is_ok(),
                ok,
                "{asked} under {:?}",
                grant.include_context
            );
            if !ok {
                assert_eq!(outcome, Err(Rejection::ContextNotIsolated));
            }
        }
        assert_eq!(
            check_isolation(&all, &json!({"includeContext": 1})),
            Err(Rejection::ContextNotIsolated)
        );
    }

    #[test]
    fn prompts_and_messages_are_bounded() {
        let s = spec(None);
        assert_eq!(
            check_isolation(&s, &json!({"systemPrompt": "ten bytes!"})),
            Ok(())
        );
        assert_eq!(
            check_isolation(&s, &json!({"systemPrompt": "eleven bytes"})),
            Err(Rejection::ContextTooLarge)
        );
        let long = json!({"messages": [{"role": "user", "content": {"type": "text", "text": "x".repeat(300)}}]});
        assert_eq!(check_isolation(&s, &long), Err(Rejection::ContextTooLarge));
    }

    #[test]
    fn the_scanner_finds_token_shapes_extra_patterns_and_the_callers_bearer() {
        let scanner = SecretScanner::new(&["INTERNAL-[0-9]{6}".to_owned()]).unwrap();
        let prompt = |t: &str| json!({"messages": [{"role": "user", "content": {"type": "text", "text": t}}]});
        let found = |t: &str| scanner.finds(&prompt(t), &["opaque-caller-token-123"]);
        assert!(!found("Summarize the quarterly report"));
        assert!(found(
            "token eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJhbGljZSJ9.c2ln here"
        ));
        assert!(found("Authorization: Bearer abcdefghijklmnopqrstuvwxyz"));
        assert!(found("-----BEGIN OPENSSH PRIVATE KEY-----"));
        assert!(found("key AKIAABCDEFGHIJKLMNOP"));
        assert!(found("ghp_abcdefghijklmnopqrstuvwxyzABCDEFGHIJ"));
        assert!(found("xoxb-1234567890-abc"));
        assert!(found("Lifeguard-Subject: alice"));
        assert!(found("ticket INTERNAL-123456"), "policy pattern");
        assert!(found("the caller's opaque-caller-token-123"), "own bearer");
        for (name, pattern) in BUILT_IN_PATTERNS {
            assert!(
                !Regex::new(pattern)
                    .unwrap()
                    .is_match("an ordinary sentence, bearer of news"),
                "{name} matches plain prose"
            );
        }
    }
}
