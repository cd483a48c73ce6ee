//! The binary as a kubectl plugin: copied or symlinked onto `PATH` as `kubectl-lifeguard`, it
//! answers `kubectl lifeguard status | revoke | exception …` (the same handlers as
//! `lifeguard status`, `lifeguard revoke` and `lifeguard exception`).

use std::ffi::OsStr;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

use super::ExceptionCommand;
use super::revoke::RevokeArgs;
use super::status::StatusArgs;

/// The file name kubectl looks for on `PATH` to run `kubectl lifeguard`.
pub const PLUGIN_NAME: &str = "kubectl-lifeguard";

/// Lifeguard for kubectl: what is enforced, revoking principals, signing exceptions.
#[derive(Debug, Parser)]
#[command(name = PLUGIN_NAME, bin_name = "kubectl lifeguard", version)]
pub struct PluginCli {
    #[command(subcommand)]
    pub command: PluginCommand,
}

#[derive(Debug, Subcommand)]
// Parsed once at startup: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum PluginCommand {
    /// Policies with their sidecars, unexpired capability exceptions, revocations in progress.
    Status(StatusArgs),
    /// Revoke a principal cluster-wide (creates a PrincipalRevocation); --wait follows it.
    Revoke(RevokeArgs),
    /// Sign and verify CapabilityExceptions.
    #[command(subcommand)]
    Exception(ExceptionCommand),
}

/// Whether the program was started as `kubectl-lifeguard` (`kubectl-lifeguard.exe` on
/// Windows), whatever directory it sits in.
pub fn is_plugin_name(argv0: &OsStr) -> bool {
    Path::new(argv0)
        .file_name()
        .is_some_and(|name| name == PLUGIN_NAME || name == "kubectl-lifeguard.exe")
}

/// Runs the plugin command line when started under the plugin's name; `None` otherwise.
pub fn run_if_invoked_as_plugin() -> Option<ExitCode> {
    let argv0 = std::env::args_os().next()?;
    if !is_plugin_name(&argv0) {
        return None;
    }
    let cli = PluginCli::parse();
    Some(match run(&cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    })
}

fn run(command: &PluginCommand) -> Result<ExitCode> {
    match command {
        PluginCommand::Status(args) => super::status::run(args),
        PluginCommand::Revoke(args) => super::revoke::run(args),
        PluginCommand::Exception(ExceptionCommand::Sign {
            key,
            kid,
            in_place,
            file,
        }) => super::exception::sign_file(key, kid, *in_place, file),
        PluginCommand::Exception(ExceptionCommand::Verify { keys, files }) => {
            super::exception::verify_files(keys, files)
        }
        PluginCommand::Exception(ExceptionCommand::Payload { file }) => {
            super::exception::payload(file)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_plugin_is_recognised_by_its_file_name_only() {
        for name in [
            "kubectl-lifeguard",
            "/usr/local/bin/kubectl-lifeguard",
            "./kubectl-lifeguard",
            "C:/tools/kubectl-lifeguard.exe",
        ] {
            assert!(is_plugin_name(OsStr::new(name)), "{name}");
        }
        for name in [
            "lifeguard",
            "/usr/bin/lifeguard",
            "kubectl-lifeguard-old",
            "/opt/kubectl-lifeguard/lifeguard",
            "kubectl",
        ] {
            assert!(!is_plugin_name(OsStr::new(name)), "{name}");
        }
    }

    #[test]
    fn the_plugin_command_line_is_consistent_and_reads_as_kubectl_lifeguard() {
        PluginCli::command().debug_assert();
        let help = PluginCli::command().render_usage().to_string();
        assert!(help.contains("kubectl lifeguard"), "{help}");
    }

    #[test]
    fn exception_sign_and_verify_parse_as_under_lifeguard() {
        let cli = PluginCli::try_parse_from([
            "kubectl-lifeguard",
            "exception",
            "verify",
            "--keys",
            "k.json",
            "a.yaml",
        ])
        .unwrap();
        assert!(matches!(
            cli.command,
            PluginCommand::Exception(ExceptionCommand::Verify { .. })
        ));
    }
}
