//! Rendering a plan: the `output` wrappers (JSON contract of the reference, `dry_run: true`
//! everywhere), the dry-run specs (prompt bundle, ephemeral and persistent workers, task graph,
//! execution plan) and the text forms.
//!
//! Per-lane proof lists name the lane's own scopes rather than every request scope, so rendered
//! output grows linearly with the number of scopes (the reference repeats the whole scope list in
//! every lane, which is quadratic).

use std::borrow::Cow;
use std::fmt::Write as _;

use serde::Serialize;

use crate::json_out::{self, Raw};

use super::lanes::{Lane, LaneModelPolicy};
use super::plan::{Plan, PlanOutcome};
use super::policy::SharedList;
use super::runtime::{Mechanism, overlays_summary, scope_summary};
use super::vocab::{LaneRole, Pattern};

/// The `output` values, deprecated ones included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutputKind {
    Select,
    ExecutionPlan,
    PromptBundle,
    EphemeralWorkers,
    PersistentWorkers,
    TaskGraph,
    /// Deprecated name of `EphemeralWorkers`.
    Delegate,
    /// Deprecated name of `PersistentWorkers`.
    Swarm,
    /// Deprecated name of `TaskGraph`.
    Kanban,
}

impl OutputKind {
    /// Every accepted value, in alphabetical order (used in error messages).
    pub const ACCEPTED_SORTED: [&'static str; 9] = [
        "delegate",
        "ephemeral_workers",
        "execution_plan",
        "kanban",
        "persistent_workers",
        "prompt_bundle",
        "select",
        "swarm",
        "task_graph",
    ];

    pub fn parse(value: &str) -> Option<OutputKind> {
        Some(match value {
            "select" => OutputKind::Select,
            "execution_plan" => OutputKind::ExecutionPlan,
            "prompt_bundle" => OutputKind::PromptBundle,
            "ephemeral_workers" => OutputKind::EphemeralWorkers,
            "persistent_workers" => OutputKind::PersistentWorkers,
            "task_graph" => OutputKind::TaskGraph,
            "delegate" => OutputKind::Delegate,
            "swarm" => OutputKind::Swarm,
            "kanban" => OutputKind::Kanban,
            _ => return None,
        })
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            OutputKind::Select => "select",
            OutputKind::ExecutionPlan => "execution_plan",
            OutputKind::PromptBundle => "prompt_bundle",
            OutputKind::EphemeralWorkers => "ephemeral_workers",
            OutputKind::PersistentWorkers => "persistent_workers",
            OutputKind::TaskGraph => "task_graph",
            OutputKind::Delegate => "delegate",
            OutputKind::Swarm => "swarm",
            OutputKind::Kanban => "kanban",
        }
    }

    /// The wrapper's `kind`.
    pub const fn kind(self) -> &'static str {
        match self {
            OutputKind::Select => "worker_pattern_selection",
            OutputKind::ExecutionPlan => "worker_pattern_execution_plan",
            OutputKind::PromptBundle => "worker_pattern_prompt_bundle",
            OutputKind::EphemeralWorkers | OutputKind::Delegate => {
                "worker_pattern_ephemeral_worker_spec"
            }
            OutputKind::PersistentWorkers | OutputKind::Swarm => {
                "worker_pattern_persistent_worker_spec"
            }
            OutputKind::TaskGraph | OutputKind::Kanban => "worker_pattern_task_graph_spec",
        }
    }
}

/// The text forms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextForm {
    /// `select --text`: a short summary, ending with one newline.
    Summary,
    /// `render`: the prompt contract for all lanes (no trailing newline).
    PromptContract,
}

// ----- per-lane prompt parts -----------------------------------------------------------------

struct LaneParts {
    scope_summary: String,
    allowed_edits: String,
    expected_output: &'static str,
    proof: Vec<Cow<'static, str>>,
}

