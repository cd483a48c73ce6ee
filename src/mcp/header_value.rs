//! Values of mirrored headers (`Mcp-Name`, `Mcp-Param-*`). Values that are not header-safe are
//! sent as `=?base64?{base64 of UTF-8}?=` and must be decoded before comparing with the body.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

const PREFIX: &str = "=?base64?";
const SUFFIX: &str = "?=";

/// The text a mirrored header value stands for, or `None` when it is malformed (bad base64 in
/// the sentinel form, or not UTF-8).
pub fn decode_mirrored(raw: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(raw).ok()?;
    match text
        .strip_prefix(PREFIX)
        .and_then(|rest| rest.strip_suffix(SUFFIX))
    {
        Some(encoded) => {
            let bytes = STANDARD.decode(encoded).ok()?;
            String::from_utf8(bytes).ok()
        }
        None => Some(text.to_owned()),
    }
}

/// Encodes a value for a mirrored header: as-is when header-safe (printable ASCII without
/// leading/trailing space), else in the base64 sentinel form.
pub fn encode_mirrored(value: &str) -> String {
    let safe = !value.is_empty()
        && value.bytes().all(|b| (0x20..0x7f).contains(&b))
        && !value.starts_with(' ')
        && !value.ends_with(' ')
        && !value.starts_with(PREFIX);
    if safe {
        value.to_owned()
    } else {
        format!("{PREFIX}{}{SUFFIX}", STANDARD.encode(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_values_pass_through() {
        assert_eq!(
            decode_mirrored(b"generate_report").as_deref(),
            Some("generate_report")
        );
    }

    #[test]
    fn sentinel_values_are_decoded() {
        let encoded = encode_mirrored("rapport_été");
        assert!(encoded.starts_with("=?base64?"));
        assert_eq!(
            decode_mirrored(encoded.as_bytes()).as_deref(),
            Some("rapport_été")
        );
    }

    #[test]
    fn malformed_sentinels_are_rejected() {
        assert_eq!(decode_mirrored(b"=?base64?not base64!?="), None);
        assert_eq!(decode_mirrored(&[0xff, 0xfe]), None);
        // Valid base64 of invalid UTF-8.
        assert_eq!(decode_mirrored(b"=?base64?//4=?="), None);
    }
}
