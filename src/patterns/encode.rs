//! The replies most calls ask for (the selection, the execution plan, the ephemeral and
//! persistent worker specs) written straight into the reply buffer: the bytes `json_out`
//! writes for [`super::render::Rendered`], without building each lane's prompts, task texts
//! and renderer structs first. Fixed text is written pre-escaped; only request text and policy
//! names go through the escaper; what a reply repeats is copied from where it was first
//! written. The other forms, and the `Value` path, keep the serde renderers;
//! `patterns_properties` holds the two byte-for-byte equal.

use std::borrow::Cow;
use std::ops::Range;

use crate::json_out::{self, Error, escape_into, string_into};

use super::lanes::Lane;
use super::plan::{Plan, PlanOutcome};
use super::render::{OutputKind, execution_plan_notes, role_proof_extra};
use super::request::PatternRequest;
use super::runtime::{BOUNDED_SCOPE, Mechanism, overlays_summary};
use super::select::Selection;
use super::signals::KEYWORD_ORDER;
use super::vocab::{Dimension, LaneRole, Pattern};

/// What a form writes between the wrapper's `kind` and its diagnostics.
type Body = fn(&Plan<'_>, OutputKind, &mut Vec<u8>) -> Result<(), Error>;

/// Writes the wrapper for `output` if it is one this module encodes; `None` otherwise.
pub fn write(
    outcome: &PlanOutcome<'_>,
    output: OutputKind,
    out: &mut Vec<u8>,
) -> Option<Result<(), Error>> {
    let body: Body = match output {
        OutputKind::Select | OutputKind::ExecutionPlan => plan_forms,
        OutputKind::EphemeralWorkers | OutputKind::Delegate => ephemeral_forms,
        OutputKind::PersistentWorkers | OutputKind::Swarm => persistent_forms,
        OutputKind::TaskGraph | OutputKind::Kanban => graph_forms,
        OutputKind::PromptBundle => return None,
    };
    Some(wrapper(outcome, output, body, out))
}

fn wrapper(
    outcome: &PlanOutcome<'_>,
    output: OutputKind,
    body: Body,
    out: &mut Vec<u8>,
) -> Result<(), Error> {
    lit(out, "{\"dry_run\":true,\"kind\":");
    string_into(out, output.kind());
    body(&outcome.plan, output, out)?;
    if !outcome.diagnostics.is_empty() {
        lit(out, ",\"diagnostics\":");
        json_out::write(out, &outcome.diagnostics)?;
    }
    out.push(b'}');
    Ok(())
}

/// `plan`, and for the execution plan `execution_plan`.
fn plan_forms(plan: &Plan<'_>, output: OutputKind, out: &mut Vec<u8>) -> Result<(), Error> {
    lit(out, ",\"plan\":");
    let lanes = plan_object(plan, out)?;
    if output == OutputKind::ExecutionPlan {
        lit(out, ",\"execution_plan\":");
        execution_plan(plan, &lanes, out)?;
    }
    Ok(())
}

/// `ephemeral_workers`, copied under `delegate` for that (deprecated) name.
fn ephemeral_forms(plan: &Plan<'_>, output: OutputKind, out: &mut Vec<u8>) -> Result<(), Error> {
    let spec_start = spec_head(plan, "ephemeral_workers", out);
    lit(out, ",\"workers\":");
    let tasks = out.len();
    ephemeral_tasks(plan, out);
    let tasks = tasks..out.len();
    lit(out, ",\"tasks\":");
    out.extend_from_within(tasks);
    lit(out, ",\"safety_notes\":");
    json_out::write(out, &plan.safety_notes)?;
    out.push(b'}');
    copy_under(out, spec_start, output == OutputKind::Delegate, "delegate");
    Ok(())
}

/// `persistent_workers`, copied under `swarm` for that (deprecated) name.
fn persistent_forms(plan: &Plan<'_>, output: OutputKind, out: &mut Vec<u8>) -> Result<(), Error> {
    let spec_start = spec_head(plan, "persistent_workers", out);
    lit(out, ",\"workers\":");
    persistent_workers(plan, out);
    lit(out, ",\"safety_notes\":");
    json_out::write(out, &plan.safety_notes)?;
    out.push(b'}');
    copy_under(out, spec_start, output == OutputKind::Swarm, "swarm");
    Ok(())
}

/// `task_graph`, copied under `kanban` for that (deprecated) name.
fn graph_forms(plan: &Plan<'_>, output: OutputKind, out: &mut Vec<u8>) -> Result<(), Error> {
    let spec_start = spec_head(plan, "task_graph", out);
    lit(out, ",\"tasks\":");
    graph_tasks(plan, out);
    lit(out, ",\"safety_notes\":[");
    for note in &plan.safety_notes {
        string_into(out, note);
        out.push(b',');
    }
    lit(
        out,
        "\"Check the dependencies before creating any task: this graph is a dry run and creates nothing.\"]}",
    );
    copy_under(out, spec_start, output == OutputKind::Kanban, "kanban");
    Ok(())
}

/// Opens a worker spec under its mechanism's name: `,"<mechanism>":{"mechanism":…,
/// "dry_run":true,"selected_pattern":…`; returns where the spec's object starts.
fn spec_head(plan: &Plan<'_>, mechanism: &str, out: &mut Vec<u8>) -> usize {
    lit(out, ",\"");
    lit(out, mechanism);
    lit(out, "\":");
    let start = out.len();
    lit(out, "{\"mechanism\":\"");
    lit(out, mechanism);
    lit(out, "\",\"dry_run\":true,\"selected_pattern\":");
    pattern(out, plan.selection.selected_pattern);
    start
}

/// When `wanted`, the spec written since `start` again under its deprecated `alias`.
fn copy_under(out: &mut Vec<u8>, start: usize, wanted: bool, alias: &str) {
    if wanted {
        let spec = start..out.len();
        lit(out, ",\"");
        lit(out, alias);
        lit(out, "\":");
        out.extend_from_within(spec);
    }
}

/// JSON text known to need no escaping (literals of this module).
#[inline]
fn lit(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(text.as_bytes());
}

fn string_list(out: &mut Vec<u8>, items: &[String]) {
    out.push(b'[');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        string_into(out, item);
    }
    out.push(b']');
}

