//! Resource URI patterns for listen subscriptions: `*` matches any run of characters, and the
//! placeholders `{subject}`, `{tenant}` and `{client}` match the listener's own identity.

use serde::{Deserialize, Serialize};

/// An anchored pattern over a whole URI. `*` matches any run of characters, `/` included;
/// every other character matches itself. `reports://team-a/*` matches `reports://team-a/q3` and
/// `reports://team-a/q3/summary` but not `reports://team-a-other/q3`.
///
/// A placeholder matches exactly the listener's value of that identity field, literally (a `*`
/// in a tenant name is not a wildcard): `reports://{tenant}/*` lets a listener of tenant
/// `acme` subscribe to `reports://acme/q3` and nothing of another tenant. A listener whose
/// value is empty or holds a character that could change where a URI points (`/`, `?`, `#`,
/// `%`, `*`, spaces, anything outside RFC 3986's unreserved characters, `@`, `:` and the
/// sub-delimiters), or is `.` or `..`, matches no templated pattern: fail closed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct UriPattern(String);

/// The identity a templated pattern is expanded from (the listener's token).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PatternIdentity<'a> {
    pub subject: &'a str,
    pub tenant: &'a str,
    pub client: &'a str,
}

/// Why a pattern was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UriPatternError {
    #[error("pattern is empty")]
    Empty,
    #[error("pattern is longer than 2048 characters")]
    TooLong,
    #[error("pattern `*` alone would allow every resource; name a scheme or prefix")]
    MatchesEverything,
    #[error("pattern contains a control character")]
    ControlCharacter,
    #[error("unknown placeholder `{{{0}}}`; use {{subject}}, {{tenant}} or {{client}}")]
    UnknownPlaceholder(String),
    #[error("unbalanced `{{` or `}}`; braces only delimit {{subject}}, {{tenant}} or {{client}}")]
    UnbalancedBrace,
}

/// One step of a parsed pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step<'a> {
    Literal(&'a str),
    Star,
    Subject,
    Tenant,
    Client,
}

/// The pattern's steps; the text was validated by [`UriPattern::new`].
fn steps(pattern: &str) -> Result<Vec<Step<'_>>, UriPatternError> {
    let mut out = Vec::new();
    let mut rest = pattern;
    while !rest.is_empty() {
        let next = rest.find(['*', '{', '}']).unwrap_or(rest.len());
        if next > 0 {
            out.push(Step::Literal(&rest[..next]));
            rest = &rest[next..];
            continue;
        }
        if let Some(after) = rest.strip_prefix('*') {
            out.push(Step::Star);
            rest = after;
        } else if let Some(after) = rest.strip_prefix('{') {
            let close = after.find('}').ok_or(UriPatternError::UnbalancedBrace)?;
            let name = &after[..close];
            out.push(match name {
                "subject" => Step::Subject,
                "tenant" => Step::Tenant,
                "client" => Step::Client,
                _ if name.contains('{') => return Err(UriPatternError::UnbalancedBrace),
                _ => return Err(UriPatternError::UnknownPlaceholder(name.to_owned())),
            });
            rest = &after[close + 1..];
        } else {
            return Err(UriPatternError::UnbalancedBrace);
        }
    }
    Ok(out)
}

/// Whether an identity value may stand in a URI path segment as it is.
fn safe_in_uri(value: &str) -> bool {
    !value.is_empty()
        && value != "."
        && value != ".."
        && value.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'-' | b'.'
                        | b'_'
                        | b'~'
                        | b'@'
                        | b':'
                        | b'!'
                        | b'$'
                        | b'&'
                        | b'\''
                        | b'('
                        | b')'
                        | b'+'
                        | b','
                        | b';'
                        | b'='
                )
        })
}

/// A pattern byte after expansion: a literal byte, or a wildcard.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Token {
    Byte(u8),
    Star,
}

impl UriPattern {
    /// Validates and wraps a pattern.
    pub fn new(pattern: &str) -> Result<Self, UriPatternError> {
        if pattern.is_empty() {
            return Err(UriPatternError::Empty);
        }
        if pattern.len() > 2048 {
            return Err(UriPatternError::TooLong);
        }
        if pattern.chars().all(|c| c == '*') {
            return Err(UriPatternError::MatchesEverything);
        }
        if pattern.chars().any(char::is_control) {
            return Err(UriPatternError::ControlCharacter);
        }
        steps(pattern)?;
        Ok(Self(pattern.to_owned()))
    }

    /// The pattern text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether the pattern names a placeholder (`{subject}`, `{tenant}` or `{client}`).
    pub fn is_templated(&self) -> bool {
        steps(&self.0).is_ok_and(|s| {
            s.iter()
                .any(|step| matches!(step, Step::Subject | Step::Tenant | Step::Client))
        })
    }

    /// Whether the whole `uri` matches for a listener with identity `who`. Linear-time greedy
    /// matching with backtracking to the last `*` only, so hostile patterns or URIs cannot
    /// cause exponential work.
    pub fn matches(&self, uri: &str, who: &PatternIdentity<'_>) -> bool {
        let Ok(steps) = steps(&self.0) else {
            return false;
        };
        let mut pattern = Vec::with_capacity(self.0.len());
        for step in steps {
            let value = match step {
                Step::Star => {
                    pattern.push(Token::Star);
                    continue;
                }
                Step::Literal(text) => {
                    pattern.extend(text.bytes().map(Token::Byte));
                    continue;
                }
                Step::Subject => who.subject,
                Step::Tenant => who.tenant,
                Step::Client => who.client,
            };
            if !safe_in_uri(value) {
                return false;
            }
            pattern.extend(value.bytes().map(Token::Byte));
        }
        glob(&pattern, uri.as_bytes())
    }
}

