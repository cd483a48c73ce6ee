//! Where each field of a manifest is written: field paths in API-server notation
//! (`spec.identity.issuers[0].claims`) mapped to 1-based line numbers, so a finding can point at
//! the line a reviewer has to change (`lifeguard policy check --output github` annotates it).
//!
//! The YAML is read a second time by the same parser (serde-saphyr) into a tree that keeps
//! only keys, sequence positions and their lines; values are not kept.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

/// One document's fields and their lines.
#[derive(Clone, Debug, Default)]
pub struct DocumentLines {
    /// The line the document's content starts on.
    first_line: u32,
    root: Node,
}

#[derive(Clone, Debug, Default)]
enum Node {
    #[default]
    Null,
    Scalar,
    /// Keys (as text), the line each key is written on, and its value.
    Map(Vec<(String, u32, Node)>),
    /// Each element's line and value.
    Seq(Vec<(u32, Node)>),
}

impl DocumentLines {
    /// The line of `path`: of the deepest field along it that is written in the document (a
    /// field that is missing points at its parent), or the document's first line.
    pub fn line_of(&self, path: &str) -> u32 {
        walk(&self.root, path, self.first_line)
    }
}

/// The lines of every non-empty document of `text`, in the order and numbering of
/// [`super::manifest::parse_manifests`]; empty when the text is not YAML.
pub fn document_lines(text: &str) -> Vec<DocumentLines> {
    let Ok(documents) = serde_saphyr::from_multiple::<Spanned<Node>>(text) else {
        return Vec::new();
    };
    documents
        .into_iter()
        .filter(|d| !matches!(d.value, Node::Null))
        .map(|d| DocumentLines {
            first_line: first_line(&d.value).unwrap_or(line(&d)),
            root: d.value,
        })
        .collect()
}

/// The line a YAML syntax error is reported at, when the parser knows it.
pub fn syntax_error_line(text: &str) -> Option<u32> {
    let error = serde_saphyr::from_multiple::<de::IgnoredAny>(text).err()?;
    let line = error.location()?.line();
    u32::try_from(line).ok().filter(|line| *line > 0)
}

/// The line of the first key of a mapping (a document's `Spanned` points at its first token,
/// which for a mapping is that key too, but a leading comment can shift it).
fn first_line(node: &Node) -> Option<u32> {
    match node {
        Node::Map(entries) => entries.first().map(|(_, line, _)| *line),
        Node::Seq(items) => items.first().map(|(line, _)| *line),
        Node::Null | Node::Scalar => None,
    }
}

fn line<T>(spanned: &Spanned<T>) -> u32 {
    u32::try_from(spanned.referenced.line()).unwrap_or(u32::MAX)
}

fn walk(node: &Node, path: &str, here: u32) -> u32 {
    let rest = path.strip_prefix('.').unwrap_or(path);
    if rest.is_empty() {
        return here;
    }
    match node {
        Node::Map(entries) => {
            // The longest key that the path continues with: keys may hold dots themselves
            // (`matchLabels.app.kubernetes.io/name`).
            let found = entries
                .iter()
                .filter(|(key, ..)| {
                    rest.strip_prefix(key.as_str())
                        .is_some_and(|after| after.is_empty() || after.starts_with(['.', '[']))
                })
                .max_by_key(|(key, ..)| key.len());
            match found {
                Some((key, line, child)) => walk(child, &rest[key.len()..], *line),
                None => here,
            }
        }
        Node::Seq(items) => {
            let Some((index, after)) = rest
                .strip_prefix('[')
                .and_then(|r| r.split_once(']'))
                .and_then(|(i, after)| Some((i.parse::<usize>().ok()?, after)))
            else {
                return here;
            };
            match items.get(index) {
                Some((line, child)) => walk(child, after, *line),
                None => here,
            }
        }
        Node::Null | Node::Scalar => here,
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_i128<E: de::Error>(self, _: i128) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_u128<E: de::Error>(self, _: u128) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<Node, E> {
        Ok(Node::Scalar)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Node, D::Error> {
        Node::deserialize(deserializer)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Spanned<Node>>()? {
            items.push((line(&item), item.value));
        }
        Ok(Node::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<Spanned<KeyText>>()? {
            let value = map.next_value::<Node>()?;
            entries.push((key.value.0.clone(), line(&key), value));
        }
        Ok(Node::Map(entries))
    }
}

/// A mapping key as text, whatever scalar it is written as.
struct KeyText(String);

impl<'de> Deserialize<'de> for KeyText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = KeyText;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mapping key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<KeyText, E> {
                Ok(KeyText(v.to_owned()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<KeyText, E> {
                Ok(KeyText(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<KeyText, E> {
                Ok(KeyText(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<KeyText, E> {
                Ok(KeyText(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<KeyText, E> {
                Ok(KeyText(v.to_string()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<KeyText, E> {
                Ok(KeyText("null".to_owned()))
            }
        }
        deserializer.deserialize_any(KeyVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# a leading comment
apiVersion: lifeguard.dev/v1alpha1
kind: McpServerPolicy
metadata:
  name: reports
  labels: {app.kubernetes.io/name: reports}
spec:
  identity:
    issuers:
      - issuer: https://idp.example.com
        audiences: [https://a.example.com]
      - issuer: https://other.example.com
        claims:
          subject: sub
  tasks:
    retention: {maxTtl: 1h}
---
---
kind: PrincipalRevocation
spec:
  subject: alice
"#;

    #[test]
    fn paths_point_at_the_line_of_their_key_or_element() {
        let docs = document_lines(TEXT);
        assert_eq!(
            docs.len(),
            2,
            "empty documents are skipped like parse_manifests does"
        );
        let policy = &docs[0];
        assert_eq!(policy.line_of(""), 2);
        assert_eq!(policy.line_of("kind"), 3);
        assert_eq!(policy.line_of("metadata.name"), 5);
        assert_eq!(policy.line_of("spec.identity.issuers"), 9);
        assert_eq!(policy.line_of("spec.identity.issuers[1]"), 12);
        assert_eq!(
            policy.line_of("spec.identity.issuers[1].claims.subject"),
            14
        );
        assert_eq!(policy.line_of("spec.identity.issuers[0].audiences[0]"), 11);
        // Flow style: the key's line.
        assert_eq!(policy.line_of("spec.tasks.retention.maxTtl"), 16);
        // A key with dots in it.
        assert_eq!(policy.line_of("metadata.labels.app.kubernetes.io/name"), 6);
        assert_eq!(docs[1].line_of("spec.subject"), 21);
    }

    #[test]
    fn missing_fields_point_at_their_nearest_written_parent() {
        let docs = document_lines(TEXT);
        assert_eq!(docs[0].line_of("spec.tasks.deadline.max"), 15);
        assert_eq!(docs[0].line_of("spec.identity.issuers[7].issuer"), 9);
        assert_eq!(docs[0].line_of("status"), 2);
    }

    #[test]
    fn text_that_is_not_yaml_has_no_lines_but_its_error_has_one() {
        let text = "kind: McpServerPolicy\nspec:\n  tools: [unclosed\n";
        assert!(document_lines(text).is_empty());
        assert!(syntax_error_line(text).is_some_and(|line| (2..=4).contains(&line)));
        assert_eq!(syntax_error_line(TEXT), None);
    }
}