/// `items` joined by ", ", escaped (inside a string).
fn joined(out: &mut Vec<u8>, items: &[String]) {
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            lit(out, ", ");
        }
        escape_into(out, item);
    }
}

fn count(out: &mut Vec<u8>, n: impl itoa::Integer) {
    lit(out, itoa::Buffer::new().format(n));
}

fn boolean(out: &mut Vec<u8>, b: bool) {
    lit(out, if b { "true" } else { "false" });
}

/// A pattern name as a string (names are fixed ASCII).
fn pattern(out: &mut Vec<u8>, p: Pattern) {
    out.push(b'"');
    lit(out, p.as_str());
    out.push(b'"');
}

/// The request echo.
fn request(req: &PatternRequest, out: &mut Vec<u8>) {
    lit(out, "{\"objective\":");
    string_into(out, &req.objective);
    lit(out, ",\"scopes\":");
    string_list(out, &req.scopes);
    lit(out, ",\"dependencies\":");
    string_list(out, &req.dependencies);
    lit(out, ",\"risk_level\":");
    string_into(out, &req.risk_level);
    lit(out, ",\"review_required\":");
    boolean(out, req.review_required);
    lit(out, ",\"tests_required\":");
    boolean(out, req.tests_required);
    lit(out, ",\"variants_requested\":");
    count(out, req.variants_requested);
    lit(out, ",\"durable\":");
    boolean(out, req.durable);
    lit(out, ",\"persistent_workers\":");
    boolean(out, req.persistent_workers);
    lit(out, ",\"recovery\":");
    boolean(out, req.recovery);
    lit(out, ",\"max_parallel_lanes\":");
    count(out, req.max_parallel_lanes);
    lit(out, ",\"notes\":");
    string_list(out, &req.notes);
    out.push(b'}');
}

