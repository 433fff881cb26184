//! `gaffer op submit|get|list|wait|cancel|catalog`: thin wrappers over the same method
//! handlers. The operator's commands are in [`super::operator`].

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Subcommand;
use serde_json::{Value, json};

use crate::methods::{App, AppConfig, call_local};
use crate::operator::OperatorSigner;
use crate::rpc::Role;
use crate::util::random_bytes;

/// The operations commands; the root command line inlines these variants.
#[derive(Debug, Subcommand)]
pub enum OpsCommand {
    /// Submit, inspect, wait for and cancel operations.
    #[command(subcommand)]
    Op(OpCmd),
    #[command(flatten)]
    Operator(super::operator::OperatorCommand),
}

#[derive(Debug, Subcommand)]
pub enum OpCmd {
    /// Submit an operation; prints it as JSON.
    Submit {
        /// Catalog name, e.g. `file.write`.
        operation: String,
        /// Target as a JSON object.
        #[arg(long, default_value = "{}")]
        target: String,
        /// Arguments as a JSON object.
        #[arg(long, default_value = "{}")]
        arguments: String,
        #[arg(long)]
        reason: String,
        /// Default: a fresh random key (so a rerun of the command is a new request).
        #[arg(long)]
        idempotency_key: Option<String>,
        /// Wait (up to 30 s per poll) until the operation is terminal.
        #[arg(long)]
        wait: bool,
    },
    Get {
        id: String,
    },
    List {
        /// Only this state (repeatable).
        #[arg(long = "state")]
        states: Vec<String>,
        #[arg(long)]
        operation: Option<String>,
        #[arg(long)]
        limit: Option<usize>,
    },
    /// Wait until the operation is terminal (or the timeout passes).
    Wait {
        id: String,
        #[arg(long, default_value_t = 300)]
        timeout_seconds: u64,
    },
    Cancel {
        id: String,
    },
    /// The operation catalog with schemas.
    Catalog,
}

pub(super) fn print(v: &Value) {
    crate::outln!("{}", super::output::json(v));
}

pub(super) fn open(root: &Path) -> Result<Arc<App>, ExitCode> {
    open_with(root, false)
}

/// [`open`] for an operator command that needs no provider's operation: a provider that
/// hangs or fails at start can never keep the operator from trusting, revoking or managing
/// credentials.
pub(super) fn open_without_providers(root: &Path) -> Result<Arc<App>, ExitCode> {
    open_with(root, true)
}

fn open_with(root: &Path, without_providers: bool) -> Result<Arc<App>, ExitCode> {
    let config = AppConfig {
        client_token: crate::clients::token_from_env(),
        without_providers,
        ..AppConfig::default()
    };
    App::open(root, config).map_err(|e| {
        eprintln!("gaffer: {e}");
        ExitCode::FAILURE
    })
}

pub(super) async fn call(
    app: &Arc<App>,
    role: Role,
    method: &str,
    params: Value,
) -> Result<Value, ExitCode> {
    call_local(Arc::clone(app), role, method, params)
        .await
        .map_err(|e| {
            crate::outln!("{}", super::output::json_line(&json!({ "error": e })));
            ExitCode::FAILURE
        })
}

pub(super) fn random_key() -> String {
    random_bytes(12)
        .map(|b| format!("cli-{}", crate::util::hex(&b)))
        .unwrap_or_else(|_| format!("cli-{}", crate::util::now_ms()))
}

fn parse_json(field: &str, text: &str) -> Result<Value, ExitCode> {
    serde_json::from_str(text).map_err(|e| {
        eprintln!("gaffer: --{field} is not JSON: {e}");
        ExitCode::from(2)
    })
}

pub async fn run(cmd: OpsCommand, root: &Path) -> ExitCode {
    match run_inner(cmd, root).await {
        Ok(c) | Err(c) => c,
    }
}

async fn wait_terminal(
    app: &Arc<App>,
    role: Role,
    id: &str,
    timeout_s: u64,
) -> Result<Value, ExitCode> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(timeout_s);
    let mut rev = 0;
    loop {
        let left = deadline
            .saturating_duration_since(std::time::Instant::now())
            .as_secs()
            .min(30);
        let v = call(
            app,
            role,
            "operations/wait",
            json!({"id": id, "after_revision": rev, "wait_seconds": left}),
        )
        .await?;
        let terminal = v["state"]
            .as_str()
            .and_then(crate::operations::lifecycle::OpState::parse)
            .is_some_and(|s| s.is_terminal());
        if terminal || left == 0 {
            return Ok(v);
        }
        rev = v["revision"].as_u64().unwrap_or(rev);
    }
}

async fn run_inner(cmd: OpsCommand, root: &Path) -> Result<ExitCode, ExitCode> {
    match cmd {
        OpsCommand::Operator(cmd) => super::operator::run(cmd, root).await,
        OpsCommand::Op(op) => {
            let app = open(root)?;
            let role = Role::Agent;
            // A user holding the operator key sees (and may cancel) every client's operations.
            let viewer = if OperatorSigner::load().is_ok() {
                Role::Operator
            } else {
                Role::Agent
            };
            let v = match op {
                OpCmd::Submit {
                    operation,
                    target,
                    arguments,
                    reason,
                    idempotency_key,
                    wait,
                } => {
                    let params = json!({
                        "operation": operation,
                        "target": parse_json("target", &target)?,
                        "arguments": parse_json("arguments", &arguments)?,
                        "reason": reason,
                        "idempotency_key": idempotency_key.unwrap_or_else(random_key),
                    });
                    let mut v = call(&app, role, "operations/submit", params).await?;
                    // A one-shot process runs what it was allowed to run before it exits, so
                    // nothing is left half-done behind it.
                    if v["state"] == "approved"
                        && let Some(id) = v["id"].as_str()
                    {
                        app.operations.drive(id).await;
                        v = call(&app, role, "operations/get", json!({ "id": id })).await?;
                    }
                    if wait {
                        let id = v["id"].as_str().unwrap_or_default().to_string();
                        wait_terminal(&app, role, &id, 3600).await?
                    } else {
                        v
                    }
                }
                OpCmd::Get { id } => {
                    call(&app, viewer, "operations/get", json!({ "id": id })).await?
                }
                OpCmd::List {
                    states,
                    operation,
                    limit,
                } => {
                    call(
                        &app,
                        viewer,
                        "operations/list",
                        json!({"states": states, "operation": operation, "limit": limit}),
                    )
                    .await?
                }
                OpCmd::Wait {
                    id,
                    timeout_seconds,
                } => wait_terminal(&app, viewer, &id, timeout_seconds).await?,
                OpCmd::Cancel { id } => {
                    call(&app, viewer, "operations/cancel", json!({ "id": id })).await?
                }
                OpCmd::Catalog => call(&app, role, "operations/catalog", json!({})).await?,
            };
            print(&v);
            Ok(ExitCode::SUCCESS)
        }
    }
}
