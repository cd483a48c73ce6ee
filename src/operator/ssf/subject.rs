//! Subject identifiers of a SET's `sub_id` (RFC 9493, plus SSF's `complex`).
//!
//! Every format RFC 9493 and SSF define is parsed, so a SET is never refused for naming its
//! subject in a format Lifeguard does not revoke by; [`SubjectId::principal`] then decides
//! whether the subject names a principal. Legacy RISC transmitters write `subject_type` instead
//! of `format`; both are accepted (a `format` wins when both are present).

use serde_json::{Map, Value};

/// Longest identifier value accepted (the PrincipalRevocation limits are 1024 and 2048).
const MAX_VALUE_LEN: usize = 1024;

/// A subject identifier.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SubjectId {
    /// `iss_sub`: a subject as an issuer names it.
    IssSub { iss: String, sub: String },
    /// `email`.
    Email(String),
    /// `opaque`: an `id` meaningful to the transmitter.
    Opaque(String),
    /// `account`: an `acct:` URI.
    Account(String),
    /// `phone_number`.
    PhoneNumber(String),
    /// `did`.
    Did(String),
    /// `uri`.
    Uri(String),
    /// `aliases`: several identifiers of the same subject.
    Aliases(Vec<SubjectId>),
    /// SSF `complex`: a subject made of several simple ones.
    Complex(Box<ComplexSubject>),
}

/// The members of a `complex` subject; each is a simple identifier.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ComplexSubject {
    pub user: Option<SubjectId>,
    pub tenant: Option<SubjectId>,
    pub session: Option<SubjectId>,
    pub device: Option<SubjectId>,
    pub application: Option<SubjectId>,
    pub org_unit: Option<SubjectId>,
    pub group: Option<SubjectId>,
}

/// The principal a subject names, for a PrincipalRevocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// `None`: the SET's own issuer.
    pub issuer: Option<String>,
    pub subject: String,
    pub tenant: Option<String>,
}

/// How nested a subject may be when parsed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Nesting {
    /// Top level: any format.
    Any,
    /// Inside `complex` or `aliases`: simple formats only (no `complex`, no `aliases`).
    Simple,
}

impl SubjectId {
    /// Parses a `sub_id` object. The error says what is wrong, for the SET's refusal.
    pub fn parse(value: &Value) -> Result<Self, String> {
        parse(value, Nesting::Any)
    }

    /// The principal this subject names, when it names one.
    ///
    /// - `iss_sub`: that issuer and subject.
    /// - `email`, `opaque`, `account`: the SET's issuer (`issuer: None`) and that value. The
    ///   revocation matches tokens whose subject claim holds the value, so this suits issuers
    ///   whose policy uses that value as subject claim.
    /// - `aliases`: the first `iss_sub` among them (an email can be recycled, an issuer's
    ///   subject cannot), else the first other one that names a principal.
    /// - `complex`: its `user` names the principal; its `tenant`'s value narrows the revocation
    ///   to that tenant. Without a `user` it names no principal.
    /// - `phone_number`, `did`, `uri`: no principal.
    pub fn principal(&self) -> Option<Principal> {
        match self {
            Self::IssSub { iss, sub } => Some(Principal {
                issuer: Some(iss.clone()),
                subject: sub.clone(),
                tenant: None,
            }),
            Self::Email(value) | Self::Opaque(value) | Self::Account(value) => Some(Principal {
                issuer: None,
                subject: value.clone(),
                tenant: None,
            }),
            Self::PhoneNumber(_) | Self::Did(_) | Self::Uri(_) => None,
            Self::Aliases(ids) => ids
                .iter()
                .find(|id| matches!(id, Self::IssSub { .. }))
                .or_else(|| ids.iter().find(|id| id.principal().is_some()))
                .and_then(Self::principal),
            Self::Complex(complex) => {
                let mut principal = complex.user.as_ref()?.principal()?;
                principal.tenant = complex.tenant.as_ref().map(|t| t.value().to_owned());
                Some(principal)
            }
        }
    }

    /// The identifying value of a simple subject (`sub` for `iss_sub`).
    fn value(&self) -> &str {
        match self {
            Self::IssSub { sub, .. } => sub,
            Self::Email(v)
            | Self::Opaque(v)
            | Self::Account(v)
            | Self::PhoneNumber(v)
            | Self::Did(v)
            | Self::Uri(v) => v,
            Self::Aliases(ids) => ids.first().map_or("", Self::value),
            Self::Complex(_) => "",
        }
    }

    /// The format name, for logs.
    pub fn format(&self) -> &'static str {
        match self {
            Self::IssSub { .. } => "iss_sub",
            Self::Email(_) => "email",
            Self::Opaque(_) => "opaque",
            Self::Account(_) => "account",
            Self::PhoneNumber(_) => "phone_number",
            Self::Did(_) => "did",
            Self::Uri(_) => "uri",
            Self::Aliases(_) => "aliases",
            Self::Complex(_) => "complex",
        }
    }
}

