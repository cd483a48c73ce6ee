//! Durations as written in Lifeguard resources: `90s`, `15m`, `2h`, `1h30m`, `250ms`.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Longest duration any Lifeguard field accepts (366 days). Keeps every derived deadline and
/// millisecond count far from integer overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(366 * 24 * 3600);

/// A non-negative duration in the Go `time.ParseDuration` syntax Kubernetes users know, kept
/// together with the text it was written as (so a manifest round-trips unchanged).
///
/// kube's own `Duration` type accepts the same syntax but multiplies floats without bounds, which
/// panics on input such as `1e30h`; a policy file must never be able to crash the sidecar, so
/// this type parses with checked integer arithmetic and a hard upper bound instead.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PolicyDuration {
    text: String,
    value: Duration,
}

/// Why a duration string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("empty duration; write it like 90s, 15m or 2h")]
    Empty,
    #[error("negative durations are not allowed")]
    Negative,
    #[error("expected a number at `{0}`; write it like 90s, 15m or 2h")]
    MissingNumber(String),
    #[error("missing unit after `{0}`; use one of ns, us, ms, s, m, h")]
    MissingUnit(String),
    #[error("unknown unit `{0}`; use one of ns, us, ms, s, m, h")]
    UnknownUnit(String),
    #[error("duration is longer than the maximum of 8784h (366 days)")]
    TooLong,
}

impl PolicyDuration {
    /// The parsed length.
    pub fn get(&self) -> Duration {
        self.value
    }

    /// The text as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl From<Duration> for PolicyDuration {
    /// Renders whole hours, minutes or seconds when exact, otherwise milliseconds.
    fn from(value: Duration) -> Self {
        let value = value.min(MAX_DURATION);
        let millis = value.as_millis();
        let text = if millis.is_multiple_of(3_600_000) && millis > 0 {
            format!("{}h", millis / 3_600_000)
        } else if millis.is_multiple_of(60_000) && millis > 0 {
            format!("{}m", millis / 60_000)
        } else if millis.is_multiple_of(1000) {
            format!("{}s", millis / 1000)
        } else {
            format!("{millis}ms")
        };
        Self {
            text,
            value: Duration::from_millis(millis as u64),
        }
    }
}

impl FromStr for PolicyDuration {
    type Err = DurationError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let value = parse_go_duration(text)?;
        Ok(Self {
            text: text.to_owned(),
            value,
        })
    }
}

/// Parses `([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+` into a duration, in whole nanoseconds.
fn parse_go_duration(text: &str) -> Result<Duration, DurationError> {
    if text.is_empty() {
        return Err(DurationError::Empty);
    }
    if text.starts_with('-') {
        return Err(DurationError::Negative);
    }
    const MAX_NANOS: u128 = MAX_DURATION.as_nanos();
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        if number.is_empty() || number.starts_with('.') || number.ends_with('.') {
            return Err(DurationError::MissingNumber(rest.to_owned()));
        }
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let unit_nanos: u128 = match unit {
            "" => return Err(DurationError::MissingUnit(number.to_owned())),
            "ns" => 1,
            "us" | "\u{00b5}s" | "\u{03bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            other => return Err(DurationError::UnknownUnit(other.to_owned())),
        };
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if fraction.contains('.') {
            return Err(DurationError::MissingNumber(rest.to_owned()));
        }
        // Digits beyond 40 cannot be represented anyway; such input is far over the maximum.
        if whole.len() > 20 || fraction.len() > 20 {
            return Err(DurationError::TooLong);
        }
        let whole: u128 = whole.parse().map_err(|_| DurationError::TooLong)?;
        let mut part = whole
            .checked_mul(unit_nanos)
            .ok_or(DurationError::TooLong)?;
        if !fraction.is_empty() {
            let digits: u128 = fraction.parse().map_err(|_| DurationError::TooLong)?;
            let scale = 10u128.pow(fraction.len() as u32);
            part += digits * unit_nanos / scale;
        }
        total = total.checked_add(part).ok_or(DurationError::TooLong)?;
        if total > MAX_NANOS {
            return Err(DurationError::TooLong);
        }
        rest = next;
    }
    // total <= MAX_NANOS, which fits in u64 nanoseconds.
    Ok(Duration::from_nanos(total as u64))
}

impl fmt::Display for PolicyDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Serialize for PolicyDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for PolicyDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = Cow::<'de, str>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl schemars::JsonSchema for PolicyDuration {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        // Not `format: duration`: that format means ISO 8601 in JSON Schema. The bounded length
        // keeps the API server's CEL cost estimate for `duration(self)` small.
        schemars::json_schema!({
            "type": "string",
            "maxLength": 32,
            "pattern": "^([0-9]+(\\.[0-9]+)?(ns|us|ms|s|m|h))+$",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Duration, DurationError> {
        s.parse::<PolicyDuration>().map(|d| d.get())
    }

    #[test]
    fn parses_go_duration_syntax() {
        assert_eq!(parse("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn rejects_malformed_and_hostile_input() {
        assert_eq!(parse(""), Err(DurationError::Empty));
        assert_eq!(parse("-5s"), Err(DurationError::Negative));
        assert_eq!(parse("15"), Err(DurationError::MissingUnit("15".into())));
        assert_eq!(parse("5d"), Err(DurationError::UnknownUnit("d".into())));
        assert_eq!(parse("m"), Err(DurationError::MissingNumber("m".into())));
        assert_eq!(parse("1e30h"), Err(DurationError::UnknownUnit("e".into())));
        assert_eq!(
            parse("99999999999999999999999h"),
            Err(DurationError::TooLong)
        );
        assert_eq!(parse("8785h"), Err(DurationError::TooLong));
        assert!(parse("8784h").is_ok());
    }

    #[test]
    fn round_trips_the_written_text() {
        let d: PolicyDuration = serde_json::from_str("\"1h30m\"").unwrap();
        assert_eq!(serde_json::to_string(&d).unwrap(), "\"1h30m\"");
        assert_eq!(
            PolicyDuration::from(Duration::from_secs(900)).as_str(),
            "15m"
        );
        assert_eq!(
            PolicyDuration::from(Duration::from_millis(1500)).as_str(),
            "1500ms"
        );
    }
}
