//! Resource URI patterns for listen subscriptions: `*` matches any run of characters.

use serde::{Deserialize, Serialize};

/// An anchored pattern over a whole URI. `*` matches any run of characters, `/` included;
/// every other character matches itself. `reports://team-a/*` matches `reports://team-a/q3` and
/// `reports://team-a/q3/summary` but not `reports://team-a-other/q3`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct UriPattern(String);

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
        Ok(Self(pattern.to_owned()))
    }

    /// The pattern text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether the whole `uri` matches. Linear-time greedy matching with backtracking to the
    /// last `*` only, so hostile patterns or URIs cannot cause exponential work.
    pub fn matches(&self, uri: &str) -> bool {
        let pattern = self.0.as_bytes();
        let text = uri.as_bytes();
        let (mut p, mut t) = (0usize, 0usize);
        let mut last_star: Option<usize> = None;
        let mut star_text = 0usize;
        while t < text.len() {
            if p < pattern.len() && pattern[p] == b'*' {
                last_star = Some(p);
                star_text = t;
                p += 1;
            } else if p < pattern.len() && pattern[p] == text[t] {
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
        pattern[p..].iter().all(|&c| c == b'*')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pat(s: &str) -> UriPattern {
        UriPattern::new(s).unwrap()
    }

    #[test]
    fn star_matches_any_suffix_but_prefix_is_literal() {
        let p = pat("reports://team-a/*");
        assert!(p.matches("reports://team-a/q3"));
        assert!(p.matches("reports://team-a/q3/summary"));
        assert!(p.matches("reports://team-a/"));
        assert!(!p.matches("reports://team-a"));
        assert!(!p.matches("reports://team-a-other/q3"));
        assert!(!p.matches("reports://team-b/q3"));
    }

    #[test]
    fn patterns_are_anchored_at_both_ends() {
        let p = pat("file:///exact.txt");
        assert!(p.matches("file:///exact.txt"));
        assert!(!p.matches("file:///exact.txt.bak"));
        assert!(!p.matches("xfile:///exact.txt"));
        let mid = pat("db://*/tables/orders");
        assert!(mid.matches("db://eu/tables/orders"));
        assert!(!mid.matches("db://eu/tables/orders2"));
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
        assert!(p.matches(&text));
    }
}