fn lane_parts(plan: &Plan<'_>, lane: &Lane) -> LaneParts {
    let req = plan.request;
    let summary = scope_summary(lane, req);
    let allowed_edits = if !lane.scope.is_empty() {
        format!(
            "Edit only the files that the lane scope ({}) requires.",
            lane.scope.join(", ")
        )
    } else if !req.scopes.is_empty() {
        format!(
            "Edit only the files that the request scopes ({}) require.",
            req.scopes.join(", ")
        )
    } else {
        "Edit only the files the objective directly requires.".to_owned()
    };
    // The plan's last proof line names every request scope; per lane, name the lane's scope.
    let shared = if req.scopes.is_empty() {
        &plan.proof_expectations[..]
    } else {
        &plan.proof_expectations[..plan.proof_expectations.len().saturating_sub(1)]
    };
    let mut proof: Vec<Cow<'static, str>> = shared.to_vec();
    if !req.scopes.is_empty() {
        proof.push(Cow::Owned(format!(
            "The summary names the scopes touched: {summary}."
        )));
    }
    let extra = role_proof_extra(lane.role);
    if let Some(extra) = extra
        && !proof.iter().any(|p| p == extra)
    {
        proof.push(Cow::Borrowed(extra));
    }
    LaneParts {
        scope_summary: summary,
        allowed_edits,
        expected_output: lane.role.expected_output(),
        proof,
    }
}

/// The proof line a role adds to the plan's (unless the plan already has it).
pub(super) fn role_proof_extra(role: LaneRole) -> Option<&'static str> {
    match role {
        LaneRole::Reviewer => Some(
            "The verdict is independent and lists every regression found, or says there were none.",
        ),
        LaneRole::Integrator => {
            Some("The integration summary names the merged scopes and the risks still open.")
        }
        LaneRole::VariantDesigner => {
            Some("The rationale explains how this variant differs from the others.")
        }
        _ => None,
    }
}

/// What a launched lane works under: its prompt contract (role, scope, purpose, proof
/// expectations, safety notes) and the proof expectations its evidence must meet.
pub struct LaneContract {
    pub prompt: String,
    pub proof: Vec<String>,
}

pub fn lane_contract(plan: &Plan<'_>, lane: &Lane) -> LaneContract {
    let parts = lane_parts(plan, lane);
    let mut prompt = lane_prompt(plan, lane, &parts);
    if !plan.safety_notes.is_empty() {
        prompt.push_str("\nSafety notes:\n");
        for note in &plan.safety_notes {
            let _ = writeln!(prompt, "- {note}");
        }
    }
    LaneContract {
        prompt,
        proof: parts.proof.iter().map(|p| p.to_string()).collect(),
    }
}

fn lane_prompt(plan: &Plan<'_>, lane: &Lane, parts: &LaneParts) -> String {
    let mut out = String::with_capacity(512);
    let _ = writeln!(out, "Role: {} lane", lane.role.as_str());
    let _ = writeln!(out, "Objective: {}", plan.request.objective);
    let _ = writeln!(
        out,
        "Worker pattern: {}",
        plan.selection.selected_pattern.as_str()
    );
    let _ = writeln!(out, "Purpose: {}", lane.purpose);
    let _ = writeln!(out, "Scope: {}", parts.scope_summary);
    let _ = writeln!(out, "Allowed edits: {}", parts.allowed_edits);
    let _ = writeln!(out, "Hand back: {}", parts.expected_output);
    out.push_str("Proof expected:\n");
    for line in &parts.proof {
        let _ = writeln!(out, "- {line}");
    }
    out.push_str("Nothing has been executed for you: stay inside your scope and do not set up runtime machinery of your own.");
    out
}

// ----- renderer objects ----------------------------------------------------------------------