/// Anchored match of `text` against `pattern`.
fn glob(pattern: &[Token], text: &[u8]) -> bool {
    let (mut p, mut t) = (0usize, 0usize);
    let mut last_star: Option<usize> = None;
    let mut star_text = 0usize;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == Token::Star {
            last_star = Some(p);
            star_text = t;
            p += 1;
        } else if p < pattern.len() && pattern[p] == Token::Byte(text[t]) {
            p += 1;
            t += 1;
        } else if let Some(star) = last_star {
            p = star + 1;
            star_text += 1;
            t = star_text;
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == Token::Star)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pat(s: &str) -> UriPattern {
        UriPattern::new(s).unwrap()
    }

    impl UriPattern {
        fn matches_plain(&self, uri: &str) -> bool {
            self.matches(uri, &PatternIdentity::default())
        }
    }

    fn who<'a>(subject: &'a str, tenant: &'a str, client: &'a str) -> PatternIdentity<'a> {
        PatternIdentity {
            subject,
            tenant,
            client,
        }
    }

    #[test]
    fn placeholders_match_the_listeners_own_identity_literally() {
        let p = pat("reports://{tenant}/*");
        assert!(p.is_templated());
        assert!(!pat("reports://team-a/*").is_templated());
        let acme = who("alice", "acme", "console");
        assert!(p.matches("reports://acme/q3", &acme));
        assert!(!p.matches("reports://globex/q3", &acme));
        assert!(!p.matches("reports://acme-other/q3", &acme));
        let files = pat("files://{tenant}/{subject}/*");
        assert!(files.matches(
            "files://acme/alice@example.com/a.txt",
            &who("alice@example.com", "acme", "")
        ));
        assert!(!files.matches("files://acme/bob/a.txt", &acme));
        assert!(pat("apps://{client}").matches("apps://console", &acme));
        // A wildcard in an identity value is a literal character, and never a wildcard.
        let starred = who("alice", "a*", "c");
        assert!(
            !p.matches("reports://a*/q3", &starred),
            "unsafe value: no match"
        );
        assert!(!p.matches("reports://abc/q3", &starred));
    }

    #[test]
    fn identity_values_that_could_redirect_a_uri_match_nothing() {
        let p = pat("reports://{tenant}/*");
        for tenant in [
            "", ".", "..", "a/b", "a?b", "a#b", "a%2fb", "a b", "a\\b", "é",
        ] {
            let t = who("alice", tenant, "c");
            let uri = format!("reports://{tenant}/x");
            assert!(!p.matches(&uri, &t), "{tenant:?}");
        }
        assert!(p.matches("reports://a.b_c~d/x", &who("alice", "a.b_c~d", "c")));
    }

    #[test]
    fn braces_only_delimit_known_placeholders() {
        assert_eq!(
            UriPattern::new("reports://{team}/*"),
            Err(UriPatternError::UnknownPlaceholder("team".into()))
        );
        for bad in [
            "reports://{tenant/*",
            "reports://tenant}/*",
            "reports://{{tenant}}/*",
        ] {
            assert_eq!(
                UriPattern::new(bad),
                Err(UriPatternError::UnbalancedBrace),
                "{bad}"
            );
        }
        assert_eq!(
            UriPattern::new("reports://{team}/*")
                .unwrap_err()
                .to_string(),
            "unknown placeholder `{team}`; use {subject}, {tenant} or {client}"
        );
    }

    #[test]
    fn star_matches_any_suffix_but_prefix_is_literal() {
        let p = pat("reports://team-a/*");
        assert!(p.matches_plain("reports://team-a/q3"));
        assert!(p.matches_plain("reports://team-a/q3/summary"));
        assert!(p.matches_plain("reports://team-a/"));
        assert!(!p.matches_plain("reports://team-a"));
        assert!(!p.matches_plain("reports://team-a-other/q3"));
        assert!(!p.matches_plain("reports://team-b/q3"));
    }

    #[test]
    fn patterns_are_anchored_at_both_ends() {
        let p = pat("file:///exact.txt");
        assert!(p.matches_plain("file:///exact.txt"));
        assert!(!p.matches_plain("file:///exact.txt.bak"));
        assert!(!p.matches_plain("xfile:///exact.txt"));
        let mid = pat("db://*/tables/orders");
        assert!(mid.matches_plain("db://eu/tables/orders"));
        assert!(!mid.matches_plain("db://eu/tables/orders2"));
    }

    #[test]
    fn rejects_empty_and_match_everything_patterns() {
        assert_eq!(UriPattern::new(""), Err(UriPatternError::Empty));
        assert_eq!(
            UriPattern::new("**"),
            Err(UriPatternError::MatchesEverything)
        );
        assert_eq!(
            UriPattern::new("a\nb"),
            Err(UriPatternError::ControlCharacter)
        );
    }

    #[test]
    fn many_stars_stay_fast() {
        let p = pat(&"a*".repeat(200));
        let text = "a".repeat(5000) + "b";
        assert!(p.matches_plain(&text));
    }
}
