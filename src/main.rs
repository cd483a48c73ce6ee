//! The `lifeguard` binary: one subcommand per part (`cli`), over the library; run as
//! `kubectl-lifeguard`, the kubectl plugin.
#![forbid(unsafe_code)]

mod cli;

/// mimalloc instead of the system allocator: the proxy allocates many small, short-lived
/// buffers per request across threads, where glibc malloc showed up as a fifth of the CPU time
/// (docs/performance.md). The `system-allocator` feature (heap profiling only) turns it off.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::ExitCode;

use clap::Parser;

use cli::{AuditCommand, Cli, Command, DevCommand, ExceptionCommand, PolicyCommand};

fn main() -> ExitCode {
    if let Some(code) = cli::plugin::run_if_invoked_as_plugin() {
        return code;
    }
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Crdgen(args) => {
            cli::crdgen::run(&args.out_dir, args.stdout).map(|()| ExitCode::SUCCESS)
        }
        Command::Policy(PolicyCommand::Check(args)) => cli::policy_check::run(args),
        Command::Policy(PolicyCommand::Diff(args)) => cli::policy_diff::run(args),
        Command::Sidecar(args) => cli::sidecar::run(args).map(|()| ExitCode::SUCCESS),
        Command::Operator(args) => cli::operator::run(args).map(|()| ExitCode::SUCCESS),
        Command::Webhook(args) => cli::webhook::run(args).map(|()| ExitCode::SUCCESS),
        Command::Exception(ExceptionCommand::Sign {
            key,
            kid,
            in_place,
            file,
        }) => cli::exception::sign_file(key, kid, *in_place, file),
        Command::Exception(ExceptionCommand::Verify { keys, files }) => {
            cli::exception::verify_files(keys, files)
        }
        Command::Exception(ExceptionCommand::Payload { file }) => cli::exception::payload(file),
        Command::Dev(DevCommand::Token(args)) => cli::dev::token(args).map(|()| ExitCode::SUCCESS),
        Command::Dev(DevCommand::DpopProof(args)) => {
            cli::dev::dpop_proof(args).map(|()| ExitCode::SUCCESS)
        }
        Command::Status(args) => cli::status::run(args),
        Command::Revoke(args) => cli::revoke::run(args),
        Command::Audit(AuditCommand::Digest(args)) => {
            cli::audit::digest(args).map(|()| ExitCode::SUCCESS)
        }
        Command::Evidence(args) => cli::evidence::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
