//! `gaffer worker create | input | list | show | logs | stop`.
//!
//! A worker's OS process belongs to the gaffer process that created it, so `worker create`
//! stays attached: it prints the worker, then its output, as JSON lines, until the worker ends
//! (Ctrl-C stops it). The other commands work from any process on the workspace: input and
//! stop are journalled and carried out by the owner. Like every client, a command sees the
//! workers of its own identity (its credential, else `anonymous`); a user holding the operator
//! key sees and stops every client's.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Subcommand;
use serde_json::{Value, json};

use super::bundles::{emit, open, print_call, print_call_as, read_bundle_file};
use super::output::json_line;
use crate::methods::{self, App, AppConfig};
use crate::operator::OperatorSigner;
use crate::rpc::Role;

#[derive(Debug, Subcommand)]
pub enum WorkerCmd {
    /// Create a worker from a bundle profile and follow its output until it ends.
    Create {
        /// Profile name in the bundle (a `named` selector unless --builtin).
        #[arg(long)]
        profile: String,
        /// The profile selector is `builtin`.
        #[arg(long)]
        builtin: bool,
        /// Id of a synced bundle (with --digest).
        #[arg(long, requires = "digest", conflicts_with = "bundle_file")]
        bundle: Option<String>,
        /// Digest of the synced bundle.
        #[arg(long)]
        digest: Option<String>,
        /// Sync this bundle file first and use the reference it yields.
        #[arg(long, value_name = "FILE")]
        bundle_file: Option<PathBuf>,
        /// Initial input (text).
        #[arg(long)]
        input: Option<String>,
        #[arg(long)]
        name: Option<String>,
        /// Idempotency key: the same key and request give back the same worker.
        #[arg(long)]
        key: Option<String>,
    },
    /// Send text input to a running worker.
    Input { worker_id: String, text: String },
    /// List workers.
    List {
        /// Only workers in this status (running, stopped, failed).
        #[arg(long)]
        status: Option<String>,
    },
    /// Show one worker.
    Show { worker_id: String },
    /// Print a worker's transcript.
    Logs {
        worker_id: String,
        /// Only entries after this seq.
        #[arg(long, default_value_t = 0)]
        after: u64,
        /// Keep printing new entries until the worker ends.
        #[arg(long)]
        follow: bool,
    },
    /// Stop a worker.
    Stop {
        worker_id: String,
        #[arg(long)]
        reason: Option<String>,
    },
}

pub async fn run(cmd: WorkerCmd, root: &Path, config: AppConfig) -> ExitCode {
    let app = match open(root, config) {
        Ok(a) => a,
        Err(code) => return code,
    };
    match cmd {
        WorkerCmd::Create {
            profile,
            builtin,
            bundle,
            digest,
            bundle_file,
            input,
            name,
            key,
        } => {
            let reference = match (bundle, digest, bundle_file) {
                (Some(id), Some(digest), None) => json!({ "id": id, "digest": digest }),
                (None, _, Some(file)) => {
                    let text = match read_bundle_file(&file) {
                        Ok(t) => t,
                        Err(code) => return code,
                    };
                    match call(&app, "bundles/sync", json!({ "text": text })).await {
                        Ok(v) => v["reference"].clone(),
                        Err(code) => return code,
                    }
                }
                _ => {
                    eprintln!("gaffer: give --bundle ID --digest DIGEST, or --bundle-file FILE");
                    return ExitCode::from(2);
                }
            };
            let kind = if builtin { "builtin" } else { "named" };
            let mut params = json!({ "profile": { "kind": kind, "value": profile }, "config_bundle": reference });
            if let Some(i) = input {
                params["initial_input"] = json!(i);
            }
            if let Some(n) = name {
                params["display_name"] = json!(n);
            }
            if let Some(k) = key {
                params["idempotency_key"] = json!(k);
            }
            let worker = match call(&app, "workers/create", params).await {
                Ok(v) => v["worker"].clone(),
                Err(code) => return code,
            };
            emit!("{}", json_line(&json!({ "worker": worker })));
            let id = worker["id"].as_str().unwrap_or_default().to_string();
            follow(&app, &id, 0, true).await
        }
        WorkerCmd::Input { worker_id, text } => {
            print_call(
                app,
                "workers/input",
                json!({ "worker_id": worker_id, "input": text }),
            )
            .await
        }
        WorkerCmd::List { status } => {
            let params = match status {
                Some(s) => json!({ "status": s }),
                None => json!({}),
            };
            print_call_as(app, viewer(), "workers/list", params).await
        }
        WorkerCmd::Show { worker_id } => {
            print_call_as(
                app,
                viewer(),
                "workers/get",
                json!({ "worker_id": worker_id }),
            )
            .await
        }
        WorkerCmd::Logs {
            worker_id,
            after,
            follow: keep,
        } => follow(&app, &worker_id, after, keep).await,
        WorkerCmd::Stop { worker_id, reason } => {
            print_call_as(
                app,
                viewer(),
                "workers/stop",
                json!({ "worker_id": worker_id, "reason": reason }),
            )
            .await
        }
    }
}

/// Who reads and stops workers: a user holding the operator key sees every client's.
fn viewer() -> Role {
    if OperatorSigner::load().is_ok() {
        Role::Operator
    } else {
        Role::Agent
    }
}

/// Calls a method; on error prints it as JSON and yields the exit code.
async fn call(app: &Arc<App>, method: &str, params: Value) -> Result<Value, ExitCode> {
    call_as(app, Role::Agent, method, params).await
}

async fn call_as(
    app: &Arc<App>,
    role: Role,
    method: &str,
    params: Value,
) -> Result<Value, ExitCode> {
    methods::call_local(Arc::clone(app), role, method, params)
        .await
        .map_err(|e| {
            emit!("{}", json_line(&json!({ "error": e })));
            ExitCode::FAILURE
        })
}

/// Prints transcript entries as JSON lines; with `keep`, until the worker has ended. Ctrl-C
/// while following stops a worker this process owns rather than orphaning it.
async fn follow(app: &Arc<App>, id: &str, mut after: u64, keep: bool) -> ExitCode {
    let role = viewer();
    loop {
        let page = match call_as(
            app,
            role,
            "workers/transcript",
            json!({ "worker_id": id, "after_seq": after, "limit": 1000 }),
        )
        .await
        {
            Ok(p) => p,
            Err(code) => return code,
        };
        for e in page["entries"].as_array().into_iter().flatten() {
            emit!("{}", json_line(e));
        }
        after = page["next_after_seq"].as_u64().unwrap_or(after);
        if page["has_more"].as_bool() == Some(true) {
            continue;
        }
        let worker = match call_as(app, role, "workers/get", json!({ "worker_id": id })).await {
            Ok(v) => v["worker"].clone(),
            Err(code) => return code,
        };
        let ended = worker["status"] == "stopped" || worker["status"] == "failed";
        if !keep || (ended && worker["last_seq"].as_u64().unwrap_or(0) <= after) {
            if ended {
                emit!("{}", json_line(&json!({ "ended": worker })));
            }
            return if worker["status"] == "failed" {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            };
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            _ = tokio::signal::ctrl_c() => {
                let _ = call_as(app, role, "workers/stop", json!({ "worker_id": id, "reason": "interrupted" })).await;
            }
        }
    }
}
