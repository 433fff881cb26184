//! From a launch request to the pinned launch plan: the selector runs again on the request, its
//! lanes are mapped onto profiles of a pinned bundle, and everything that will run (argv,
//! declarations, prompts, dependencies) is written out, so the operator's approval and the
//! trusted policy decide on exactly that. The selected pattern and its overlays are never
//! changed; a mechanism or lane gaffer cannot honour is refused.

use std::collections::{BTreeMap, BTreeSet};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::bundles::{self, Bundle, BundleRef, Declaration, Profile};
use crate::patterns::render::{lane_contract, prompt_contract_text, task_graph_spec};
use crate::patterns::runtime::Mechanism;
use crate::patterns::{self, Plan, SelectContext};

/// What `plan.launch` is asked to run: the selection request and how its lanes map onto a
/// pinned bundle. The plan's id is its operation's (see [`plan_id`]), never the caller's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LaunchTarget {
    /// The selection request, in the vocabulary `patterns/select` takes.
    #[schemars(with = "serde_json::Map<String, Value>")]
    pub request: Value,
    pub config_bundle: BundleRef,
    /// Lane role → bundle profile name (selector value).
    #[serde(default)]
    pub lane_profiles: BTreeMap<String, String>,
    /// The mechanism to run under (the plan's primary when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mechanism: Option<String>,
}

/// One lane as it will run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LaneSpec {
    /// `lane-N-role`, as the task graph names it.
    pub lane_id: String,
    pub role: String,
    pub scope: Vec<String>,
    #[schemars(with = "Value")]
    pub profile: Profile,
    pub argv: Vec<String>,
    /// Lanes that must succeed before this one starts.
    #[serde(default)]
    pub depends_on: Vec<String>,
    /// The lane's prompt contract, its initial input.
    pub prompt: String,
    /// Proof expectations; each becomes a checklist item `e1`, `e2`, …
    pub expectations: Vec<String>,
}

/// The pinned launch plan (a `plan.launch` operation's preconditions).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LaunchSpec {
    pub plan_id: String,
    /// sha256 of the selector's plan (RFC 8785), the digest `plan_digest` launches refer to.
    pub selection_digest: String,
    pub objective: String,
    pub pattern: String,
    pub overlays: Vec<String>,
    pub mechanism: String,
    /// Most lane workers running at once.
    pub max_parallel: u32,
    pub config_bundle: BundleRef,
    /// The bundle's declarations: every lane worker runs under them.
    #[schemars(with = "Vec<Value>")]
    pub declarations: Vec<Declaration>,
    pub secrets: Vec<String>,
    pub lanes: Vec<LaneSpec>,
}

/// A launch gaffer refuses, with a stable code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct LaunchError {
    pub code: &'static str,
    pub field: Option<String>,
    pub message: String,
}

pub mod codes {
    pub const MECHANISM_UNSUPPORTED: &str = "mechanism_unsupported";
    pub const MECHANISM_NOT_LISTED: &str = "mechanism_not_listed";
    pub const LANE_UNMAPPED: &str = "lane_unmapped";
    pub const BUNDLE_UNUSABLE: &str = "bundle_unusable";
    pub const REQUEST_INVALID: &str = "invalid_params";
    pub const PLAN_CHANGED: &str = "plan_changed";
}

fn refuse(code: &'static str, field: Option<&str>, message: impl Into<String>) -> LaunchError {
    LaunchError {
        code,
        field: field.map(str::to_string),
        message: message.into(),
    }
}

