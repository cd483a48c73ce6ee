//! Fuzz target: listen resource-URI patterns (`policy::UriPattern`) and listen filters
//! (`mcp::listen::ListenFilter`).
//!
//! Modes (first byte mod 2):
//! - 0: the rest is `pattern`, `uri`, `subject`, `tenant`, `client`, NUL-separated;
//! - 1: the rest is a `params.notifications` JSON value.
//!
//! Asserts: `matches` agrees with a plain reference matcher written from the documentation (an
//! anchored glob where `*` matches any run and a placeholder matches the listener's value
//! literally, and only a URI-safe value); it gives the same answer for the pattern with runs of
//! `*` collapsed; a pattern survives its serde round trip; a filter accepted from a client is
//! the filter its wire form parses to, strictly and leniently.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lifeguard::mcp::listen::{ListenFilter, is_plain_resource_uri};
use lifeguard::mcp::strict_json;
use lifeguard::policy::{PatternIdentity, UriPattern};
use lifeguard_fuzz::{fields, mode};

/// An identity value a placeholder may expand to: RFC 3986 unreserved characters, `@`, `:`
/// and the sub-delimiters; not empty, `.` or `..`.
fn uri_safe(value: &str) -> bool {
    !value.is_empty()
        && value != "."
        && value != ".."
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~@:!$&'()*+,;=".contains(&b) && b != b'*')
}

#[derive(Clone, Copy, PartialEq)]
enum Token {
    Byte(u8),
    Star,
}

/// The pattern with placeholders expanded, or `None` when a value is unsafe.
fn expand(pattern: &str, who: &PatternIdentity<'_>) -> Option<Vec<Token>> {
    let mut out = Vec::new();
    let mut rest = pattern;
    while let Some(c) = rest.chars().next() {
        if c == '*' {
            out.push(Token::Star);
            rest = &rest[1..];
            continue;
        }
        let placeholder = [
            ("{subject}", who.subject),
            ("{tenant}", who.tenant),
            ("{client}", who.client),
        ]
        .into_iter()
        .find(|(name, _)| rest.starts_with(name));
        if let Some((name, value)) = placeholder {
            if !uri_safe(value) {
                return None;
            }
            out.extend(value.bytes().map(Token::Byte));
            rest = &rest[name.len()..];
            continue;
        }
        out.extend(c.to_string().bytes().map(Token::Byte));
        rest = &rest[c.len_utf8()..];
    }
    Some(out)
}

/// Anchored glob by dynamic programming: `can[i][j]` = pattern[i..] matches text[j..].
fn reference(pattern: &[Token], text: &[u8]) -> bool {
    let width = text.len() + 1;
    let mut can = vec![false; (pattern.len() + 1) * width];
    can[pattern.len() * width + text.len()] = true;
    for i in (0..pattern.len()).rev() {
        for j in (0..=text.len()).rev() {
            can[i * width + j] = match pattern[i] {
                Token::Star => {
                    can[(i + 1) * width + j] || (j < text.len() && can[i * width + j + 1])
                }
                Token::Byte(b) => j < text.len() && text[j] == b && can[(i + 1) * width + j + 1],
            };
        }
    }
    can[0]
}

fn collapse_stars(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len());
    for c in pattern.chars() {
        if !(c == '*' && out.ends_with('*')) {
            out.push(c);
        }
    }
    out
}

fn patterns(data: &[u8]) {
    let [pattern, uri, subject, tenant, client] = fields::<5>(data);
    let (Ok(pattern), Ok(uri), Ok(subject), Ok(tenant), Ok(client)) = (
        std::str::from_utf8(pattern),
        std::str::from_utf8(uri),
        std::str::from_utf8(subject),
        std::str::from_utf8(tenant),
        std::str::from_utf8(client),
    ) else {
        return;
    };
    // Keep the reference matcher's table small.
    if pattern.len() * uri.len() > 1 << 20 {
        return;
    }
    let Ok(compiled) = UriPattern::new(pattern) else {
        return;
    };
    let who = PatternIdentity {
        subject,
        tenant,
        client,
    };
    let matched = compiled.matches(uri, &who);
    let expected = expand(pattern, &who).is_some_and(|tokens| reference(&tokens, uri.as_bytes()));
    assert_eq!(matched, expected, "{pattern:?} against {uri:?} for {who:?}");
    let collapsed = UriPattern::new(&collapse_stars(pattern)).expect("collapsing keeps it valid");
    assert_eq!(collapsed.matches(uri, &who), matched);
    assert_eq!(collapsed.is_templated(), compiled.is_templated());
    let json = serde_json::to_string(&compiled).unwrap();
    assert_eq!(serde_json::from_str::<UriPattern>(&json).unwrap(), compiled);
}

fn filter(data: &[u8]) {
    let Ok(value) = strict_json::from_slice(data) else {
        return;
    };
    for declares_tasks in [false, true] {
        let Ok(filter) = ListenFilter::parse_request(Some(&value), declares_tasks) else {
            continue;
        };
        assert!(
            filter
                .resource_subscriptions
                .iter()
                .all(|u| is_plain_resource_uri(u))
        );
        let wire = filter.to_wire();
        assert_eq!(
            ListenFilter::parse_request(Some(&wire), true),
            Ok(filter.clone())
        );
        assert_eq!(ListenFilter::parse_ack(Some(&wire)), filter);
        assert_eq!(filter.intersect(&filter), filter);
        assert_eq!(filter.is_empty(), filter.entries() == 0);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((mode, rest)) = mode(data) else {
        return;
    };
    if mode % 2 == 0 {
        patterns(rest);
    } else {
        filter(rest);
    }
});
