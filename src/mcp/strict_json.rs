//! JSON parsed the way a security boundary must: an object with the same key twice, at any
//! depth, is refused. Peers disagree about which occurrence counts (serde keeps the last, many
//! servers the first), so a duplicate lets a message say one thing to the sidecar and another
//! to the server.

use std::fmt;

use serde::Deserializer;
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Why bytes are not acceptable JSON.
#[derive(Debug, thiserror::Error)]
pub enum StrictJsonError {
    #[error("duplicate key {0:?}")]
    DuplicateKey(String),
    #[error("not JSON: {0}")]
    Syntax(String),
}

/// Parses `bytes` as JSON, refusing duplicate object keys at any depth.
pub fn from_slice(bytes: &[u8]) -> Result<Value, StrictJsonError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = StrictValue.deserialize(&mut de).map_err(classify)?;
    de.end().map_err(classify)?;
    Ok(value)
}

/// Parses a string (an SSE event's data) like [`from_slice`].
pub fn from_str(text: &str) -> Result<Value, StrictJsonError> {
    from_slice(text.as_bytes())
}

/// Checks `bytes` like [`from_slice`] without building a tree: for callers that pass the bytes
/// on (or read a few fields of them) but must refuse what [`from_slice`] refuses.
pub fn check_slice(bytes: &[u8]) -> Result<(), StrictJsonError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    StrictCheck.deserialize(&mut de).map_err(classify)?;
    de.end().map_err(classify)
}

const DUPLICATE: &str = "lifeguard-duplicate-key:";

fn classify(e: serde_json::Error) -> StrictJsonError {
    let text = e.to_string();
    match text.strip_prefix(DUPLICATE) {
        Some(rest) => {
            // serde_json appends " at line L column C".
            let key = rest.rsplit_once(" at line ").map_or(rest, |(k, _)| k);
            StrictJsonError::DuplicateKey(key.to_owned())
        }
        None => StrictJsonError::Syntax(text),
    }
}

#[derive(Clone, Copy)]
struct StrictValue;

impl<'de> DeserializeSeed<'de> for StrictValue {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StrictValue {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        while let Some(item) = seq.next_element_seed(StrictValue)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value_seed(StrictValue)?;
            if out.contains_key(&key) {
                return Err(de::Error::custom(format_args!("{DUPLICATE}{key}")));
            }
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

/// Walks a value, refusing duplicate keys; keeps nothing but the keys of the object it is in.
#[derive(Clone, Copy)]
struct StrictCheck;

impl<'de> DeserializeSeed<'de> for StrictCheck {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

/// An object key, borrowed from the input unless it had to be unescaped.
pub(crate) struct Key<'de>(pub std::borrow::Cow<'de, str>);

impl<'de> serde::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object key")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

impl<'de> Visitor<'de> for StrictCheck {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_none<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(StrictCheck)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut keys: Vec<Key<'de>> = Vec::new();
        while let Some(key) = map.next_key::<Key<'de>>()? {
            map.next_value_seed(StrictCheck)?;
            if keys.iter().any(|k| k.0 == key.0) {
                return Err(de::Error::custom(format_args!("{DUPLICATE}{}", key.0)));
            }
            keys.push(key);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn parses_like_serde_json_when_keys_are_unique() {
        let text = r#"{"a":[1,-2,3.5,"x",null,true,{"b":{}}],"c":"\u00e9"}"#;
        assert_eq!(
            from_str(text).unwrap(),
            serde_json::from_str::<Value>(text).unwrap()
        );
        assert_eq!(from_str("7").unwrap(), json!(7));
    }

    #[test]
    fn refuses_duplicate_keys_at_any_depth_even_when_escaped() {
        for (text, key) in [
            (
                r#"{"method":"tools/list","method":"tasks/cancel"}"#,
                "method",
            ),
            (r#"{"params":{"name":"a","name":"b"}}"#, "name"),
            (r#"{"a":[{"x":1,"x":1}]}"#, "x"),
            (r#"{"method":1,"m\u0065thod":2}"#, "method"),
        ] {
            match from_str(text) {
                Err(StrictJsonError::DuplicateKey(k)) => assert_eq!(k, key, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
            match check_slice(text.as_bytes()) {
                Err(StrictJsonError::DuplicateKey(k)) => assert_eq!(k, key, "check {text}"),
                other => panic!("check {text}: {other:?}"),
            }
        }
    }

    #[test]
    fn refuses_syntax_errors_and_trailing_data() {
        assert!(matches!(from_str("{"), Err(StrictJsonError::Syntax(_))));
        assert!(matches!(from_str("{} {}"), Err(StrictJsonError::Syntax(_))));
        for text in ["{", "{} {}", "[1,]", r#"{"a":}"#] {
            assert!(
                matches!(
                    check_slice(text.as_bytes()),
                    Err(StrictJsonError::Syntax(_))
                ),
                "{text}"
            );
        }
    }

    #[test]
    fn the_check_accepts_what_the_parser_accepts() {
        for text in [
            r#"{"a":[1,-2,3.5,"x",null,true,{"b":{}}],"c":"\u00e9"}"#,
            r#"{"a":{"x":1},"b":{"x":1}}"#,
            "7",
        ] {
            assert!(from_str(text).is_ok(), "{text}");
            assert!(check_slice(text.as_bytes()).is_ok(), "{text}");
        }
    }
}