/// Derives the launch plan afresh: selection, mechanism, lane mapping, the pinned bundle.
pub fn derive(
    ws: &crate::workspace::Workspace,
    t: &LaunchTarget,
    plan_id: &str,
) -> Result<LaunchSpec, LaunchError> {
    let root = ws.root();
    let parsed = patterns::parse_params(&t.request).map_err(|e| {
        refuse(
            codes::REQUEST_INVALID,
            Some(&format!("request.{}", e.field)),
            e.message,
        )
    })?;
    let policy = patterns::Policy::load(root, None).map_err(|e| {
        refuse(
            codes::REQUEST_INVALID,
            None,
            format!(
                "the selection policy is invalid at `{}`: {}",
                e.key, e.message
            ),
        )
    })?;
    let ctx = SelectContext::for_workspace(root, policy);
    let outcome = patterns::build_plan(&parsed.request, None, &ctx).map_err(|e| {
        refuse(
            codes::REQUEST_INVALID,
            Some(&format!("request.{}", e.field)),
            e.message,
        )
    })?;
    let plan = &outcome.plan;
    let plan_value = serde_json::to_value(plan)
        .map_err(|e| refuse(codes::REQUEST_INVALID, None, e.to_string()))?;
    let selection_digest = crate::util::sha256_hex(&crate::jcs::canonicalize(&plan_value));
    let mechanism = choose_mechanism(plan, t.mechanism.as_deref())?;
    let bundle = bundles::load_pinned(ws, &t.config_bundle)
        .map_err(|e| refuse(codes::BUNDLE_UNUSABLE, Some("config_bundle"), e.to_string()))?;
    let lanes = map_lanes(plan, mechanism, &bundle, &t.lane_profiles)?;
    let max_parallel = match mechanism {
        Mechanism::EphemeralWorkers => plan
            .module_swarm_scale
            .as_ref()
            .map(|s| s.max_active_lanes)
            .unwrap_or(parsed.request.max_parallel_lanes.max(1) as u64)
            .clamp(1, 64) as u32,
        Mechanism::Direct | Mechanism::Continuation => 1,
        Mechanism::PersistentWorkers | Mechanism::TaskGraph => lanes.len().max(1) as u32,
    };
    Ok(LaunchSpec {
        plan_id: plan_id.to_string(),
        selection_digest,
        objective: parsed.request.objective.clone(),
        pattern: plan.selection.selected_pattern.as_str().to_string(),
        overlays: plan
            .selection
            .overlays
            .iter()
            .map(|o| o.as_str().to_string())
            .collect(),
        mechanism: mechanism.as_str().to_string(),
        max_parallel,
        config_bundle: t.config_bundle.clone(),
        secrets: crate::secrets::names(&bundle.declarations),
        declarations: bundle.declarations.clone(),
        lanes,
    })
}

/// The plan's primary mechanism, or a fallback the caller named and the plan lists.
fn choose_mechanism(plan: &Plan<'_>, asked: Option<&str>) -> Result<Mechanism, LaunchError> {
    let primary = plan.runtime_mapping.primary_mechanism;
    let Some(name) = asked else {
        return Ok(primary);
    };
    let m = Mechanism::parse(name).ok_or_else(|| {
        refuse(
            codes::MECHANISM_UNSUPPORTED,
            Some("mechanism"),
            format!(
                "gaffer cannot run mechanism {name:?}; it runs direct, continuation, \
                 ephemeral_workers, persistent_workers and task_graph"
            ),
        )
    })?;
    if m == primary || plan.runtime_mapping.fallback_mechanisms.contains(&m) {
        return Ok(m);
    }
    let listed: Vec<&str> = std::iter::once(primary)
        .chain(plan.runtime_mapping.fallback_mechanisms.iter().copied())
        .map(Mechanism::as_str)
        .collect();
    Err(refuse(
        codes::MECHANISM_NOT_LISTED,
        Some("mechanism"),
        format!(
            "the plan does not list {} as a mechanism (it lists {}); the selected shape is \
             never changed",
            m.as_str(),
            listed.join(", ")
        ),
    ))
}

/// The profile a role runs on: the caller's mapping, else (for persistent workers) the
/// roster's named profile; a role without one is refused, never guessed.
fn profile_for<'b>(
    role: &str,
    roster_name: &str,
    mechanism: Mechanism,
    bundle: &'b Bundle,
    mapping: &BTreeMap<String, String>,
) -> Result<&'b Profile, LaunchError> {
    let name = match mapping.get(role) {
        Some(n) => n.as_str(),
        None if mechanism == Mechanism::PersistentWorkers => roster_name,
        None => {
            return Err(refuse(
                codes::LANE_UNMAPPED,
                Some(&format!("lane_profiles.{role}")),
                format!("no profile is mapped for the {role} lane; name one in lane_profiles"),
            ));
        }
    };
    bundle
        .profiles
        .iter()
        .find(|p| p.selector.value() == name && !p.command.is_empty())
        .ok_or_else(|| {
            refuse(
                codes::LANE_UNMAPPED,
                Some(&format!("lane_profiles.{role}")),
                format!(
                    "the {role} lane maps to profile {name:?}, which the bundle {} has not (or \
                     has without a command)",
                    bundle.metadata.id
                ),
            )
        })
}

