//! Runtime mapping: which execution mechanism suits the plan, what to fall back to, a hint for
//! the adapter, and the compact prompt contract handed to workers.

use serde::{Serialize, Serializer};

use super::lanes::Lane;
use super::request::PatternRequest;
use super::vocab::Pattern;

/// The runtime-neutral execution mechanisms. Deprecated names parse but are never emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mechanism {
    Direct,
    Continuation,
    EphemeralWorkers,
    PersistentWorkers,
    TaskGraph,
}

impl Mechanism {
    pub const fn as_str(self) -> &'static str {
        match self {
            Mechanism::Direct => "direct",
            Mechanism::Continuation => "continuation",
            Mechanism::EphemeralWorkers => "ephemeral_workers",
            Mechanism::PersistentWorkers => "persistent_workers",
            Mechanism::TaskGraph => "task_graph",
        }
    }

    /// Current names, plus the deprecated `goal`, `delegate_task`, `swarm_profiles`, `kanban`.
    pub fn parse(value: &str) -> Option<Mechanism> {
        Some(match value {
            "direct" => Mechanism::Direct,
            "continuation" | "goal" => Mechanism::Continuation,
            "ephemeral_workers" | "delegate_task" => Mechanism::EphemeralWorkers,
            "persistent_workers" | "swarm_profiles" => Mechanism::PersistentWorkers,
            "task_graph" | "kanban" => Mechanism::TaskGraph,
            _ => return None,
        })
    }
}

impl Serialize for Mechanism {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// The `runtime_mapping` object of a plan, but for its `prompt_contract` text, which is
/// written when the plan is (see [`prompt_contract`]): a reply writes it straight into its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeMapping {
    pub primary_mechanism: Mechanism,
    pub fallback_mechanisms: Vec<Mechanism>,
    pub invocation_hint: &'static str,
}

/// Phrase used when neither the lane nor the request names a scope.
pub const BOUNDED_SCOPE: &str = "the objective's own bounded scope";

/// A lane's scope for prompts: its own scopes, else the request's, else [`BOUNDED_SCOPE`].
pub fn scope_summary(lane: &Lane, req: &PatternRequest) -> String {
    if !lane.scope.is_empty() {
        lane.scope.join(", ")
    } else if !req.scopes.is_empty() {
        req.scopes.join(", ")
    } else {
        BOUNDED_SCOPE.to_owned()
    }
}

/// Pick the mechanism (first matching rule wins) and write the prompt contract.
pub fn map_runtime(req: &PatternRequest, pattern: Pattern, lanes: &[Lane]) -> RuntimeMapping {
    use Mechanism::*;
    let lane_count: u64 = lanes.iter().map(|l| l.count.max(1)).sum();
    let (primary, fallbacks, hint): (Mechanism, &[Mechanism], &str) = if req.durable
        || req.dependencies.len() > 2
    {
        (
            TaskGraph,
            &[Continuation, PersistentWorkers, EphemeralWorkers],
            "Track dependencies and waves in a dry-run task graph, and map lanes onto a runtime only after review.",
        )
    } else if req.persistent_workers {
        (
            PersistentWorkers,
            &[EphemeralWorkers, Continuation],
            "Hand role- or tool-specific lanes to named workers, then integrate their results in the parent.",
        )
    } else if matches!(pattern, Pattern::ModuleSwarm | Pattern::BlueprintFanout) || lane_count > 2 {
        (
            EphemeralWorkers,
            &[PersistentWorkers, Continuation],
            "Run the bounded parallel subtasks as ephemeral workers, each carrying its own scope and role.",
        )
    } else if pattern == Pattern::PhasedAssembly {
        (
            Continuation,
            &[TaskGraph, EphemeralWorkers],
            "Run waves that span several turns as a managed continuation; move to a task graph if they need durable tracking.",
        )
    } else if matches!(pattern, Pattern::RecoveryLane | Pattern::BridgeLane) {
        (
            Direct,
            &[Continuation, PersistentWorkers],
            "Work in one narrow recovery lane, with no parallel edits until the failure is understood.",
        )
    } else {
        (
            Direct,
            &[Continuation, EphemeralWorkers],
            "Handle it directly in the current turn unless it needs several turns.",
        )
    };
    RuntimeMapping {
        primary_mechanism: primary,
        fallback_mechanisms: fallbacks.to_vec(),
        invocation_hint: hint,
    }
}

/// Overlays for display: comma-joined, or `none`.
pub fn overlays_summary(overlays: &[Pattern]) -> String {
    if overlays.is_empty() {
        "none".to_owned()
    } else {
        overlays
            .iter()
            .map(|p| p.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The compact contract handed to workers: `runtime_mapping.prompt_contract`.
pub fn prompt_contract(
    req: &PatternRequest,
    pattern: Pattern,
    overlays: &[Pattern],
    primary: Mechanism,
    hint: &str,
    lanes: &[Lane],
) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(512 + lanes.len() * 200);
    // Writing into a String cannot fail.
    let _ = writeln!(out, "Objective: {}", req.objective);
    let _ = writeln!(out, "Worker pattern: {}", pattern.as_str());
    let _ = writeln!(out, "Mechanism: {}", primary.as_str());
    let _ = writeln!(out, "Overlays: {}", overlays_summary(overlays));
    let _ = writeln!(out, "Runtime hint: {hint}");
    out.push_str("Lanes:\n");
    for lane in lanes {
        let scope = scope_summary(lane, req);
        let _ = writeln!(out, "- Role: {}", lane.role.as_str());
        let _ = writeln!(out, "  Scope: {scope}");
        let _ = writeln!(out, "  Purpose: {}", lane.purpose);
        let _ = writeln!(out, "  Edits: only files that {scope} needs");
        out.push_str("  Report: what changed, the evidence, and any risk left open\n");
    }
    out.push_str("Dry run: start no workers and change no runtime settings.");
    out
}
