//! `gaffer plan launch | show | list | evidence | waive | stop`.
//!
//! A plan's lane workers belong to the gaffer process that executes its launch. `plan launch`
//! therefore stays attached when the launch is authorized at once (a trusted rule): it runs the
//! lanes and prints the plan each time it changes, until it ends (Ctrl-C stops it). A launch
//! that waits for the operator is left to a serving gaffer, which runs it once approved.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Subcommand;
use serde_json::{Value, json};

use super::bundles::{emit, open, read_bundle_file};
use crate::methods::{self, App, AppConfig};
use crate::operator::OperatorSigner;
use crate::operator::signed::OperatorSignature;
use crate::plans::evidence::WaivePayload;
use crate::rpc::Role;

#[derive(Debug, Subcommand)]
pub enum PlanCmd {
    /// Launch a selection as running lanes (one gated `plan.launch`).
    Launch {
        /// The selection request as a JSON file (the `patterns/select` vocabulary).
        #[arg(long, value_name = "FILE", conflicts_with_all = ["objective", "digest_of"])]
        request: Option<PathBuf>,
        /// Or: the objective (with --scope, --tests, --persistent).
        #[arg(long)]
        objective: Option<String>,
        #[arg(long = "scope")]
        scopes: Vec<String>,
        #[arg(long)]
        tests: bool,
        #[arg(long)]
        persistent: bool,
        /// Or: launch again the plan with this selection digest.
        #[arg(long, value_name = "DIGEST")]
        digest_of: Option<String>,
        /// Id of a synced bundle (with --digest).
        #[arg(long, requires = "digest", conflicts_with = "bundle_file")]
        bundle: Option<String>,
        #[arg(long)]
        digest: Option<String>,
        /// Sync this bundle file first and use the reference it yields.
        #[arg(long, value_name = "FILE")]
        bundle_file: Option<PathBuf>,
        /// Lane role → bundle profile, as ROLE=PROFILE (repeat).
        #[arg(long = "lane", value_name = "ROLE=PROFILE")]
        lanes: Vec<String>,
        #[arg(long)]
        mechanism: Option<String>,
        /// Idempotency key (default: the objective).
        #[arg(long)]
        key: Option<String>,
        /// Show the lanes, the workers that would start and the policy verdict; start nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Show one plan with its evidence verified now.
    Show { plan_id: String },
    /// List plans, newest first.
    List {
        #[arg(long)]
        limit: Option<usize>,
    },
    /// Record evidence for a lane expectation as the operator.
    Evidence {
        plan_id: String,
        lane_id: String,
        expectation: String,
        /// operation, file, worker_output or note.
        #[arg(long)]
        kind: String,
        #[arg(long)]
        operation_id: Option<String>,
        #[arg(long)]
        path: Option<String>,
        #[arg(long)]
        from_seq: Option<u64>,
        #[arg(long)]
        to_seq: Option<u64>,
        #[arg(long)]
        text: Option<String>,
    },
    /// Waive a lane expectation: signed here with the operator key.
    Waive {
        plan_id: String,
        lane_id: String,
        expectation: String,
        #[arg(long)]
        reason: String,
    },
    /// Stop a plan: its lane workers are stopped and nothing more starts.
    Stop {
        plan_id: String,
        #[arg(long, default_value = "stopped from the command line")]
        reason: String,
    },
}

async fn call(app: &Arc<App>, role: Role, method: &str, params: Value) -> Result<Value, ExitCode> {
    methods::call_local(Arc::clone(app), role, method, params)
        .await
        .map_err(|e| {
            emit!("{}", super::output::json_line(&json!({ "error": e })));
            ExitCode::FAILURE
        })
}

fn pretty(v: &Value) {
    emit!("{}", super::output::json(v));
}

/// The operator role when this machine holds the operator key, else the agent's identity.
fn role() -> Role {
    if OperatorSigner::load().is_ok() {
        Role::Operator
    } else {
        Role::Agent
    }
}

pub async fn run(cmd: PlanCmd, root: &Path, config: AppConfig) -> ExitCode {
    let app = match open(root, config) {
        Ok(a) => a,
        Err(code) => return code,
    };
    let done = |r: Result<Value, ExitCode>| match r {
        Ok(v) => {
            pretty(&v);
            ExitCode::SUCCESS
        }
        Err(code) => code,
    };
    match cmd {
        launch @ PlanCmd::Launch { .. } => match launch_params(&app, launch).await {
            Ok(params) => launch_and_follow(&app, params).await,
            Err(code) => code,
        },
        PlanCmd::Show { plan_id } => {
            done(call(&app, role(), "plans/get", json!({ "plan_id": plan_id })).await)
        }
        PlanCmd::List { limit } => {
            done(call(&app, role(), "plans/list", json!({ "limit": limit })).await)
        }
        PlanCmd::Evidence {
            plan_id,
            lane_id,
            expectation,
            kind,
            operation_id,
            path,
            from_seq,
            to_seq,
            text,
        } => {
            let mut p = json!({"plan_id": plan_id, "lane_id": lane_id, "expectation": expectation, "kind": kind});
            for (k, v) in [
                ("operation_id", operation_id.map(Value::from)),
                ("path", path.map(Value::from)),
                ("from_seq", from_seq.map(Value::from)),
                ("to_seq", to_seq.map(Value::from)),
                ("text", text.map(Value::from)),
            ] {
                if let Some(v) = v {
                    p[k] = v;
                }
            }
            done(call(&app, role(), "plans/evidence", p).await)
        }
        PlanCmd::Waive {
            plan_id,
            lane_id,
            expectation,
            reason,
        } => done(waive(&app, plan_id, lane_id, expectation, reason).await),
        PlanCmd::Stop { plan_id, reason } => done(
            call(
                &app,
                role(),
                "plans/stop",
                json!({ "plan_id": plan_id, "reason": reason }),
            )
            .await,
        ),
    }
}

async fn launch_params(app: &Arc<App>, cmd: PlanCmd) -> Result<Value, ExitCode> {
    let PlanCmd::Launch {
        request,
        objective,
        scopes,
        tests,
        persistent,
        digest_of,
        bundle,
        digest,
        bundle_file,
        lanes,
        mechanism,
        key,
        dry_run,
    } = cmd
    else {
        return Err(ExitCode::from(2));
    };
    let usage = |m: &str| {
        eprintln!("gaffer: {m}");
        ExitCode::from(2)
    };
    let reference = match (bundle, digest, bundle_file) {
        (Some(id), Some(digest), None) => json!({ "id": id, "digest": digest }),
        (None, _, Some(file)) => {
            let text = read_bundle_file(&file)?;
            call(app, Role::Agent, "bundles/sync", json!({ "text": text })).await?["reference"]
                .clone()
        }
        _ => {
            return Err(usage(
                "give --bundle ID --digest DIGEST, or --bundle-file FILE",
            ));
        }
    };
    let mut profiles = serde_json::Map::new();
    for l in &lanes {
        let (role, profile) = l
            .split_once('=')
            .ok_or_else(|| usage(&format!("--lane {l:?}: expected ROLE=PROFILE")))?;
        profiles.insert(role.to_string(), json!(profile));
    }
    let mut p = json!({"config_bundle": reference, "lane_profiles": profiles, "dry_run": dry_run});
    let default_key = match (request, objective, digest_of) {
        (Some(file), None, None) => {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| usage(&format!("cannot read {}: {e}", file.display())))?;
            let v: Value = serde_json::from_str(&text)
                .map_err(|e| usage(&format!("{} is not JSON: {e}", file.display())))?;
            p["request"] = v;
            text
        }
        (None, Some(o), None) => {
            p["request"] = json!({"objective": o, "scopes": scopes, "tests_required": tests,
                                  "persistent_workers": persistent});
            o
        }
        (None, None, Some(d)) => {
            p["plan_digest"] = json!(d);
            d
        }
        _ => {
            return Err(usage(
                "give one of --request FILE, --objective TEXT, --digest-of DIGEST",
            ));
        }
    };
    if let Some(m) = mechanism {
        p["mechanism"] = json!(m);
    }
    p["idempotency_key"] = json!(key.unwrap_or(default_key));
    Ok(p)
}