#[derive(Debug, Clone, Serialize)]
pub struct BundleLane<'a> {
    pub role: LaneRole,
    pub purpose: &'a str,
    pub scope: &'a [String],
    pub scope_summary: String,
    pub selected_profile: &'a str,
    pub fallback_profiles: &'a [String],
    pub toolsets: &'a SharedList,
    pub allowed_edits: String,
    pub expected_output: &'static str,
    pub proof_expectations: Vec<Cow<'static, str>>,
    pub prompt: String,
    pub model_policy: LaneModelPolicy,
}

#[derive(Debug, Clone, Serialize)]
pub struct PromptBundle<'a> {
    pub task_objective: &'a str,
    pub selected_pattern: Pattern,
    pub primary_mechanism: Mechanism,
    pub fallback_mechanisms: &'a [Mechanism],
    pub overlays_summary: String,
    pub invocation_hint: &'a str,
    pub proof_expectations: &'a [Cow<'static, str>],
    pub safety_notes: &'a [Cow<'static, str>],
    pub lanes: Vec<BundleLane<'a>>,
}

pub fn prompt_bundle<'a>(plan: &'a Plan<'a>) -> PromptBundle<'a> {
    let lanes = plan
        .lanes
        .iter()
        .map(|lane| {
            let parts = lane_parts(plan, lane);
            let prompt = lane_prompt(plan, lane, &parts);
            BundleLane {
                role: lane.role,
                purpose: &lane.purpose,
                scope: &lane.scope,
                scope_summary: parts.scope_summary,
                selected_profile: &lane.selected_profile,
                fallback_profiles: &lane.fallback_profiles,
                toolsets: &lane.toolsets,
                allowed_edits: parts.allowed_edits,
                expected_output: parts.expected_output,
                proof_expectations: parts.proof,
                prompt,
                model_policy: lane.model_policy,
            }
        })
        .collect();
    PromptBundle {
        task_objective: &plan.request.objective,
        selected_pattern: plan.selection.selected_pattern,
        primary_mechanism: plan.runtime_mapping.primary_mechanism,
        fallback_mechanisms: &plan.runtime_mapping.fallback_mechanisms,
        overlays_summary: overlays_summary(&plan.selection.overlays),
        invocation_hint: plan.runtime_mapping.invocation_hint,
        proof_expectations: &plan.proof_expectations,
        safety_notes: &plan.safety_notes,
        lanes,
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct EphemeralTask<'a> {
    pub goal: String,
    pub context: String,
    pub toolsets: &'a SharedList,
    pub role: LaneRole,
    pub selected_profile: &'a str,
    pub fallback_profiles: &'a [String],
}

#[derive(Debug, Clone, Serialize)]
pub struct EphemeralSpec<'a> {
    pub mechanism: Mechanism,
    pub dry_run: bool,
    pub selected_pattern: Pattern,
    /// The task list, encoded once: `tasks` repeats it.
    pub workers: Raw,
    pub tasks: Raw,
    pub safety_notes: &'a [Cow<'static, str>],
}

fn ephemeral_tasks<'a>(plan: &'a Plan<'a>) -> Vec<EphemeralTask<'a>> {
    plan.lanes
        .iter()
        .map(|lane| {
            let parts = lane_parts(plan, lane);
            EphemeralTask {
                goal: format!(
                    "Take the {} lane of a {} plan for: {}. Hand back {}.",
                    lane.role.as_str(),
                    plan.selection.selected_pattern.as_str(),
                    plan.request.objective,
                    parts.expected_output
                ),
                context: format!(
                    "Scope: {}; {}; Purpose: {}; Proof: {}; Adapter contract: this is a dry-run spec and nothing has run yet.",
                    parts.scope_summary,
                    parts.allowed_edits,
                    lane.purpose,
                    parts.proof.join("; ")
                ),
                toolsets: &lane.toolsets,
                role: lane.role,
                selected_profile: &lane.selected_profile,
                fallback_profiles: &lane.fallback_profiles,
            }
        })
        .collect()
}