fn parse(value: &Value, nesting: Nesting) -> Result<SubjectId, String> {
    let object = value
        .as_object()
        .ok_or("a subject identifier must be a JSON object")?;
    let format = object
        .get("format")
        .or_else(|| object.get("subject_type"))
        .ok_or("a subject identifier needs `format`")?
        .as_str()
        .ok_or("`format` must be a string")?;
    let member = |name: &str| text_member(object, format, name);
    let id = match format {
        "iss_sub" => SubjectId::IssSub {
            iss: member("iss")?,
            sub: member("sub")?,
        },
        "email" => SubjectId::Email(member("email")?),
        "opaque" => SubjectId::Opaque(member("id")?),
        "account" => SubjectId::Account(member("uri")?),
        "phone_number" => SubjectId::PhoneNumber(member("phone_number")?),
        "did" => SubjectId::Did(member("url")?),
        "uri" => SubjectId::Uri(member("uri")?),
        "aliases" | "complex" if nesting == Nesting::Simple => {
            return Err(format!("`{format}` cannot be nested"));
        }
        "aliases" => {
            let ids = object
                .get("identifiers")
                .and_then(Value::as_array)
                .filter(|ids| !ids.is_empty())
                .ok_or("`aliases` needs a non-empty `identifiers` array")?;
            SubjectId::Aliases(
                ids.iter()
                    .map(|id| parse(id, Nesting::Simple))
                    .collect::<Result<_, _>>()?,
            )
        }
        "complex" => SubjectId::Complex(Box::new(parse_complex(object)?)),
        other => return Err(format!("unknown subject identifier format `{other}`")),
    };
    Ok(id)
}

fn parse_complex(object: &Map<String, Value>) -> Result<ComplexSubject, String> {
    let member = |name: &str| {
        object
            .get(name)
            .map(|v| parse(v, Nesting::Simple).map_err(|e| format!("complex `{name}`: {e}")))
            .transpose()
    };
    let complex = ComplexSubject {
        user: member("user")?,
        tenant: member("tenant")?,
        session: member("session")?,
        device: member("device")?,
        application: member("application")?,
        org_unit: member("org_unit")?,
        group: member("group")?,
    };
    if complex == ComplexSubject::default() {
        return Err("a `complex` subject needs at least one member".into());
    }
    Ok(complex)
}

fn text_member(object: &Map<String, Value>, format: &str, name: &str) -> Result<String, String> {
    let text = object
        .get(name)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| format!("`{format}` subject needs a non-empty `{name}` string"))?;
    if text.len() > MAX_VALUE_LEN {
        return Err(format!("`{name}` is longer than {MAX_VALUE_LEN} bytes"));
    }
    Ok(text.to_owned())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn principal(value: Value) -> Option<Principal> {
        SubjectId::parse(&value).unwrap().principal()
    }

    #[test]
    fn simple_formats_name_principals() {
        assert_eq!(
            principal(json!({"format": "iss_sub", "iss": "https://idp", "sub": "alice"})),
            Some(Principal {
                issuer: Some("https://idp".into()),
                subject: "alice".into(),
                tenant: None
            })
        );
        for (value, expected) in [
            (
                json!({"format": "email", "email": "a@example.com"}),
                "a@example.com",
            ),
            (json!({"format": "opaque", "id": "u-1"}), "u-1"),
            (
                json!({"format": "account", "uri": "acct:a@example.com"}),
                "acct:a@example.com",
            ),
            // Legacy RISC spelling.
            (
                json!({"subject_type": "email", "email": "b@example.com"}),
                "b@example.com",
            ),
        ] {
            let p = principal(value).unwrap();
            assert_eq!((p.issuer, p.subject.as_str()), (None, expected));
        }
        assert_eq!(
            principal(json!({"format": "phone_number", "phone_number": "+1"})),
            None
        );
        assert_eq!(principal(json!({"format": "did", "url": "did:ex:1"})), None);
    }

    #[test]
    fn complex_takes_user_and_tenant() {
        let p = principal(json!({"format": "complex",
            "user": {"format": "iss_sub", "iss": "https://idp", "sub": "alice"},
            "tenant": {"format": "opaque", "id": "t-1"},
            "session": {"format": "opaque", "id": "s-9"}}))
        .unwrap();
        assert_eq!(p.issuer.as_deref(), Some("https://idp"));
        assert_eq!(p.subject, "alice");
        assert_eq!(p.tenant.as_deref(), Some("t-1"));
        assert_eq!(
            principal(json!({"format": "complex", "device": {"format": "opaque", "id": "d"}})),
            None
        );
    }

    #[test]
    fn aliases_prefer_iss_sub_over_email() {
        let p = principal(json!({"format": "aliases", "identifiers": [
            {"format": "email", "email": "a@example.com"},
            {"format": "iss_sub", "iss": "https://idp", "sub": "alice"}]}))
        .unwrap();
        assert_eq!(p.subject, "alice");
    }

    #[test]
    fn refuses_malformed_subjects() {
        for value in [
            json!("alice"),
            json!({"email": "a@example.com"}),
            json!({"format": "iss_sub", "iss": "https://idp"}),
            json!({"format": "email", "email": ""}),
            json!({"format": "complex"}),
            json!({"format": "complex", "user": {"format": "complex",
                   "user": {"format": "opaque", "id": "x"}}}),
            json!({"format": "aliases", "identifiers": []}),
            json!({"format": "martian", "id": "x"}),
            json!({"format": "opaque", "id": "x".repeat(MAX_VALUE_LEN + 1)}),
        ] {
            assert!(SubjectId::parse(&value).is_err(), "{value}");
        }
    }
}
