//! The operator's commands: decisions signed in this process with the private key
//! (`approve`, `deny`, `revoke`), `approvals`, `trust`, client credentials, and the key itself
//! (`operator init|path|sign`). Nothing here sends the private key anywhere.

use std::io::{IsTerminal, Read};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Subcommand;
use serde_json::{Value, json};

use super::operations::{call, open, open_without_providers, print, random_key};
use crate::methods::App;
use crate::operations::engine::{DecisionRequest, Narrowing, OpError, PreparedDecision};
use crate::operations::policy::GrantMode;
use crate::operations::state::DecisionKind;
use crate::operations::views::rfc3339;
use crate::operator::signed::OperatorSignature;
use crate::operator::{OperatorSigner, key_path, public_key_path};
use crate::rpc::Role;
use crate::util::visible;
use crate::workspace::NewRecord;

#[derive(Debug, Subcommand)]
pub enum OperatorCommand {
    /// Approve a pending request (by approval or operation id), signed with the operator key.
    ///
    /// Prints what the signature grants (the plan, mode, uses, expiry) on stderr, then signs
    /// only once you confirm on the terminal, or, with `--expect`, only the plan you reviewed
    /// (its `plan_digest` in `gaffer approvals`); off a terminal without `--expect` it signs
    /// nothing. A request asking for more than the trusted policy grants for its plan is
    /// refused, naming what differs.
    Approve {
        id: String,
        /// Approve for fewer seconds than requested.
        #[arg(long)]
        duration_seconds: Option<u64>,
        /// Approve fewer uses than requested.
        #[arg(long)]
        max_uses: Option<u32>,
        /// Sign only if the plan still has this digest (`plan_digest` in `gaffer approvals`).
        #[arg(long, value_name = "PLAN_DIGEST")]
        expect: Option<String>,
    },
    /// Deny a pending request; the reason reaches the agent.
    Deny {
        id: String,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Revoke an approval (an operation not yet executing is canceled).
    Revoke { id: String },
    /// List approval requests, rendered from their plan text.
    Approvals {
        /// Include decided and closed ones.
        #[arg(long)]
        all: bool,
        /// Include requests no gaffer on this machine accepted (`requester_verified: false`:
        /// written into the store by something else); they cannot be approved.
        #[arg(long)]
        include_unverified: bool,
    },
    /// Manage the operator key pair (kept in your config directory, never in the workspace).
    #[command(subcommand)]
    Operator(OperatorCmd),
    /// Sign policy.yaml and providers.yaml as trusted (a journal record bound to this
    /// workspace; the trusted bytes are kept, so later edits never loosen them).
    ///
    /// Until the operator trusts them, allow rules are ignored (everything not denied waits
    /// for approval) and no external provider is started. It prints each file's digest and
    /// how it differs from what is trusted now, then asks on the terminal; off a terminal it
    /// signs only with `--expect` (the agent may have edited the files since you wrote them).
    Trust {
        /// Only report each file's trust status and drift.
        #[arg(long, conflicts_with = "expect")]
        show: bool,
        /// `FILE=SHA256` (repeatable): sign exactly these files, and only if each still has
        /// the digest you reviewed (from `gaffer trust --show`); otherwise nothing is signed.
        #[arg(long, value_name = "FILE=SHA256")]
        expect: Vec<String>,
    },
    /// Client credentials: the only way a connection gets a name policy rules can match.
    #[command(subcommand)]
    Client(ClientCmd),
}

#[derive(Debug, Subcommand)]
pub enum OperatorCmd {
    /// Create a new Ed25519 key pair (private 0600, public beside it).
    Init {
        /// Move an old HMAC key aside first.
        #[arg(long)]
        rotate: bool,
    },
    /// Print where the private and public keys are looked up.
    Path,
    /// Sign a canonical payload read from stdin (for editors that cannot sign themselves);
    /// prints the base64url signature.
    Sign,
}

#[derive(Debug, Subcommand)]
pub enum ClientCmd {
    /// Issue a credential for NAME and print its token (give it to the host as
    /// `GAFFER_CLIENT_TOKEN` or the `clientToken` initialize option).
    Add { name: String },
    /// Issued credentials and whether each is revoked.
    List,
    /// Revoke every credential of NAME (or one credential by its `cl_…` id).
    Revoke { name_or_id: String },
}

pub(super) fn fail(e: impl std::fmt::Display, code: u8) -> ExitCode {
    eprintln!("gaffer: {e}");
    ExitCode::from(code)
}

pub(super) fn signer() -> Result<OperatorSigner, ExitCode> {
    OperatorSigner::load().map_err(|e| fail(e, 3))
}

fn op_failed(e: OpError) -> ExitCode {
    crate::outln!(
        "{}",
        super::output::json_line(&json!({"error": {"code": e.code, "message": e.message}}))
    );
    ExitCode::FAILURE
}

pub async fn run(cmd: OperatorCommand, root: &Path) -> Result<ExitCode, ExitCode> {
    match cmd {
        OperatorCommand::Operator(c) => key_command(c, root),
        OperatorCommand::Trust { show: true, .. } => super::trust::show(root),
        OperatorCommand::Trust { expect, .. } => super::trust::sign(root, &expect).await,
        OperatorCommand::Client(c) => client(c, root).await,
        OperatorCommand::Approvals {
            all,
            include_unverified,
        } => {
            signer()?;
            let app = open(root)?;
            let v = call(
                &app,
                Role::Operator,
                "approvals/list",
                json!({ "all": all, "include_unverified": include_unverified }),
            )
            .await?;
            if let Some(n) = v["unverified_hidden"].as_u64().filter(|n| *n > 0) {
                eprintln!(
                    "gaffer: {n} request(s) no gaffer on this machine accepted are not listed \
                     (written into the store by something else); --include-unverified shows them"
                );
            }
            print(&v);
            Ok(ExitCode::SUCCESS)
        }
        OperatorCommand::Approve {
            id,
            duration_seconds,
            max_uses,
            expect,
        } => {
            let n = Narrowing {
                duration_seconds,
                max_uses,
            };
            let confirm = match expect {
                Some(digest) => Confirm::Expected(digest),
                None => Confirm::Ask,
            };
            decide(root, &id, DecisionKind::Approve, n, None, confirm).await
        }
        OperatorCommand::Deny { id, reason } => {
            let n = Narrowing::default();
            decide(root, &id, DecisionKind::Deny, n, reason, Confirm::AsPrinted).await
        }
        OperatorCommand::Revoke { id } => revoke(root, &id).await,
    }
}

fn key_command(c: OperatorCmd, root: &Path) -> Result<ExitCode, ExitCode> {
    let private = key_path().map_err(|e| fail(e, 1))?;
    let public = public_key_path().map_err(|e| fail(e, 1))?;
    match c {
        OperatorCmd::Path => {
            print(&json!({"private_key": private, "public_key": public}));
        }
        OperatorCmd::Init { rotate } => {
            if rotate
                && let Some(aside) =
                    crate::operator::keys::retire_legacy(&private).map_err(|e| fail(e, 1))?
            {
                eprintln!("gaffer: the old HMAC key was moved to {}", aside.display());
            }
            let key =
                OperatorSigner::init(&private, &public, Some(root)).map_err(|e| fail(e, 1))?;
            print(&json!({
                "private_key": private,
                "public_key": public,
                "fingerprint": key.fingerprint(),
            }));
        }
        OperatorCmd::Sign => {
            let signer = signer()?;
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| fail(e, 2))?;
            let text = text.strip_suffix('\n').unwrap_or(&text);
            let domain = crate::operator::signed::check_signable(text).map_err(|e| fail(e, 2))?;
            eprintln!("gaffer: signing a {domain} payload");
            println!("{}", signer.sign(text.as_bytes()));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// How `gaffer approve` makes sure the operator signs the plan they meant.
enum Confirm {
    /// The plan must still have this digest (the one the operator reviewed).
    Expected(String),
    /// Printed, then signed only once the operator says yes on the terminal.
    Ask,
    /// Printed and signed (a deny: it only refuses).
    AsPrinted,
}

/// Prepares the payload from the plan text as it is now, signs it here once `confirm` holds,
/// and records it.
async fn decide(
    root: &Path,
    id: &str,
    decision: DecisionKind,
    narrowing: Narrowing,
    reason: Option<String>,
    confirm: Confirm,
) -> Result<ExitCode, ExitCode> {
    let signer = signer()?;
    let app = open(root)?;
    if matches!(confirm, Confirm::Ask) && !std::io::stdin().is_terminal() {
        return Err(fail(
            "nothing signed: confirm on a terminal, or pass --expect PLAN_DIGEST (the \
             `plan_digest` of the approval you reviewed in `gaffer approvals`)",
            2,
        ));
    }
    // Decide at the request's current revision, binding the plan that is printed (or the one
    // the operator reviewed): a plan swapped behind the same ids is refused, never signed.
    let current = app.operations.approval(id).await.map_err(op_failed)?;
    let shown = match &confirm {
        Confirm::Expected(digest) => digest.clone(),
        _ => current.plan_digest.clone(),
    };
    let prepared = app
        .operations
        .prepare_decision(&DecisionRequest {
            id: current.approval_id.clone(),
            decision,
            expected_revision: current.revision,
            expected_plan_digest: Some(shown),
            narrowing,
            reason,
        })
        .await
        .map_err(op_failed)?;
    // The human sees what the signature grants before it is made (stderr: stdout is JSON).
    eprint!("{}", about_to_sign(&prepared));
    if matches!(confirm, Confirm::Ask) && !confirmed()? {
        return Err(fail("nothing signed", 1));
    }
    let sig = OperatorSignature::sign(&signer, &prepared.payload);
    let view = app
        .operations
        .decide(sig, &random_key())
        .await
        .map_err(op_failed)?;
    print(&serde_json::to_value(view).unwrap_or(Value::Null));
    Ok(ExitCode::SUCCESS)
}

/// Asks on the terminal whether to sign what was printed.
pub(super) fn confirmed() -> Result<bool, ExitCode> {
    eprint!("gaffer: sign this? [y/N] ");
    let mut answer = String::new();
    std::io::stdin()
        .read_line(&mut answer)
        .map_err(|e| fail(e, 2))?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}

/// What a prepared decision grants, in words: the plan as its adapter presents it, and for an
/// approval its mode, uses and expiry as the payload to be signed has them. Text the agent
/// chose is printed as [`visible`] makes it: it cannot rewrite what the operator reads.
fn about_to_sign(p: &PreparedDecision) -> String {
    let (d, a) = (&p.payload, &p.approval);
    let verb = match d.decision {
        DecisionKind::Approve => "approve",
        DecisionKind::Deny => "deny",
    };
    let mut out = format!(
        "gaffer: signing with the operator key:\n  {verb} {} (operation {}, {}, client {})\n",
        visible(&d.approval_id),
        visible(&d.operation_id),
        visible(&d.operation),
        visible(&d.client)
    );
    if !a.requester_verified {
        out.push_str(
            "  requester: NOT verified: no gaffer on this machine accepted this request from \
             that client (its record was written into the store by something else)\n",
        );
    }
    let title = visible(a.title.as_deref().unwrap_or(&d.operation));
    let summary = a.summary.as_deref().map(visible);
    let problem = a.plan_problem.as_deref().map(visible);
    match (&summary, &problem) {
        (_, Some(problem)) => out.push_str(&format!("  plan: {title}: cannot run: {problem}\n")),
        (Some(summary), None) => out.push_str(&format!("  plan: {title}: {summary}\n")),
        (None, None) => out.push_str(&format!("  plan: {title}\n")),
    }
    // Whole, whatever the summary had to cut: every argument and variable that runs.
    for (what, v) in [("target", &a.target), ("arguments", &a.arguments)] {
        if let Some(v) = v {
            out.push_str(&format!("  {what}: {}\n", super::output::json_line(v)));
        }
    }
    if let Some(expires) = d.expires_at_ms {
        let (mode, covers) = match d.mode {
            GrantMode::Execution => ("execution", "exactly this one execution".to_string()),
            GrantMode::Window => (
                "window",
                format!(
                    "up to {} operations of this client with this classification, not only \
                     this plan",
                    d.max_uses
                ),
            ),
        };
        let secs = expires.saturating_sub(d.decided_at_ms) / 1000;
        out.push_str(&format!(
            "  mode: {mode} ({covers})\n  max_uses: {}\n  expires: {} (in {secs} s)\n",
            d.max_uses,
            rfc3339(expires),
        ));
    }
    if let Some(r) = &d.reason {
        out.push_str(&format!("  reason: {}\n", visible(r)));
    }
    out
}

async fn revoke(root: &Path, id: &str) -> Result<ExitCode, ExitCode> {
    let signer = signer()?;
    let app = open_without_providers(root)?;
    let (payload, _) = app.operations.prepare_revoke(id, None).map_err(op_failed)?;
    let sig = OperatorSignature::sign(&signer, &payload);
    let view = app
        .operations
        .revoke(sig, Some(&random_key()))
        .await
        .map_err(op_failed)?;
    print(&serde_json::to_value(view).unwrap_or(Value::Null));
    Ok(ExitCode::SUCCESS)
}

async fn client(c: ClientCmd, root: &Path) -> Result<ExitCode, ExitCode> {
    let app = open_without_providers(root)?;
    let ws = &app.workspace;
    match c {
        ClientCmd::List => {
            let key = crate::operator::current_public()
                .ok_or_else(|| fail("no operator public key; run `gaffer operator init`", 3))?;
            let id = ws.workspace_id().unwrap_or_default();
            print(&json!({"clients": ws.read(|s| s.clients.list(&key, &id))}));
        }
        ClientCmd::Add { name } => {
            let signer = signer()?;
            let id = ws.ensure_workspace_id().await.map_err(|e| fail(e, 1))?;
            let issued = crate::clients::issue(&signer, &id, &name, ws.journal_head())
                .map_err(|e| fail(e, 2))?;
            commit(&app, vec![(crate::clients::KIND_ISSUED, issued.record)]).await?;
            print(&json!({
                "name": issued.payload.name,
                "credential_id": issued.payload.credential_id,
                // Shown once: the journal holds only its secret's digest.
                "token": issued.token,
                "use": format!("start gaffer with {}=<token>, or pass it as the `clientToken` initialize option", crate::clients::TOKEN_ENV),
            }));
        }
        ClientCmd::Revoke { name_or_id } => {
            let signer = signer()?;
            let key = signer.public();
            let id = ws.workspace_id().unwrap_or_default();
            // Every credential the name or id picks, whatever the journal says of it: records
            // the agent wrote (a flood of forged revocations) must not stop the operator's.
            let (matching, unsigned): (Vec<String>, Vec<String>) = ws.read(|s| {
                let matching: Vec<String> = s
                    .clients
                    .list(&key, &id)
                    .into_iter()
                    .filter(|c| {
                        c["name"] == name_or_id.as_str()
                            || c["credential_id"] == name_or_id.as_str()
                    })
                    .filter_map(|c| c["credential_id"].as_str().map(str::to_string))
                    .collect();
                let unsigned = matching
                    .iter()
                    .filter(|cid| !s.clients.revoked_by_operator(&key, &id, cid))
                    .cloned()
                    .collect();
                (matching, unsigned)
            });
            if matching.is_empty() {
                return Err(fail(format!("no credential named {name_or_id:?}"), 1));
            }
            // Outside the workspace first: a store cut back before the records below, here or
            // in a copy of it, cannot bring the credentials back.
            match ws.restricting_anchor() {
                Some(anchor) => {
                    for cid in &matching {
                        anchor.revoke_client(cid).map_err(|e| fail(e, 1))?;
                    }
                }
                None => eprintln!(
                    "gaffer: warning: no workspace anchor here, so the revocation is only in the \
                     journal (see `gaffer doctor`)"
                ),
            }
            let head = ws.journal_head();
            let recs: Vec<_> = unsigned
                .iter()
                .map(|cid| {
                    let r = crate::clients::revoke(&signer, &id, cid, head.clone());
                    (crate::clients::KIND_REVOKED, r)
                })
                .collect();
            if !recs.is_empty() {
                commit(&app, recs).await?;
            }
            print(&json!({"revoked": matching, "signed": unsigned}));
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn commit(
    app: &Arc<App>,
    recs: Vec<(&str, crate::clients::SignedRecord)>,
) -> Result<(), ExitCode> {
    let records = recs
        .into_iter()
        .map(|(k, r)| NewRecord::new(k, &r))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| fail(e, 1))?;
    app.workspace
        .commit(move |_| Ok::<_, String>((records, ())))
        .await
        .map_err(|e| match e {
            crate::workspace::CommitError::Rejected(e) => fail(e, 1),
            crate::workspace::CommitError::Store(e) => fail(e, 1),
        })
}
