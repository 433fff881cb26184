//! The command line: `gaffer serve` (the default) and the one-shot commands.

pub mod bundles;
pub mod doctor;
pub mod fast;
pub mod operations;
pub mod operator;
pub mod output;
pub mod patterns;
pub mod plans;
pub mod store;
pub mod trust;
pub mod workers;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "gaffer",
    version,
    about = "Workspace-local agent operations server (JSON-RPC over stdio)"
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Option<Command>,
}

impl Cli {
    /// The process's arguments: a serve invocation read directly (`fast`), anything else by
    /// clap, which also prints help, versions and errors.
    pub fn from_env() -> Cli {
        let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
        match args.split_first() {
            Some((_, rest)) => {
                fast::serve_invocation(rest).unwrap_or_else(|| Cli::parse_from(args))
            }
            None => Cli::parse_from(args),
        }
    }
}

#[derive(Debug, Args, Clone)]
pub struct Global {
    /// Workspace root (default: the LSP root the client names, else the current directory).
    #[arg(long, global = true, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Write logs to this file instead of stderr.
    #[arg(long, global = true, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
    /// Log filter, e.g. `info`, `debug`, `gaffer=trace` (default: $GAFFER_LOG or `warn`).
    #[arg(long, global = true, value_name = "LEVEL")]
    pub log_level: Option<String>,
    /// Selection policy file to use instead of `.gaffer/patterns.yaml`.
    #[arg(long, global = true, value_name = "FILE")]
    pub patterns_policy: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve JSON-RPC on stdin/stdout (the default command).
    Serve(ServeArgs),
    /// Inspect and maintain the workspace store.
    #[command(subcommand)]
    Store(store::StoreCmd),
    /// Write the JSON Schemas of every method and notification.
    Schema {
        /// Output directory.
        #[arg(long, default_value = "schema")]
        out: PathBuf,
        /// Do not write; exit 1 when the directory is stale.
        #[arg(long)]
        check: bool,
    },
    /// Plan work with the worker-pattern selector (dry runs only).
    #[command(subcommand)]
    Patterns(patterns::PatternsCmd),
    /// Sync, check and list config bundles.
    #[command(subcommand)]
    Bundle(bundles::BundleCmd),
    /// Create, feed, inspect and stop workers.
    #[command(subcommand)]
    Worker(workers::WorkerCmd),
    /// Launch selections as running lanes; show, list, record evidence, waive, stop.
    #[command(subcommand)]
    Plan(plans::PlanCmd),
    /// Read-only health checks of the workspace and this machine.
    Doctor,
    /// Operations, approvals and the operator key (variants inlined from `cli::operations`).
    #[command(flatten)]
    Ops(operations::OpsCommand),
    /// Call one method in process and print its result as JSON.
    Call {
        /// Method name, e.g. `gaffer/status`.
        method: String,
        /// Params as a JSON object (default `{}`).
        #[arg(default_value = "{}")]
        params: String,
    },
}

#[derive(Debug, Args, Default)]
pub struct ServeArgs {
    /// Force LSP framing and profile (Content-Length headers).
    #[arg(long, conflicts_with_all = ["jsonl", "mcp"])]
    pub lsp: bool,
    /// Force newline-delimited JSON (raw profile unless the client speaks MCP).
    #[arg(long, conflicts_with = "mcp")]
    pub jsonl: bool,
    /// Force the MCP profile over newline-delimited JSON.
    #[arg(long)]
    pub mcp: bool,
}