/// `{"name":value,…}` for fixed ASCII names.
fn int_map<'a>(out: &mut Vec<u8>, entries: impl Iterator<Item = (&'a str, i64)>) {
    out.push(b'{');
    for (i, (name, v)) in entries.enumerate() {
        lit(out, if i > 0 { ",\"" } else { "\"" });
        lit(out, name);
        lit(out, "\":");
        count(out, v);
    }
    out.push(b'}');
}

fn selection(sel: &Selection, out: &mut Vec<u8>) {
    lit(out, "{\"selected_pattern\":");
    pattern(out, sel.selected_pattern);
    lit(out, ",\"overlays\":[");
    for (i, p) in sel.overlays.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        pattern(out, *p);
    }
    lit(out, "],\"reason\":");
    string_into(out, &sel.reason);
    lit(out, ",\"dimensions\":");
    let dims = &sel.dimensions;
    int_map(
        out,
        Dimension::ALL.iter().map(|&d| (d.as_str(), dims.get(d))),
    );
    lit(out, ",\"matched_signals\":");
    string_list(out, &sel.matched_signals);
    lit(out, ",\"scores\":");
    int_map(
        out,
        Pattern::BASE
            .iter()
            .zip(sel.scores.0)
            .map(|(p, v)| (p.as_str(), v)),
    );
    lit(out, ",\"score_adjustments\":");
    let adj = &sel.score_adjustments;
    int_map(
        out,
        KEYWORD_ORDER
            .iter()
            .filter_map(|&p| adj.0[p.index()].map(|v| (p.as_str(), v))),
    );
    lit(out, ",\"selection_source\":\"");
    lit(out, sel.selection_source.as_str());
    lit(out, "\",\"selector_version\":");
    string_into(out, &sel.selector_version);
    lit(out, ",\"override\":");
    string_into(out, &sel.override_pattern);
    lit(out, ",\"override_requested_by\":");
    string_into(out, &sel.override_requested_by);
    lit(out, ",\"override_reason\":");
    string_into(out, &sel.override_reason);
    lit(out, ",\"invalid_override_reason\":");
    string_into(out, &sel.invalid_override_reason);
    out.push(b'}');
}

// ----- the plan ------------------------------------------------------------------------------

/// Where the plan wrote a lane's parts that the execution plan lists again: its head
/// (role, count, scope, purpose), `,"runtime_hint":…` and its profile (selected, fallbacks,
/// toolsets), as offsets into the reply: the second listing copies them.
struct LaneBytes {
    head: usize,
    hint: usize,
    profile: usize,
    end: usize,
}

/// Writes the plan; returns where each lane's parts are.
fn plan_object(plan: &Plan<'_>, out: &mut Vec<u8>) -> Result<Vec<LaneBytes>, Error> {
    lit(out, "{\"request\":");
    request(plan.request, out);
    lit(out, ",\"selection\":");
    selection(&plan.selection, out);
    lit(out, ",\"lanes\":[");
    let mut lanes = Vec::with_capacity(plan.lanes.len());
    for (i, lane) in plan.lanes.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        lanes.push(plan_lane(lane, out));
    }
    lit(out, "],\"runtime_mapping\":");
    runtime_mapping(plan, out);
    lit(out, ",\"proof_expectations\":");
    json_out::write(out, &plan.proof_expectations)?;
    lit(out, ",\"safety_notes\":");
    json_out::write(out, &plan.safety_notes)?;
    lit(out, ",\"role_rules\":");
    lit(out, plan.role_rules.get());
    lit(out, ",\"profile_mapping\":");
    lit(out, plan.profile_mapping.get());
    lit(out, ",\"module_swarm_scale\":");
    json_out::write(out, &plan.module_swarm_scale)?;
    out.push(b'}');
    Ok(lanes)
}

