//! The OpenTelemetry trace settings of a serving subcommand, read from the standard environment
//! variables (the OpenTelemetry SDK configuration specification). Pure: the environment is
//! passed in, so every combination is unit-tested; a value that makes no sense is an error
//! naming the variable, and the process does not start.

use std::fmt;

/// How spans travel to the collector (`OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OtlpProtocol {
    Grpc,
    HttpProtobuf,
    HttpJson,
}

impl OtlpProtocol {
    /// The protocol a value of `OTEL_EXPORTER_OTLP_PROTOCOL` names, exactly as spelled there.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "grpc" => Some(Self::Grpc),
            "http/protobuf" => Some(Self::HttpProtobuf),
            "http/json" => Some(Self::HttpJson),
            _ => None,
        }
    }
}

impl fmt::Display for OtlpProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Grpc => "grpc",
            Self::HttpProtobuf => "http/protobuf",
            Self::HttpJson => "http/json",
        })
    }
}

/// Which traces are recorded (`OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SamplerChoice {
    AlwaysOn,
    AlwaysOff,
    TraceIdRatio(f64),
    ParentBasedAlwaysOn,
    ParentBasedAlwaysOff,
    ParentBasedTraceIdRatio(f64),
}

/// Where and how a serving subcommand exports its spans.
#[derive(Clone, Debug, PartialEq)]
pub struct OtelConfig {
    /// The URL spans are sent to: for HTTP the full `/v1/traces` URL, for gRPC the collector.
    pub endpoint: String,
    pub protocol: OtlpProtocol,
    /// `service.name` (`OTEL_SERVICE_NAME`, else the subcommand's default).
    pub service_name: String,
    pub sampler: SamplerChoice,
}

/// Reads the settings with `env` (a variable's value, `None` when unset). `Ok(None)`: nothing is
/// exported (no endpoint, or `OTEL_SDK_DISABLED=true`).
pub fn from_env(
    env: impl Fn(&str) -> Option<String>,
    default_service: &str,
) -> Result<Option<OtelConfig>, String> {
    let set = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    if let Some(disabled) = set("OTEL_SDK_DISABLED") {
        match disabled.trim().to_ascii_lowercase().as_str() {
            "true" => return Ok(None),
            "false" => {}
            other => {
                return Err(format!("OTEL_SDK_DISABLED={other}: expected true or false"));
            }
        }
    }
    let protocol = match set("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .map(|v| ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", v))
        .or_else(|| set("OTEL_EXPORTER_OTLP_PROTOCOL").map(|v| ("OTEL_EXPORTER_OTLP_PROTOCOL", v)))
    {
        Some((name, value)) => OtlpProtocol::parse(value.trim())
            .ok_or_else(|| format!("{name}={value}: expected grpc, http/protobuf or http/json"))?,
        // The specification's default.
        None => OtlpProtocol::HttpProtobuf,
    };
    let endpoint = if let Some(url) = set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
        // Used as it is, whatever the protocol.
        checked_url("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", url.trim())?
    } else if let Some(base) = set("OTEL_EXPORTER_OTLP_ENDPOINT") {
        let base = checked_url("OTEL_EXPORTER_OTLP_ENDPOINT", base.trim())?;
        match protocol {
            OtlpProtocol::Grpc => base,
            // For HTTP the signal's path is appended to the base URL.
            OtlpProtocol::HttpProtobuf | OtlpProtocol::HttpJson => {
                format!("{}/v1/traces", base.trim_end_matches('/'))
            }
        }
    } else {
        return Ok(None);
    };
    let service_name = set("OTEL_SERVICE_NAME")
        .map(|v| v.trim().to_owned())
        .unwrap_or_else(|| default_service.to_owned());
    Ok(Some(OtelConfig {
        endpoint,
        protocol,
        service_name,
        sampler: sampler(set("OTEL_TRACES_SAMPLER"), set("OTEL_TRACES_SAMPLER_ARG"))?,
    }))
}

fn checked_url(name: &str, value: &str) -> Result<String, String> {
    match url::Url::parse(value) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.host().is_some() => {
            Ok(value.to_owned())
        }
        Ok(_) => Err(format!(
            "{name}={value}: expected an http:// or https:// URL"
        )),
        Err(e) => Err(format!("{name}={value}: not a URL ({e})")),
    }
}