pub fn ephemeral_spec<'a>(plan: &'a Plan<'a>) -> EphemeralSpec<'a> {
    let workers = encoded(&ephemeral_tasks(plan));
    EphemeralSpec {
        mechanism: Mechanism::EphemeralWorkers,
        dry_run: true,
        selected_pattern: plan.selection.selected_pattern,
        tasks: workers.clone(),
        workers,
        safety_notes: &plan.safety_notes,
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct PersistentWorker<'a> {
    pub role: LaneRole,
    pub worker_profile: &'a str,
    pub profile: &'a str,
    pub fallback_profiles: &'a [String],
    pub toolsets: &'a SharedList,
    pub prompt: String,
    pub adapter_command: Option<String>,
    pub adapter_hint: &'static str,
}

#[derive(Debug, Clone, Serialize)]
pub struct PersistentSpec<'a> {
    pub mechanism: Mechanism,
    pub dry_run: bool,
    pub selected_pattern: Pattern,
    pub workers: Vec<PersistentWorker<'a>>,
    pub safety_notes: &'a [Cow<'static, str>],
}

fn persistent_workers<'a>(plan: &'a Plan<'a>) -> Vec<PersistentWorker<'a>> {
    plan.lanes
        .iter()
        .map(|lane| {
            let parts = lane_parts(plan, lane);
            PersistentWorker {
                role: lane.role,
                worker_profile: &lane.selected_profile,
                profile: &lane.selected_profile,
                fallback_profiles: &lane.fallback_profiles,
                toolsets: &lane.toolsets,
                prompt: lane_prompt(plan, lane, &parts),
                adapter_command: None,
                adapter_hint: "Map this logical profile onto a worker of your runtime before anything executes.",
            }
        })
        .collect()
}

pub fn persistent_spec<'a>(plan: &'a Plan<'a>) -> PersistentSpec<'a> {
    PersistentSpec {
        mechanism: Mechanism::PersistentWorkers,
        dry_run: true,
        selected_pattern: plan.selection.selected_pattern,
        workers: persistent_workers(plan),
        safety_notes: &plan.safety_notes,
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct GraphTask<'a> {
    pub id: String,
    pub title: String,
    pub role: LaneRole,
    pub scope: &'a [String],
    pub depends_on: Vec<String>,
    pub selected_profile: &'a str,
    pub prompt: String,
    pub dry_run: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct TaskGraphSpec<'a> {
    pub mechanism: Mechanism,
    pub dry_run: bool,
    pub selected_pattern: Pattern,
    pub tasks: Vec<GraphTask<'a>>,
    pub safety_notes: Vec<Cow<'static, str>>,
}

/// Graph tasks in lane order. Phase workers chain; an integrator waits for every earlier
/// non-reviewer task; a reviewer waits for the integrators, or for every earlier non-reviewer
/// task when there is no integrator; everything else starts free (the curator too, as in the
/// reference).
fn graph_tasks<'a>(plan: &'a Plan<'a>) -> Vec<GraphTask<'a>> {
    let mut tasks: Vec<GraphTask<'a>> = Vec::with_capacity(plan.lanes.len());
    let mut last_phase: Option<String> = None;
    let mut integrators: Vec<String> = Vec::new();
    let mut non_reviewers: Vec<String> = Vec::new();
    for (i, lane) in plan.lanes.iter().enumerate() {
        let id = format!("lane-{}-{}", i + 1, lane.role.as_str());
        let depends_on = match lane.role {
            LaneRole::PhaseWorker => last_phase.iter().cloned().collect(),
            LaneRole::Integrator => non_reviewers.clone(),
            LaneRole::Reviewer if !integrators.is_empty() => integrators.clone(),
            LaneRole::Reviewer => non_reviewers.clone(),
            _ => Vec::new(),
        };
        match lane.role {
            LaneRole::PhaseWorker => last_phase = Some(id.clone()),
            LaneRole::Integrator => integrators.push(id.clone()),
            _ => {}
        }
        if lane.role != LaneRole::Reviewer {
            non_reviewers.push(id.clone());
        }
        let parts = lane_parts(plan, lane);
        let title_scope = if lane.scope.is_empty() {
            lane.role.as_str().to_owned()
        } else {
            lane.scope.join(", ")
        };
        tasks.push(GraphTask {
            title: format!("{}: {}", lane.role.as_str(), title_scope),
            id,
            role: lane.role,
            scope: &lane.scope,
            depends_on,
            selected_profile: &lane.selected_profile,
            prompt: lane_prompt(plan, lane, &parts),
            dry_run: true,
        });
    }
    tasks
}

pub fn task_graph_spec<'a>(plan: &'a Plan<'a>) -> TaskGraphSpec<'a> {
    let mut notes = plan.safety_notes.clone();
    notes.push("Check the dependencies before creating any task: this graph is a dry run and creates nothing.".into());
    TaskGraphSpec {
        mechanism: Mechanism::TaskGraph,
        dry_run: true,
        selected_pattern: plan.selection.selected_pattern,
        tasks: graph_tasks(plan),
        safety_notes: notes,
    }
}

/// A lane as listed in the execution plan (no model policy).
#[derive(Debug, Clone, Serialize)]
pub struct PlanLane<'a> {
    pub role: LaneRole,
    pub count: u64,
    pub scope: &'a [String],
    pub purpose: &'a str,
    pub selected_profile: &'a str,
    pub fallback_profiles: &'a [String],
    pub toolsets: &'a SharedList,
    pub runtime_hint: &'a str,
}