fn runtime_mapping(plan: &Plan<'_>, out: &mut Vec<u8>) {
    let m = &plan.runtime_mapping;
    lit(out, "{\"primary_mechanism\":\"");
    lit(out, m.primary_mechanism.as_str());
    lit(out, "\",\"fallback_mechanisms\":[");
    for (i, f) in m.fallback_mechanisms.iter().enumerate() {
        lit(out, if i > 0 { ",\"" } else { "\"" });
        lit(out, f.as_str());
        out.push(b'"');
    }
    lit(out, "],\"invocation_hint\":");
    string_into(out, m.invocation_hint);
    lit(out, ",\"prompt_contract\":\"");
    prompt_contract(plan, out);
    lit(out, "\"}");
}

/// The plan's prompt contract, escaped (the text of [`super::runtime::prompt_contract`]).
fn prompt_contract(plan: &Plan<'_>, out: &mut Vec<u8>) {
    let m = &plan.runtime_mapping;
    lit(out, "Objective: ");
    escape_into(out, &plan.request.objective);
    lit(out, "\\nWorker pattern: ");
    lit(out, plan.selection.selected_pattern.as_str());
    lit(out, "\\nMechanism: ");
    lit(out, m.primary_mechanism.as_str());
    lit(out, "\\nOverlays: ");
    escape_into(out, &overlays_summary(&plan.selection.overlays));
    lit(out, "\\nRuntime hint: ");
    escape_into(out, m.invocation_hint);
    lit(out, "\\nLanes:\\n");
    for lane in &plan.lanes {
        let mut summary = None;
        lit(out, "- Role: ");
        lit(out, lane.role.as_str());
        lit(out, "\\n  Scope: ");
        scope_summary(plan, lane, &mut summary, out);
        lit(out, "\\n  Purpose: ");
        escape_into(out, &lane.purpose);
        lit(out, "\\n  Edits: only files that ");
        scope_summary(plan, lane, &mut summary, out);
        lit(
            out,
            " needs\\n  Report: what changed, the evidence, and any risk left open\\n",
        );
    }
    lit(
        out,
        "Dry run: start no workers and change no runtime settings.",
    );
}

/// `"role":…,"count":…,"scope":…,"purpose":…`: how both lane lists begin.
fn lane_head(lane: &Lane, out: &mut Vec<u8>) {
    lit(out, "{\"role\":\"");
    lit(out, lane.role.as_str());
    lit(out, "\",\"count\":");
    count(out, lane.count);
    lit(out, ",\"scope\":");
    string_list(out, &lane.scope);
    lit(out, ",\"purpose\":");
    string_into(out, &lane.purpose);
}

/// `"selected_profile":…,"fallback_profiles":…,"toolsets":…`.
fn lane_profile(lane: &Lane, out: &mut Vec<u8>) {
    lit(out, ",\"selected_profile\":");
    string_into(out, &lane.selected_profile);
    lit(out, ",\"fallback_profiles\":");
    lit(out, lane.fallback_profiles.json());
    lit(out, ",\"toolsets\":");
    lit(out, lane.toolsets.json());
}

/// A [`Lane`] as the plan lists it.
fn plan_lane(lane: &Lane, out: &mut Vec<u8>) -> LaneBytes {
    let head = out.len();
    lane_head(lane, out);
    let hint = out.len();
    lit(out, ",\"runtime_hint\":");
    string_into(out, &lane.runtime_hint);
    let profile = out.len();
    lane_profile(lane, out);
    let end = out.len();
    lit(out, ",\"model_policy\":{\"disable_reasoning\":");
    lit(
        out,
        if lane.model_policy.disable_reasoning {
            "true}}"
        } else {
            "false}}"
        },
    );
    LaneBytes {
        head,
        hint,
        profile,
        end,
    }
}

// ----- the execution plan --------------------------------------------------------------------