/// Launches; when the launch is authorized here and now, runs it and follows it to its end.
async fn launch_and_follow(app: &Arc<App>, params: Value) -> ExitCode {
    let r = match call(app, Role::Agent, "plans/launch", params).await {
        Ok(r) => r,
        Err(code) => return code,
    };
    pretty(&r);
    let Some(plan) = r.get("plan") else {
        return ExitCode::SUCCESS;
    };
    let (plan_id, op_id) = (
        plan["plan_id"].as_str().unwrap_or_default().to_string(),
        plan["operation_id"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    );
    if plan["status"] == "pending_approval" {
        eprintln!(
            "gaffer: the launch waits for the operator (`gaffer approve {op_id}`); a serving gaffer runs it once approved"
        );
        return ExitCode::SUCCESS;
    }
    // This process holds the authorized launch: it serves from now on (its lanes' requests
    // are executed here), executes the launch and owns the lanes until the plan ends.
    crate::operations::start_runtime(&app.operations);
    app.operations.drive(&op_id).await;
    follow(app, &plan_id).await
}

async fn follow(app: &Arc<App>, plan_id: &str) -> ExitCode {
    let mut last = Value::Null;
    loop {
        let v = tokio::select! {
            v = call(app, Role::Agent, "plans/get", json!({ "plan_id": plan_id })) => v,
            _ = tokio::signal::ctrl_c() => {
                let _ = call(app, Role::Agent, "plans/stop",
                    json!({"plan_id": plan_id, "reason": "interrupted"})).await;
                continue;
            }
        };
        let plan = match v {
            Ok(v) => v["plan"].clone(),
            Err(code) => return code,
        };
        let summary = json!({"status": plan["status"], "lanes": plan["lanes"].as_array().map(|ls| ls.iter().map(|l| json!({"lane_id": l["lane_id"], "status": l["status"]})).collect::<Vec<_>>())});
        if summary != last {
            emit!("{}", super::output::json_line(&summary));
            last = summary;
        }
        match plan["status"].as_str() {
            Some("completed") => {
                pretty(&plan);
                return ExitCode::SUCCESS;
            }
            Some("incomplete" | "stopped" | "refused") => {
                pretty(&plan);
                return ExitCode::FAILURE;
            }
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

async fn waive(
    app: &Arc<App>,
    plan_id: String,
    lane_id: String,
    expectation: String,
    reason: String,
) -> Result<Value, ExitCode> {
    let signer = OperatorSigner::load().map_err(|e| {
        eprintln!("gaffer: {e}");
        ExitCode::from(3)
    })?;
    let workspace_id = app.workspace.workspace_id().ok_or_else(|| {
        eprintln!("gaffer: the workspace has no store yet");
        ExitCode::FAILURE
    })?;
    let text = app
        .workspace
        .read(|s| {
            let n: usize = expectation.strip_prefix('e')?.parse().ok()?;
            let p = s.plans.get(&plan_id)?;
            let l = p.spec.lanes.iter().find(|l| l.lane_id == lane_id)?;
            l.expectations.get(n.checked_sub(1)?).cloned()
        })
        .ok_or_else(|| {
            eprintln!("gaffer: no expectation {expectation} of lane {lane_id} in plan {plan_id}");
            ExitCode::from(2)
        })?;
    let payload = WaivePayload {
        domain: <WaivePayload as crate::operator::signed::Payload>::DOMAIN.into(),
        workspace_id,
        plan_id,
        lane_id,
        expectation,
        expectation_sha256: crate::util::sha256_hex(text.as_bytes()),
        reason,
        waived_at_ms: crate::util::now_ms(),
        head: app.workspace.journal_head(),
    };
    let sig = OperatorSignature::sign(&signer, &payload);
    call(
        app,
        Role::Operator,
        "plans/waive",
        json!({"payload": sig.payload, "signature": sig.signature}),
    )
    .await
}