#[derive(Debug, Clone, Serialize)]
pub struct ExecutionPlan<'a> {
    pub mechanism: Mechanism,
    pub lanes: Vec<PlanLane<'a>>,
    /// Always empty: gaffer renders plans, it does not issue commands.
    pub commands: Vec<String>,
    /// Task lists encoded once, since each is written twice (see [`encoded`]).
    pub ephemeral_worker_tasks: Raw,
    pub worker_specs: Vec<PersistentWorker<'a>>,
    pub task_graph_tasks: Raw,
    /// Deprecated copy of `ephemeral_worker_tasks`.
    pub delegate_tasks: Raw,
    /// Deprecated copy of `task_graph_tasks`.
    pub kanban_tasks: Raw,
    pub safety_notes: Vec<Cow<'static, str>>,
    pub dry_run: bool,
}

/// The execution plan's safety notes: the plan's, then what an execution plan adds.
pub(super) fn execution_plan_notes(plan: &Plan<'_>) -> Vec<Cow<'static, str>> {
    let mut notes = plan.safety_notes.clone();
    notes.push("This execution plan only renders specs; it runs nothing.".into());
    notes
        .push("The reserved execute switch fails closed until execution has been approved.".into());
    if let Some(scale) = &plan.module_swarm_scale {
        notes.push("These lanes are a logical decomposition; the adapter decides how they map onto real workers.".into());
        notes.push(
            format!(
                "Swarm scale: {} lanes requested, at most {} active at a time, over {} wave(s).",
                scale.requested_lane_count, scale.max_active_lanes, scale.waves_required
            )
            .into(),
        );
        if scale.integrator_per_wave {
            notes.push(
                "Because this swarm is risky or conflict-prone, fewer lanes run at once and every wave ends at an integration gate.".into(),
            );
        }
    }
    notes
}

pub fn execution_plan<'a>(plan: &'a Plan<'a>) -> ExecutionPlan<'a> {
    let mechanism = plan.runtime_mapping.primary_mechanism;
    let ephemeral = encoded(&if mechanism == Mechanism::EphemeralWorkers {
        ephemeral_tasks(plan)
    } else {
        Vec::new()
    });
    let persistent = if mechanism == Mechanism::PersistentWorkers {
        persistent_workers(plan)
    } else {
        Vec::new()
    };
    let graph = encoded(&if mechanism == Mechanism::TaskGraph {
        graph_tasks(plan)
    } else {
        Vec::new()
    });
    let notes = execution_plan_notes(plan);
    ExecutionPlan {
        mechanism,
        lanes: plan
            .lanes
            .iter()
            .map(|l| PlanLane {
                role: l.role,
                count: l.count,
                scope: &l.scope,
                purpose: &l.purpose,
                selected_profile: &l.selected_profile,
                fallback_profiles: &l.fallback_profiles,
                toolsets: &l.toolsets,
                runtime_hint: &l.runtime_hint,
            })
            .collect(),
        commands: Vec::new(),
        delegate_tasks: ephemeral.clone(),
        ephemeral_worker_tasks: ephemeral,
        worker_specs: persistent,
        kanban_tasks: graph.clone(),
        task_graph_tasks: graph,
        safety_notes: notes,
        dry_run: true,
    }
}

/// `value` as compact JSON text. Parts the output repeats are encoded once and copied: a copy
/// is a memcpy, a second encoding escapes every string again.
fn encoded<T: Serialize>(value: &T) -> Raw {
    // These types always encode (string keys, no fallible Serialize impls); null is only a
    // guard, never expected.
    json_out::to_raw(value).unwrap_or_else(|_| Raw::null())
}

// ----- the wrapper ---------------------------------------------------------------------------

/// The result of a selection call for one `output` value.
#[derive(Debug, Clone, Serialize)]
pub struct Rendered<'a> {
    pub dry_run: bool,
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<&'a Plan<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execution_plan: Option<ExecutionPlan<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_bundle: Option<PromptBundle<'a>>,
    /// Specs are encoded once: a deprecated alias (`delegate`, `swarm`, `kanban`) repeats them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ephemeral_workers: Option<Raw>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delegate: Option<Raw>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistent_workers: Option<Raw>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub swarm: Option<Raw>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_graph: Option<Raw>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kanban: Option<Raw>,
    /// gaffer addition: problems with optional inputs that did not affect the plan.
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    pub diagnostics: &'a [String],
}