fn execution_plan(plan: &Plan<'_>, lanes: &[LaneBytes], out: &mut Vec<u8>) -> Result<(), Error> {
    let mechanism = plan.runtime_mapping.primary_mechanism;
    lit(out, "{\"mechanism\":\"");
    lit(out, mechanism.as_str());
    lit(out, "\",\"lanes\":[");
    for (i, at) in lanes.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_within(at.head..at.hint);
        out.extend_from_within(at.profile..at.end);
        out.extend_from_within(at.hint..at.profile);
        out.push(b'}');
    }
    lit(out, "],\"commands\":[],\"ephemeral_worker_tasks\":");
    // Each task list is written once and copied where the plan repeats it.
    let ephemeral_start = out.len();
    if mechanism == Mechanism::EphemeralWorkers {
        ephemeral_tasks(plan, out);
    } else {
        lit(out, "[]");
    }
    let ephemeral = ephemeral_start..out.len();
    lit(out, ",\"worker_specs\":");
    if mechanism == Mechanism::PersistentWorkers {
        persistent_workers(plan, out);
    } else {
        lit(out, "[]");
    }
    lit(out, ",\"task_graph_tasks\":");
    let graph_start = out.len();
    if mechanism == Mechanism::TaskGraph {
        graph_tasks(plan, out);
    } else {
        lit(out, "[]");
    }
    let graph = graph_start..out.len();
    lit(out, ",\"delegate_tasks\":");
    out.extend_from_within(ephemeral);
    lit(out, ",\"kanban_tasks\":");
    out.extend_from_within(graph);
    lit(out, ",\"safety_notes\":");
    json_out::write(out, &execution_plan_notes(plan))?;
    lit(out, ",\"dry_run\":true}");
    Ok(())
}

/// Writes bytes the reply has already written at `at`, or writes them with `write` and
/// remembers where: what a reply repeats is escaped once and copied after.
fn once(at: &mut Option<Range<usize>>, out: &mut Vec<u8>, write: impl FnOnce(&mut Vec<u8>)) {
    match at {
        Some(r) => out.extend_from_within(r.clone()),
        None => {
            let start = out.len();
            write(out);
            *at = Some(start..out.len());
        }
    }
}

/// A lane's scope for prompts (escaped): its own scopes, else the request's, else the
/// bounded-scope phrase. `at` is where this lane's text last wrote it.
fn scope_summary(plan: &Plan<'_>, lane: &Lane, at: &mut Option<Range<usize>>, out: &mut Vec<u8>) {
    once(at, out, |out| {
        if !lane.scope.is_empty() {
            joined(out, &lane.scope);
        } else if !plan.request.scopes.is_empty() {
            joined(out, &plan.request.scopes);
        } else {
            escape_into(out, BOUNDED_SCOPE);
        }
    });
}

/// The scopes it names are the lane's scope summary (when there are any).
fn allowed_edits(plan: &Plan<'_>, lane: &Lane, at: &mut Option<Range<usize>>, out: &mut Vec<u8>) {
    if !lane.scope.is_empty() {
        lit(out, "Edit only the files that the lane scope (");
        scope_summary(plan, lane, at, out);
        lit(out, ") requires.");
    } else if !plan.request.scopes.is_empty() {
        lit(out, "Edit only the files that the request scopes (");
        scope_summary(plan, lane, at, out);
        lit(out, ") require.");
    } else {
        lit(out, "Edit only the files the objective directly requires.");
    }
}

/// A lane's proof lines: the plan's (`shared`, the same for every lane), with its last line
/// (every request scope) naming the lane's scope instead when `scoped`, then the role's own.
struct LaneProof<'a> {
    shared: &'a [Cow<'static, str>],
    scoped: bool,
    extra: Option<&'static str>,
}

fn lane_proof<'a>(plan: &'a Plan<'_>, lane: &Lane) -> LaneProof<'a> {
    let scoped = !plan.request.scopes.is_empty();
    let all = &plan.proof_expectations[..];
    let shared = if scoped {
        &all[..all.len().saturating_sub(1)]
    } else {
        all
    };
    let extra = role_proof_extra(lane.role).filter(|e| !shared.iter().any(|p| p == e));
    LaneProof {
        shared,
        scoped,
        extra,
    }
}

