//! `gaffer op submit|get|list|wait|cancel`, `gaffer approve|deny|approvals`,
//! `gaffer operator init|path`: thin wrappers over the same method handlers.
//! `gaffer trust [--show]`: the operator signs (or inspects) policy.yaml and providers.yaml.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Subcommand;
use serde_json::{Value, json};

use crate::methods::{App, AppConfig, call_local};
use crate::operations::operator::{OperatorKey, key_path};
use crate::operations::trust;
use crate::rpc::Role;
use crate::util::random_bytes;

/// The operations commands; the root command line inlines these variants.
#[derive(Debug, Subcommand)]
pub enum OpsCommand {
    /// Submit, inspect, wait for and cancel operations.
    #[command(subcommand)]
    Op(OpCmd),
    /// Approve a pending request (by approval or operation id). Needs the operator key.
    Approve {
        id: String,
        /// Approve for fewer seconds than requested.
        #[arg(long)]
        duration_seconds: Option<u64>,
        /// Approve fewer uses than requested.
        #[arg(long)]
        max_uses: Option<u32>,
    },
    /// Deny a pending request. Needs the operator key.
    Deny { id: String },
    /// Revoke an approval (an operation not yet executing is canceled). Needs the operator key.
    Revoke { id: String },
    /// List approval requests. Needs the operator key.
    Approvals {
        /// Include decided and closed ones.
        #[arg(long)]
        all: bool,
    },
    /// Manage the operator key (kept in your config directory, never in the workspace).
    #[command(subcommand)]
    Operator(OperatorCmd),
    /// Sign the current policy.yaml and providers.yaml as trusted. Needs the operator key.
    ///
    /// Until the operator trusts them, allow rules are ignored (everything not denied waits
    /// for approval) and no external provider is started. Review both files first.
    Trust {
        /// Only report whether each file is trusted, changed since, or never trusted.
        #[arg(long, conflicts_with = "expect")]
        show: bool,
        /// `FILE=SHA256` (repeatable): sign only if FILE still has the digest you reviewed
        /// (from `gaffer trust --show`); otherwise nothing is signed.
        #[arg(long, value_name = "FILE=SHA256")]
        expect: Vec<String>,
    },
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

#[derive(Debug, Subcommand)]
pub enum OperatorCmd {
    /// Create a new random operator key (mode 0600) at the configured location.
    Init,
    /// Print where the operator key is looked up.
    Path,
}

fn print(v: &Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

fn open(root: &Path) -> Result<Arc<App>, ExitCode> {
    App::open(root, AppConfig::default()).map_err(|e| {
        eprintln!("gaffer: {e}");
        ExitCode::FAILURE
    })
}

async fn call(app: &Arc<App>, role: Role, method: &str, params: Value) -> Result<Value, ExitCode> {
    call_local(Arc::clone(app), role, method, params)
        .await
        .map_err(|e| {
            println!("{}", json!({ "error": e }));
            ExitCode::FAILURE
        })
}

fn random_key() -> String {
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

/// The operator commands act only when this user holds the operator key.
fn require_operator() -> Result<(), ExitCode> {
    OperatorKey::load().map(|_| ()).map_err(|e| {
        eprintln!("gaffer: {e}");
        ExitCode::from(3)
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

/// `gaffer trust`: signs what is on disk now, after refusing files gaffer could not load.
fn trust(root: &Path, expect: &[String]) -> Result<ExitCode, ExitCode> {
    let mut expected = std::collections::BTreeMap::new();
    for e in expect {
        let Some((file, digest)) = e.split_once('=') else {
            eprintln!("gaffer: --expect {e:?}: write FILE=SHA256");
            return Err(ExitCode::from(2));
        };
        expected.insert(file.trim().to_string(), digest.trim().to_string());
    }
    let key = OperatorKey::load().map_err(|e| {
        eprintln!("gaffer: {e}");
        ExitCode::from(3)
    })?;
    let dir = root.join(".gaffer");
    let signed = trust::sign_files_expecting(&dir, &key, &expected).map_err(|e| {
        eprintln!("gaffer: nothing trusted: {e}");
        ExitCode::FAILURE
    })?;
    if signed.is_empty() {
        eprintln!("gaffer: neither policy.yaml nor providers.yaml exists; nothing to trust");
    }
    print(&json!({
        "trusted": signed,
        "trust_file": dir.join(trust::TRUST_FILE).display().to_string(),
        "note": "a running gaffer applies the policy at once; restart it to start trusted providers",
    }));
    Ok(ExitCode::SUCCESS)
}

/// `gaffer trust --show`: read-only; without the operator key every present file reads
/// `no_operator_key`, because nothing can be verified.
fn trust_show(root: &Path) -> Result<ExitCode, ExitCode> {
    let dir = root.join(".gaffer");
    let key = OperatorKey::load().ok();
    let recorded = trust::read_trust_file(&dir);
    let mut files = Vec::new();
    for file in trust::TRUSTED_FILES {
        let path = dir.join(file);
        let bytes = match std::fs::read(&path) {
            Ok(b) => Some(b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                eprintln!("gaffer: {}: {e}", path.display());
                return Err(ExitCode::FAILURE);
            }
        };
        let status = trust::status_of(&recorded, file, bytes.as_deref(), key.as_ref());
        let entry = recorded.files.get(file);
        files.push(json!({
            "file": file,
            "status": status,
            "detail": status.describe(),
            "sha256": bytes.as_deref().map(crate::util::sha256_hex),
            "trusted_sha256": entry.map(|e| e.sha256.clone()),
            "signed_at_ms": entry.map(|e| e.signed_at_ms),
        }));
    }
    print(&json!({ "files": files }));
    Ok(ExitCode::SUCCESS)
}

async fn run_inner(cmd: OpsCommand, root: &Path) -> Result<ExitCode, ExitCode> {
    match cmd {
        OpsCommand::Trust { show: true, .. } => trust_show(root),
        OpsCommand::Trust {
            show: false,
            expect,
        } => trust(root, &expect),
        OpsCommand::Operator(OperatorCmd::Path) => {
            let p = key_path().map_err(|e| {
                eprintln!("gaffer: {e}");
                ExitCode::FAILURE
            })?;
            println!("{}", p.display());
            Ok(ExitCode::SUCCESS)
        }
        OpsCommand::Operator(OperatorCmd::Init) => {
            let p = key_path().map_err(|e| {
                eprintln!("gaffer: {e}");
                ExitCode::FAILURE
            })?;
            OperatorKey::init(&p, Some(root)).map_err(|e| {
                eprintln!("gaffer: {e}");
                ExitCode::FAILURE
            })?;
            println!("{}", json!({"operator_key": p.display().to_string()}));
            Ok(ExitCode::SUCCESS)
        }
        OpsCommand::Op(op) => {
            let app = open(root)?;
            let role = Role::Agent;
            // A user holding the operator key sees (and may cancel) every client's operations.
            let viewer = if OperatorKey::load().is_ok() {
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
        OpsCommand::Approvals { all } => {
            require_operator()?;
            let app = open(root)?;
            print(
                &call(
                    &app,
                    Role::Operator,
                    "approvals/list",
                    json!({ "all": all }),
                )
                .await?,
            );
            Ok(ExitCode::SUCCESS)
        }
        OpsCommand::Revoke { id } => {
            require_operator()?;
            let app = open(root)?;
            print(
                &call(
                    &app,
                    Role::Operator,
                    "approvals/revoke",
                    json!({ "id": id }),
                )
                .await?,
            );
            Ok(ExitCode::SUCCESS)
        }
        OpsCommand::Approve {
            id,
            duration_seconds,
            max_uses,
        } => decide(root, &id, "approve", duration_seconds, max_uses).await,
        OpsCommand::Deny { id } => decide(root, &id, "deny", None, None).await,
    }
}

async fn decide(
    root: &Path,
    id: &str,
    decision: &str,
    duration_seconds: Option<u64>,
    max_uses: Option<u32>,
) -> Result<ExitCode, ExitCode> {
    require_operator()?;
    let app = open(root)?;
    // The human looked at the request as it is now: decide at its current revision.
    let list = call(&app, Role::Operator, "approvals/list", json!({"all": true})).await?;
    let Some(ap) = list["approvals"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["approval_id"] == id || a["operation_id"] == id)
        .cloned()
    else {
        eprintln!("gaffer: no approval request {id}");
        return Err(ExitCode::FAILURE);
    };
    let params = json!({
        "id": ap["approval_id"],
        "decision": decision,
        "expected_revision": ap["revision"],
        "idempotency_key": random_key(),
        "constraints": {"duration_seconds": duration_seconds, "max_uses": max_uses},
    });
    print(&call(&app, Role::Operator, "approvals/decide", params).await?);
    Ok(ExitCode::SUCCESS)
}
