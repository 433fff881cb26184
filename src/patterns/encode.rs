//! The selection and execution-plan replies (most calls ask for one of them) written straight
//! into the reply buffer: the bytes `json_out` writes for [`super::render::Rendered`], without
//! building each lane's prompts, task texts and renderer structs first. Fixed text is written
//! pre-escaped; only request text and policy names go through the escaper. The other forms,
//! and the `Value` path, keep the serde renderers; `patterns_properties` holds the two equal.

use std::borrow::Cow;

use crate::json_out::{self, Error, escape_into, string_into};

use super::lanes::Lane;
use super::plan::{Plan, PlanOutcome};
use super::render::{OutputKind, execution_plan_notes, graph_tasks, role_proof_extra};
use super::runtime::{BOUNDED_SCOPE, Mechanism, overlays_summary};

/// Writes the wrapper for `output` if it is one this module encodes; `None` otherwise.
pub fn write(
    outcome: &PlanOutcome<'_>,
    output: OutputKind,
    out: &mut Vec<u8>,
) -> Option<Result<(), Error>> {
    if !matches!(output, OutputKind::Select | OutputKind::ExecutionPlan) {
        return None;
    }
    Some(wrapper(outcome, output, out))
}

fn wrapper(outcome: &PlanOutcome<'_>, output: OutputKind, out: &mut Vec<u8>) -> Result<(), Error> {
    let plan = &outcome.plan;
    lit(out, "{\"dry_run\":true,\"kind\":");
    string_into(out, output.kind());
    lit(out, ",\"plan\":");
    plan_object(plan, out)?;
    if output == OutputKind::ExecutionPlan {
        lit(out, ",\"execution_plan\":");
        execution_plan(plan, out)?;
    }
    if !outcome.diagnostics.is_empty() {
        lit(out, ",\"diagnostics\":");
        json_out::write(out, &outcome.diagnostics)?;
    }
    out.push(b'}');
    Ok(())
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

fn count(out: &mut Vec<u8>, n: u64) {
    lit(out, itoa::Buffer::new().format(n));
}

// ----- the plan ------------------------------------------------------------------------------

fn plan_object(plan: &Plan<'_>, out: &mut Vec<u8>) -> Result<(), Error> {
    lit(out, "{\"request\":");
    json_out::write(out, plan.request)?;
    lit(out, ",\"selection\":");
    json_out::write(out, &plan.selection)?;
    lit(out, ",\"lanes\":[");
    for (i, lane) in plan.lanes.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        plan_lane(lane, out);
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
    Ok(())
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
        lit(out, "- Role: ");
        lit(out, lane.role.as_str());
        lit(out, "\\n  Scope: ");
        scope_summary(plan, lane, out);
        lit(out, "\\n  Purpose: ");
        escape_into(out, &lane.purpose);
        lit(out, "\\n  Edits: only files that ");
        scope_summary(plan, lane, out);
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
    string_list(out, &lane.fallback_profiles);
    lit(out, ",\"toolsets\":");
    lit(out, lane.toolsets.json());
}

/// A [`Lane`] as the plan lists it.
fn plan_lane(lane: &Lane, out: &mut Vec<u8>) {
    lane_head(lane, out);
    lit(out, ",\"runtime_hint\":");
    string_into(out, &lane.runtime_hint);
    lane_profile(lane, out);
    lit(out, ",\"model_policy\":{\"disable_reasoning\":");
    lit(
        out,
        if lane.model_policy.disable_reasoning {
            "true}}"
        } else {
            "false}}"
        },
    );
}

// ----- the execution plan --------------------------------------------------------------------

fn execution_plan(plan: &Plan<'_>, out: &mut Vec<u8>) -> Result<(), Error> {
    let mechanism = plan.runtime_mapping.primary_mechanism;
    lit(out, "{\"mechanism\":\"");
    lit(out, mechanism.as_str());
    lit(out, "\",\"lanes\":[");
    for (i, lane) in plan.lanes.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        lane_head(lane, out);
        lane_profile(lane, out);
        lit(out, ",\"runtime_hint\":");
        string_into(out, &lane.runtime_hint);
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
        json_out::write(out, &graph_tasks(plan))?;
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

/// A lane's scope for prompts (escaped): its own scopes, else the request's, else the
/// bounded-scope phrase.
fn scope_summary(plan: &Plan<'_>, lane: &Lane, out: &mut Vec<u8>) {
    if !lane.scope.is_empty() {
        joined(out, &lane.scope);
    } else if !plan.request.scopes.is_empty() {
        joined(out, &plan.request.scopes);
    } else {
        escape_into(out, BOUNDED_SCOPE);
    }
}

fn allowed_edits(plan: &Plan<'_>, lane: &Lane, out: &mut Vec<u8>) {
    if !lane.scope.is_empty() {
        lit(out, "Edit only the files that the lane scope (");
        joined(out, &lane.scope);
        lit(out, ") requires.");
    } else if !plan.request.scopes.is_empty() {
        lit(out, "Edit only the files that the request scopes (");
        joined(out, &plan.request.scopes);
        lit(out, ") require.");
    } else {
        lit(out, "Edit only the files the objective directly requires.");
    }
}

/// One line of a lane's proof expectations.
enum ProofLine<'a> {
    Text(&'a Cow<'static, str>),
    Extra(&'static str),
    /// "The summary names the scopes touched: <scope summary>."
    ScopesTouched,
}

/// The lane's proof lines: the plan's, with its last line (every request scope) naming the
/// lane's scope instead, then the role's own line.
fn lane_proof<'a>(plan: &'a Plan<'_>, lane: &Lane) -> impl Iterator<Item = ProofLine<'a>> {
    let scoped = !plan.request.scopes.is_empty();
    let all = &plan.proof_expectations[..];
    let shared = if scoped {
        &all[..all.len().saturating_sub(1)]
    } else {
        all
    };
    let extra = role_proof_extra(lane.role).filter(|e| !shared.iter().any(|p| p == e));
    shared
        .iter()
        .map(ProofLine::Text)
        .chain(scoped.then_some(ProofLine::ScopesTouched))
        .chain(extra.map(ProofLine::Extra))
}

fn proof_line(plan: &Plan<'_>, lane: &Lane, line: &ProofLine<'_>, out: &mut Vec<u8>) {
    match line {
        ProofLine::Text(text) => escape_into(out, text),
        ProofLine::Extra(text) => escape_into(out, text),
        ProofLine::ScopesTouched => {
            lit(out, "The summary names the scopes touched: ");
            scope_summary(plan, lane, out);
            out.push(b'.');
        }
    }
}

fn ephemeral_tasks(plan: &Plan<'_>, out: &mut Vec<u8>) {
    out.push(b'[');
    for (i, lane) in plan.lanes.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        lit(out, "{\"goal\":\"Take the ");
        lit(out, lane.role.as_str());
        lit(out, " lane of a ");
        lit(out, plan.selection.selected_pattern.as_str());
        lit(out, " plan for: ");
        escape_into(out, &plan.request.objective);
        lit(out, ". Hand back ");
        escape_into(out, lane.role.expected_output());
        lit(out, ".\",\"context\":\"Scope: ");
        scope_summary(plan, lane, out);
        lit(out, "; ");
        allowed_edits(plan, lane, out);
        lit(out, "; Purpose: ");
        escape_into(out, &lane.purpose);
        lit(out, "; Proof: ");
        for (j, line) in lane_proof(plan, lane).enumerate() {
            if j > 0 {
                lit(out, "; ");
            }
            proof_line(plan, lane, &line, out);
        }
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
        string_list(out, &lane.fallback_profiles);
        out.push(b'}');
    }
    out.push(b']');
}

fn persistent_workers(plan: &Plan<'_>, out: &mut Vec<u8>) {
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
        string_list(out, &lane.fallback_profiles);
        lit(out, ",\"toolsets\":");
        lit(out, lane.toolsets.json());
        lit(out, ",\"prompt\":\"");
        lane_prompt(plan, lane, out);
        lit(
            out,
            "\",\"adapter_command\":null,\"adapter_hint\":\"Map this logical profile onto a worker of your runtime before anything executes.\"}",
        );
    }
    out.push(b']');
}

/// A lane's prompt, escaped (the text of [`super::render`]'s `lane_prompt`).
fn lane_prompt(plan: &Plan<'_>, lane: &Lane, out: &mut Vec<u8>) {
    lit(out, "Role: ");
    lit(out, lane.role.as_str());
    lit(out, " lane\\nObjective: ");
    escape_into(out, &plan.request.objective);
    lit(out, "\\nWorker pattern: ");
    lit(out, plan.selection.selected_pattern.as_str());
    lit(out, "\\nPurpose: ");
    escape_into(out, &lane.purpose);
    lit(out, "\\nScope: ");
    scope_summary(plan, lane, out);
    lit(out, "\\nAllowed edits: ");
    allowed_edits(plan, lane, out);
    lit(out, "\\nHand back: ");
    escape_into(out, lane.role.expected_output());
    lit(out, "\\nProof expected:\\n");
    for line in lane_proof(plan, lane) {
        lit(out, "- ");
        proof_line(plan, lane, &line, out);
        lit(out, "\\n");
    }
    lit(
        out,
        "Nothing has been executed for you: stay inside your scope and do not set up runtime machinery of your own.",
    );
}