/// Where a reply first wrote the shared proof lines, in each of their two forms.
#[derive(Default)]
struct SharedProof {
    /// `a; b` (task contexts).
    joined: Option<Range<usize>>,
    /// `- a\n- b\n` (prompts).
    listed: Option<Range<usize>>,
}

fn scopes_touched(plan: &Plan<'_>, lane: &Lane, at: &mut Option<Range<usize>>, out: &mut Vec<u8>) {
    lit(out, "The summary names the scopes touched: ");
    scope_summary(plan, lane, at, out);
    out.push(b'.');
}

/// The lane's proof lines joined by "; ".
fn proof_joined(
    plan: &Plan<'_>,
    lane: &Lane,
    seen: &mut SharedProof,
    at: &mut Option<Range<usize>>,
    out: &mut Vec<u8>,
) {
    let proof = lane_proof(plan, lane);
    once(&mut seen.joined, out, |out| {
        for (j, line) in proof.shared.iter().enumerate() {
            if j > 0 {
                lit(out, "; ");
            }
            escape_into(out, line);
        }
    });
    let mut any = !proof.shared.is_empty();
    if proof.scoped {
        if any {
            lit(out, "; ");
        }
        any = true;
        scopes_touched(plan, lane, at, out);
    }
    if let Some(extra) = proof.extra {
        if any {
            lit(out, "; ");
        }
        escape_into(out, extra);
    }
}

/// The lane's proof lines as a list, one `- line` each.
fn proof_listed(
    plan: &Plan<'_>,
    lane: &Lane,
    seen: &mut SharedProof,
    at: &mut Option<Range<usize>>,
    out: &mut Vec<u8>,
) {
    let proof = lane_proof(plan, lane);
    once(&mut seen.listed, out, |out| {
        for line in proof.shared {
            lit(out, "- ");
            escape_into(out, line);
            lit(out, "\\n");
        }
    });
    if proof.scoped {
        lit(out, "- ");
        scopes_touched(plan, lane, at, out);
        lit(out, "\\n");
    }
    if let Some(extra) = proof.extra {
        lit(out, "- ");
        escape_into(out, extra);
        lit(out, "\\n");
    }
}

fn ephemeral_tasks(plan: &Plan<'_>, out: &mut Vec<u8>) {
    let mut seen = SharedProof::default();
    out.push(b'[');
    for (i, lane) in plan.lanes.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let mut summary = None;
        lit(out, "{\"goal\":\"Take the ");
        lit(out, lane.role.as_str());
        lit(out, " lane of a ");
        lit(out, plan.selection.selected_pattern.as_str());
        lit(out, " plan for: ");
        escape_into(out, &plan.request.objective);
        lit(out, ". Hand back ");
        escape_into(out, lane.role.expected_output());
        lit(out, ".\",\"context\":\"Scope: ");
        scope_summary(plan, lane, &mut summary, out);
        lit(out, "; ");
        allowed_edits(plan, lane, &mut summary, out);
        lit(out, "; Purpose: ");
        escape_into(out, &lane.purpose);
        lit(out, "; Proof: ");
        proof_joined(plan, lane, &mut seen, &mut summary, out);
        lit(
            out,
            "; Adapter contract: this is a dry-run spec and nothing has run yet.\",\"toolsets\":",
        );
        lit(out, lane.toolsets.json());
        lit(out, ",\"role\":\"");
        lit(out, lane.role.as_str());
        lit(out, "\",\"selected_profile\":");
        string_into(out, &lane.selected_profile);
        lit(out, ",\"fallback_profiles\":");
        lit(out, lane.fallback_profiles.json());
        out.push(b'}');
    }
    out.push(b']');
}

/// `lane-<n>-<role>`, the id of the task of lane `i`.
fn task_id(plan: &Plan<'_>, i: usize, out: &mut Vec<u8>) {
    lit(out, "\"lane-");
    count(out, i + 1);
    out.push(b'-');
    lit(out, plan.lanes[i].role.as_str());
    out.push(b'"');
}