fn sampler(name: Option<String>, arg: Option<String>) -> Result<SamplerChoice, String> {
    let ratio = || -> Result<f64, String> {
        match &arg {
            None => Ok(1.0),
            Some(text) => match text.trim().parse::<f64>() {
                Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
                _ => Err(format!(
                    "OTEL_TRACES_SAMPLER_ARG={text}: expected a probability from 0 to 1"
                )),
            },
        }
    };
    let name = name.map(|n| n.trim().to_owned());
    Ok(match name.as_deref().unwrap_or("parentbased_always_on") {
        "always_on" => SamplerChoice::AlwaysOn,
        "always_off" => SamplerChoice::AlwaysOff,
        "traceidratio" => SamplerChoice::TraceIdRatio(ratio()?),
        "parentbased_always_on" => SamplerChoice::ParentBasedAlwaysOn,
        "parentbased_always_off" => SamplerChoice::ParentBasedAlwaysOff,
        "parentbased_traceidratio" => SamplerChoice::ParentBasedTraceIdRatio(ratio()?),
        other => {
            return Err(format!(
                "OTEL_TRACES_SAMPLER={other}: expected always_on, always_off, traceidratio, \
                 parentbased_always_on, parentbased_always_off or parentbased_traceidratio"
            ));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn read(vars: &[(&str, &str)]) -> Result<Option<OtelConfig>, String> {
        let vars: BTreeMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        from_env(|name| vars.get(name).cloned(), "lifeguard-sidecar")
    }

    #[test]
    fn without_an_endpoint_or_when_disabled_nothing_is_exported() {
        assert_eq!(read(&[]), Ok(None));
        assert_eq!(read(&[("OTEL_SERVICE_NAME", "x")]), Ok(None));
        assert_eq!(
            read(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
                ("OTEL_SDK_DISABLED", "TRUE")
            ]),
            Ok(None)
        );
    }

    #[test]
    fn the_base_endpoint_gets_the_traces_path_for_http_only() {
        let config = read(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")])
            .unwrap()
            .unwrap();
        assert_eq!(config.endpoint, "http://collector:4318/v1/traces");
        assert_eq!(config.protocol, OtlpProtocol::HttpProtobuf);
        assert_eq!(config.service_name, "lifeguard-sidecar");
        assert_eq!(config.sampler, SamplerChoice::ParentBasedAlwaysOn);

        let grpc = read(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(grpc.endpoint, "http://collector:4317");
        assert_eq!(grpc.protocol, OtlpProtocol::Grpc);
    }

    #[test]
    fn the_traces_variables_win_over_the_generic_ones() {
        let config = read(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://generic:4318"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://traces:9999/custom",
            ),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json"),
            ("OTEL_SERVICE_NAME", "reports-sidecar"),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            config,
            OtelConfig {
                endpoint: "http://traces:9999/custom".into(),
                protocol: OtlpProtocol::HttpJson,
                service_name: "reports-sidecar".into(),
                sampler: SamplerChoice::ParentBasedTraceIdRatio(0.25),
            }
        );
    }

    #[test]
    fn a_value_that_makes_no_sense_is_an_error_naming_the_variable() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318");
        assert_eq!(
            read(&[endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/thrift")]).unwrap_err(),
            "OTEL_EXPORTER_OTLP_PROTOCOL=http/thrift: expected grpc, http/protobuf or http/json"
        );
        assert_eq!(
            read(&[endpoint, ("OTEL_TRACES_SAMPLER", "sometimes")]).unwrap_err(),
            "OTEL_TRACES_SAMPLER=sometimes: expected always_on, always_off, traceidratio, \
             parentbased_always_on, parentbased_always_off or parentbased_traceidratio"
        );
        assert_eq!(
            read(&[
                endpoint,
                ("OTEL_TRACES_SAMPLER", "traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "1.5")
            ])
            .unwrap_err(),
            "OTEL_TRACES_SAMPLER_ARG=1.5: expected a probability from 0 to 1"
        );
        assert_eq!(
            read(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")]).unwrap_err(),
            "OTEL_EXPORTER_OTLP_ENDPOINT=collector:4318: expected an http:// or https:// URL"
        );
        assert_eq!(
            read(&[endpoint, ("OTEL_SDK_DISABLED", "yes")]).unwrap_err(),
            "OTEL_SDK_DISABLED=yes: expected true or false"
        );
    }
}