/// Most lanes one plan runs.
pub const MAX_LANES: usize = 32;

/// A lane's scope entries are workspace paths (a directory or file and what lies beneath);
/// they feed `lane_scope` rules, so no glob, no `..`, no absolute path and never `.gaffer`.
fn check_scopes(plan: &Plan<'_>) -> Result<(), LaunchError> {
    for scope in plan.lanes.iter().flat_map(|l| &l.scope) {
        let bad = |why: String| refuse(codes::REQUEST_INVALID, Some("request.scopes"), why);
        if scope.contains(['*', '?', '[', ']', '{', '}']) {
            return Err(bad(format!(
                "scope {scope:?}: a lane scope names a path, not a pattern"
            )));
        }
        crate::operations::adapters::paths::normalize_relative("scopes", scope)
            .map_err(|e| bad(format!("scope {scope:?}: {}", e.message)))?;
    }
    if plan.lanes.len() > MAX_LANES {
        return Err(refuse(
            codes::REQUEST_INVALID,
            Some("request"),
            format!(
                "the plan has {} lanes; gaffer runs at most {MAX_LANES}",
                plan.lanes.len()
            ),
        ));
    }
    Ok(())
}

fn map_lanes(
    plan: &Plan<'_>,
    mechanism: Mechanism,
    bundle: &Bundle,
    mapping: &BTreeMap<String, String>,
) -> Result<Vec<LaneSpec>, LaunchError> {
    check_scopes(plan)?;
    let first = plan.lanes.first().ok_or_else(|| {
        refuse(
            codes::LANE_UNMAPPED,
            Some("request"),
            "the plan has no lanes",
        )
    })?;
    if mechanism == Mechanism::Direct {
        // One lane worker carries the whole contract and every proof expectation.
        let role = first.role.as_str();
        let profile = profile_for(role, &first.selected_profile, mechanism, bundle, mapping)?;
        let scope: BTreeSet<&String> = plan.lanes.iter().flat_map(|l| &l.scope).collect();
        return Ok(vec![LaneSpec {
            lane_id: format!("lane-1-{role}"),
            role: role.to_string(),
            scope: scope.into_iter().cloned().collect(),
            argv: profile.command.clone(),
            profile: profile.clone(),
            depends_on: Vec::new(),
            prompt: prompt_contract_text(plan),
            expectations: plan
                .proof_expectations
                .iter()
                .map(|p| p.to_string())
                .collect(),
        }]);
    }
    let graph = task_graph_spec(plan);
    let mut out = Vec::with_capacity(plan.lanes.len());
    for (i, (lane, task)) in plan.lanes.iter().zip(&graph.tasks).enumerate() {
        let role = lane.role.as_str();
        let profile = profile_for(role, &lane.selected_profile, mechanism, bundle, mapping)?;
        let contract = lane_contract(plan, lane);
        let depends_on = match mechanism {
            Mechanism::TaskGraph => task.depends_on.clone(),
            Mechanism::Continuation => out
                .last()
                .map(|l: &LaneSpec| vec![l.lane_id.clone()])
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        out.push(LaneSpec {
            lane_id: format!("lane-{}-{role}", i + 1),
            role: role.to_string(),
            scope: lane.scope.clone(),
            argv: profile.command.clone(),
            profile: profile.clone(),
            depends_on,
            prompt: contract.prompt,
            expectations: contract.proof,
        });
    }
    Ok(out)
}

/// A plan's id: its `plan.launch` operation's, so no caller can name (and take over) another
/// plan, and replays of one launch land on the same plan.
pub fn plan_id(operation_id: &str) -> String {
    format!("pl_{}", operation_id.trim_start_matches("op_"))
}