pub fn render_output<'a>(outcome: &'a PlanOutcome<'a>, output: OutputKind) -> Rendered<'a> {
    let plan = &outcome.plan;
    let mut r = Rendered {
        dry_run: true,
        kind: output.kind(),
        plan: None,
        execution_plan: None,
        prompt_bundle: None,
        ephemeral_workers: None,
        delegate: None,
        persistent_workers: None,
        swarm: None,
        task_graph: None,
        kanban: None,
        diagnostics: &outcome.diagnostics,
    };
    match output {
        OutputKind::Select => r.plan = Some(plan),
        OutputKind::ExecutionPlan => {
            r.plan = Some(plan);
            r.execution_plan = Some(execution_plan(plan));
        }
        OutputKind::PromptBundle => r.prompt_bundle = Some(prompt_bundle(plan)),
        OutputKind::EphemeralWorkers => r.ephemeral_workers = Some(encoded(&ephemeral_spec(plan))),
        OutputKind::Delegate => {
            let spec = encoded(&ephemeral_spec(plan));
            r.delegate = Some(spec.clone());
            r.ephemeral_workers = Some(spec);
        }
        OutputKind::PersistentWorkers => {
            r.persistent_workers = Some(encoded(&persistent_spec(plan)));
        }
        OutputKind::Swarm => {
            let spec = encoded(&persistent_spec(plan));
            r.swarm = Some(spec.clone());
            r.persistent_workers = Some(spec);
        }
        OutputKind::TaskGraph => r.task_graph = Some(encoded(&task_graph_spec(plan))),
        OutputKind::Kanban => {
            let spec = encoded(&task_graph_spec(plan));
            r.kanban = Some(spec.clone());
            r.task_graph = Some(spec);
        }
    }
    r
}