/// The graph tasks (the dependencies of [`super::render`]'s `graph_tasks`), lanes by index.
fn graph_tasks(plan: &Plan<'_>, out: &mut Vec<u8>) {
    let mut seen = SharedProof::default();
    let mut last_phase: Option<usize> = None;
    let mut integrators: Vec<usize> = Vec::new();
    let mut non_reviewers: Vec<usize> = Vec::new();
    out.push(b'[');
    for (i, lane) in plan.lanes.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        lit(out, "{\"id\":");
        task_id(plan, i, out);
        lit(out, ",\"title\":\"");
        lit(out, lane.role.as_str());
        lit(out, ": ");
        if lane.scope.is_empty() {
            lit(out, lane.role.as_str());
        } else {
            joined(out, &lane.scope);
        }
        lit(out, "\",\"role\":\"");
        lit(out, lane.role.as_str());
        lit(out, "\",\"scope\":");
        string_list(out, &lane.scope);
        lit(out, ",\"depends_on\":[");
        let depends_on: &[usize] = match lane.role {
            LaneRole::PhaseWorker => last_phase.as_slice(),
            LaneRole::Integrator => &non_reviewers,
            LaneRole::Reviewer if !integrators.is_empty() => &integrators,
            LaneRole::Reviewer => &non_reviewers,
            _ => &[],
        };
        for (j, &dep) in depends_on.iter().enumerate() {
            if j > 0 {
                out.push(b',');
            }
            task_id(plan, dep, out);
        }
        lit(out, "],\"selected_profile\":");
        string_into(out, &lane.selected_profile);
        lit(out, ",\"prompt\":\"");
        lane_prompt(plan, lane, &mut seen, out);
        lit(out, "\",\"dry_run\":true}");
        match lane.role {
            LaneRole::PhaseWorker => last_phase = Some(i),
            LaneRole::Integrator => integrators.push(i),
            _ => {}
        }
        if lane.role != LaneRole::Reviewer {
            non_reviewers.push(i);
        }
    }
    out.push(b']');
}

fn persistent_workers(plan: &Plan<'_>, out: &mut Vec<u8>) {
    let mut seen = SharedProof::default();
    out.push(b'[');
    for (i, lane) in plan.lanes.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        lit(out, "{\"role\":\"");
        lit(out, lane.role.as_str());
        lit(out, "\",\"worker_profile\":");
        string_into(out, &lane.selected_profile);
        lit(out, ",\"profile\":");
        string_into(out, &lane.selected_profile);
        lit(out, ",\"fallback_profiles\":");
        lit(out, lane.fallback_profiles.json());
        lit(out, ",\"toolsets\":");
        lit(out, lane.toolsets.json());
        lit(out, ",\"prompt\":\"");
        lane_prompt(plan, lane, &mut seen, out);
        lit(
            out,
            "\",\"adapter_command\":null,\"adapter_hint\":\"Map this logical profile onto a worker of your runtime before anything executes.\"}",
        );
    }
    out.push(b']');
}

/// A lane's prompt, escaped (the text of [`super::render`]'s `lane_prompt`).
fn lane_prompt(plan: &Plan<'_>, lane: &Lane, seen: &mut SharedProof, out: &mut Vec<u8>) {
    let mut summary = None;
    lit(out, "Role: ");
    lit(out, lane.role.as_str());
    lit(out, " lane\\nObjective: ");
    escape_into(out, &plan.request.objective);
    lit(out, "\\nWorker pattern: ");
    lit(out, plan.selection.selected_pattern.as_str());
    lit(out, "\\nPurpose: ");
    escape_into(out, &lane.purpose);
    lit(out, "\\nScope: ");
    scope_summary(plan, lane, &mut summary, out);
    lit(out, "\\nAllowed edits: ");
    allowed_edits(plan, lane, &mut summary, out);
    lit(out, "\\nHand back: ");
    escape_into(out, lane.role.expected_output());
    lit(out, "\\nProof expected:\\n");
    proof_listed(plan, lane, seen, &mut summary, out);
    lit(
        out,
        "Nothing has been executed for you: stay inside your scope and do not set up runtime machinery of your own.",
    );
}