/// Appends the wrapper for `output` to `out` as compact JSON: what a reply carries. The
/// common forms are written by [`super::encode`], the rest through serde.
pub fn write_output(
    outcome: &PlanOutcome<'_>,
    output: OutputKind,
    out: &mut Vec<u8>,
) -> Result<(), json_out::Error> {
    match super::encode::write(outcome, output, out) {
        Some(done) => done,
        None => write_output_serde(outcome, output, out),
    }
}

/// [`write_output`] through the serde renderers for every form: the reference that
/// [`super::encode`] is tested against.
pub fn write_output_serde(
    outcome: &PlanOutcome<'_>,
    output: OutputKind,
    out: &mut Vec<u8>,
) -> Result<(), json_out::Error> {
    json_out::write(out, &render_output(outcome, output))
}

// ----- text forms ----------------------------------------------------------------------------

pub fn render_text_form(outcome: &PlanOutcome<'_>, form: TextForm) -> String {
    match form {
        TextForm::Summary => summary_text(&outcome.plan),
        TextForm::PromptContract => prompt_contract_text(&outcome.plan),
    }
}

/// `select --text`.
pub fn summary_text(plan: &Plan<'_>) -> String {
    let mut out = String::with_capacity(1024);
    let _ = writeln!(
        out,
        "selected_pattern: {}",
        plan.selection.selected_pattern.as_str()
    );
    let _ = writeln!(
        out,
        "overlays: {}",
        overlays_summary(&plan.selection.overlays)
    );
    let _ = writeln!(out, "reason: {}", plan.selection.reason);
    let _ = writeln!(
        out,
        "runtime_primary: {}",
        plan.runtime_mapping.primary_mechanism.as_str()
    );
    let _ = writeln!(
        out,
        "runtime_hint: {}",
        plan.runtime_mapping.invocation_hint
    );
    out.push_str("lanes:\n");
    for lane in &plan.lanes {
        let scopes = if lane.scope.is_empty() {
            "n/a".to_owned()
        } else {
            lane.scope.join(", ")
        };
        let _ = writeln!(
            out,
            "  - {}: {} [{}] -> {}",
            lane.role.as_str(),
            lane.purpose,
            scopes,
            lane.selected_profile
        );
    }
    out.push_str("proof_expectations:\n");
    for line in &plan.proof_expectations {
        let _ = writeln!(out, "  - {line}");
    }
    out
}

/// `render` / `render-prompts --text`: the contract every lane works under.
pub fn prompt_contract_text(plan: &Plan<'_>) -> String {
    let mut out = String::with_capacity(2048);
    let _ = writeln!(out, "Objective: {}", plan.request.objective);
    let _ = writeln!(
        out,
        "Worker pattern: {}",
        plan.selection.selected_pattern.as_str()
    );
    let _ = writeln!(
        out,
        "Mechanism: {}",
        plan.runtime_mapping.primary_mechanism.as_str()
    );
    let _ = writeln!(
        out,
        "Overlays: {}",
        overlays_summary(&plan.selection.overlays)
    );
    let _ = writeln!(
        out,
        "Runtime hint: {}",
        plan.runtime_mapping.invocation_hint
    );
    out.push_str("\nLanes:\n");
    for (i, lane) in plan.lanes.iter().enumerate() {
        let parts = lane_parts(plan, lane);
        let _ = writeln!(out, "\n{}. {}", i + 1, lane.role.as_str());
        let _ = writeln!(out, "   Scope: {}", parts.scope_summary);
        let _ = writeln!(out, "   Allowed edits: {}", parts.allowed_edits);
        let _ = writeln!(out, "   Hand back: {}", parts.expected_output);
        out.push_str("   Proof expected:\n");
        for line in &parts.proof {
            let _ = writeln!(out, "   - {line}");
        }
    }
    out.push_str(
        "\nDry run only: no worker has been started and no runtime setting has been changed.",
    );
    out
}
