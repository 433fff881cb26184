//! Lanes: the logical workers a pattern needs, each with a profile chosen by the role policy and
//! the escalation rules, plus the module-swarm scale (how many lanes run at once, in how many
//! waves).

use std::borrow::Cow;
use std::sync::Arc;

use serde::Serialize;

use super::policy::{Escalated, LaneProfile, ModelPolicyView, Policy, SharedList};
use super::request::PatternRequest;
use super::signals::{Dimensions, TextSignals};
use super::vocab::{Dimension, LaneRole, Pattern};

/// One logical lane of the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Lane {
    pub role: LaneRole,
    pub count: u64,
    pub scope: Vec<String>,
    pub purpose: Cow<'static, str>,
    pub runtime_hint: Cow<'static, str>,
    pub selected_profile: Arc<str>,
    pub fallback_profiles: SharedList,
    pub toolsets: SharedList,
    pub model_policy: LaneModelPolicy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LaneModelPolicy {
    pub disable_reasoning: bool,
}

impl From<ModelPolicyView> for LaneModelPolicy {
    fn from(v: ModelPolicyView) -> Self {
        Self {
            disable_reasoning: v.disable_reasoning,
        }
    }
}

/// How a module swarm fills its profile pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolStrategy {
    /// Scopes are declared disjoint and the work is low-risk: use the full parallel width.
    LowCostDisjoint,
    /// Anything else: at most four lanes at once.
    LowCostConservative,
}

impl PoolStrategy {
    pub const fn as_str(self) -> &'static str {
        match self {
            PoolStrategy::LowCostDisjoint => "low_cost_disjoint",
            PoolStrategy::LowCostConservative => "low_cost_conservative",
        }
    }
}

/// The `module_swarm_scale` object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SwarmScale {
    pub requested_lane_count: u64,
    pub max_active_lanes: u64,
    pub waves_required: u64,
    pub wave_size: u64,
    pub profile_pool_strategy: PoolStrategy,
    pub integrator_per_wave: bool,
}

/// Width cap of a conservative swarm.
const CONSERVATIVE_WIDTH: u64 = 4;

impl SwarmScale {
    pub fn recommend(
        lane_requests: usize,
        req: &PatternRequest,
        text: &TextSignals,
        dims: &Dimensions,
        policy: &Policy,
    ) -> SwarmScale {
        let requested = (lane_requests as u64).max(1);
        let parallel = u64::try_from(req.max_parallel_lanes).unwrap_or(1).max(1);
        let risk = req.risk();
        let disjoint = text.any(&policy.signals.swarm_disjoint)
            && dims.get(Dimension::MergeRisk) <= 1
            && (risk == "low" || risk == "normal");
        let (strategy, active) = if disjoint {
            (PoolStrategy::LowCostDisjoint, requested.min(parallel))
        } else {
            (
                PoolStrategy::LowCostConservative,
                requested.min(parallel).min(CONSERVATIVE_WIDTH),
            )
        };
        let waves = requested.div_ceil(active);
        SwarmScale {
            requested_lane_count: requested,
            max_active_lanes: active,
            waves_required: waves,
            wave_size: active,
            profile_pool_strategy: strategy,
            integrator_per_wave: waves > 1 && strategy == PoolStrategy::LowCostConservative,
        }
    }
}

/// Escalation inputs of one lane.
#[derive(Debug, Clone, Copy, Default)]
struct Flags {
    module_swarm: bool,
    premium: bool,
    code_heavy: bool,
}

impl Flags {
    /// The escalation these flags call for (module swarm beats premium beats code-heavy).
    fn escalation(self) -> Escalated {
        if self.module_swarm {
            Escalated::ModuleSwarm
        } else if self.premium {
            Escalated::Premium
        } else if self.code_heavy {
            Escalated::CodeHeavy
        } else {
            Escalated::No
        }
    }
}

/// A lane's profile, as the compiled policy resolved it for the role and the escalation.
fn resolve_profile(role: LaneRole, flags: Flags, policy: &Policy) -> LaneProfile {
    policy.lane_profile(role, flags.escalation()).clone()
}

fn lane(
    role: LaneRole,
    count: u64,
    scope: Vec<String>,
    purpose: impl Into<Cow<'static, str>>,
    runtime_hint: impl Into<Cow<'static, str>>,
    flags: Flags,
    policy: &Policy,
) -> Lane {
    let profile = resolve_profile(role, flags, policy);
    lane_with(role, count, scope, purpose, runtime_hint, profile)
}

fn lane_with(
    role: LaneRole,
    count: u64,
    scope: Vec<String>,
    purpose: impl Into<Cow<'static, str>>,
    runtime_hint: impl Into<Cow<'static, str>>,
    profile: LaneProfile,
) -> Lane {
    Lane {
        role,
        count,
        scope,
        purpose: purpose.into(),
        runtime_hint: runtime_hint.into(),
        selected_profile: profile.selected,
        fallback_profiles: profile.fallbacks,
        toolsets: profile.toolsets,
        model_policy: LaneModelPolicy {
            disable_reasoning: profile.disable_reasoning,
        },
    }
}

/// "Build <scope> as one parallel lane; …", without the formatting machinery (one per scope).
fn builder_purpose(scope: &str) -> String {
    const TAIL: &str = " as one parallel lane; lanes start in safe waves, not all at once.";
    let mut s = String::with_capacity(6 + scope.len() + TAIL.len());
    s.push_str("Build ");
    s.push_str(scope);
    s.push_str(TAIL);
    s
}

/// Build the lanes of `pattern` (plus the reviewer when the overlay is on).
pub fn build_lanes(
    req: &PatternRequest,
    pattern: Pattern,
    overlays: &[Pattern],
    text: &TextSignals,
    dims: &Dimensions,
    policy: &Policy,
) -> (Vec<Lane>, Option<SwarmScale>) {
    let premium = req.risk() == "critical";
    let code_heavy = match pattern {
        Pattern::Sequential | Pattern::PhasedAssembly => {
            text.any(&policy.signals.code_mention) || req.scopes.iter().any(|s| s == "code")
        }
        _ => text.any(&policy.signals.code_heavy),
    };
    let escalated = Flags {
        module_swarm: false,
        premium,
        code_heavy,
    };
    let swarm = Flags {
        module_swarm: true,
        ..Flags::default()
    };

    let mut lanes = Vec::new();
    let mut scale = None;
    match pattern {
        Pattern::ModuleSwarm => {
            scale = Some(swarm_lanes(req, text, dims, policy, swarm, &mut lanes));
        }
        Pattern::BlueprintFanout => fanout_lanes(req, policy, escalated, &mut lanes),
        Pattern::PhasedAssembly => phase_lanes(req, policy, escalated, &mut lanes),
        Pattern::RecoveryLane | Pattern::BridgeLane => {
            lanes.push(lane(
                LaneRole::RecoveryWorker,
                1,
                req.scopes.clone(),
                "Repair or resume the failed work, and nothing beyond it.",
                "One strong worker or profile, with no parallel edits.",
                escalated,
                policy,
            ));
        }
        Pattern::Sequential | Pattern::TwinInspection => {
            lanes.push(lane(
                LaneRole::Builder,
                1,
                req.scopes.clone(),
                "Implement the change as the single build lane, within its scope.",
                "One turn in the current runtime, or a managed continuation if it spans turns.",
                escalated,
                policy,
            ));
        }
    }

    if overlays.contains(&Pattern::TwinInspection) {
        let flags = if pattern == Pattern::ModuleSwarm {
            swarm
        } else {
            escalated
        };
        lanes.push(lane(
            LaneRole::Reviewer,
            1,
            req.scopes.clone(),
            "Review the work independently and verify its tests and evidence.",
            "An ephemeral reviewer, or an independent review worker.",
            flags,
            policy,
        ));
    }
    (lanes, scale)
}

/// A module swarm: one builder lane per scope (or default workstream), then the integrator,
/// in waves sized by the swarm's scale (returned).
fn swarm_lanes(
    req: &PatternRequest,
    text: &TextSignals,
    dims: &Dimensions,
    policy: &Policy,
    swarm: Flags,
    lanes: &mut Vec<Lane>,
) -> SwarmScale {
    let scopes: &[String] = if req.scopes.is_empty() {
        &policy.default_workstreams
    } else {
        &req.scopes
    };
    let s = SwarmScale::recommend(scopes.len(), req, text, dims, policy);
    lanes.reserve(scopes.len() + 2);
    let hint = format!(
        "Run in waves of at most {} active lanes, drawing on the {} profile pool.",
        s.max_active_lanes,
        s.profile_pool_strategy.as_str()
    );
    // Every builder lane has the same profile: resolved once.
    let builder = resolve_profile(LaneRole::Builder, swarm, policy);
    for scope in scopes {
        lanes.push(lane_with(
            LaneRole::Builder,
            1,
            vec![scope.clone()],
            builder_purpose(scope),
            hint.clone(),
            builder.clone(),
        ));
    }
    let (count, purpose) = if s.integrator_per_wave {
        (
            s.waves_required,
            "Merge and check the builder outputs at the end of every wave.",
        )
    } else {
        (
            1,
            "Merge and check the builder outputs once all waves are done.",
        )
    };
    lanes.push(lane(
        LaneRole::Integrator,
        count,
        scopes.to_vec(),
        purpose,
        "A lane in the calling runtime, or a managed continuation.",
        swarm,
        policy,
    ));
    s
}

/// A blueprint fan-out: variant designers (as many as asked, at least two, but never more
/// than the lane budget, and never none), then the curator.
fn fanout_lanes(req: &PatternRequest, policy: &Policy, flags: Flags, lanes: &mut Vec<Lane>) {
    let wanted = if req.variants_requested == 0 {
        2
    } else {
        req.variants_requested.max(2)
    };
    let n = wanted.min(req.max_parallel_lanes).max(1);
    for i in 1..=n {
        lanes.push(lane(
            LaneRole::VariantDesigner,
            1,
            Vec::new(),
            format!("Design variant {i} as an independent alternative to the others."),
            "One worker in a batch of ephemeral workers.",
            flags,
            policy,
        ));
    }
    lanes.push(lane(
        LaneRole::Curator,
        1,
        Vec::new(),
        "Compare the variants, then pick one or merge their strongest parts.",
        "A lane in the calling runtime once every variant is in.",
        flags,
        policy,
    ));
}

/// A phased assembly: one phase worker per dependency (or default phase).
fn phase_lanes(req: &PatternRequest, policy: &Policy, flags: Flags, lanes: &mut Vec<Lane>) {
    let deps: &[String] = if req.dependencies.is_empty() {
        &policy.default_phases
    } else {
        &req.dependencies
    };
    for dep in deps {
        lanes.push(lane(
            LaneRole::PhaseWorker,
            1,
            vec![dep.clone()],
            format!("Finish the {dep} step of its wave and hand off to the work it unlocks."),
            "A child task in a task graph, or one step of a managed continuation.",
            flags,
            policy,
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn premium_puts_the_escalation_profile_first_then_dedups() {
        let p = Policy::builtin();
        let flags = Flags {
            premium: true,
            ..Flags::default()
        };
        let prof = resolve_profile(LaneRole::Reviewer, flags, &p);
        assert_eq!(&*prof.selected, "worker-general-premium");
        assert_eq!(&prof.fallbacks[..], ["default"]);
        let prof = resolve_profile(LaneRole::RecoveryWorker, Flags::default(), &p);
        assert_eq!(&*prof.selected, "default");
        assert!(prof.toolsets.is_empty() && prof.fallbacks.is_empty());
    }

    #[test]
    fn scale_examples_from_the_spec() {
        let p = Policy::builtin();
        let mut req = PatternRequest::new("x disjoint");
        req.max_parallel_lanes = 8;
        let text = TextSignals::analyze(&req, &[], &p);
        let dims = Dimensions::default();
        let s = SwarmScale::recommend(32, &req, &text, &dims, &p);
        assert_eq!(
            (s.max_active_lanes, s.waves_required, s.integrator_per_wave),
            (8, 4, false)
        );
        req.risk_level = "high".into();
        let s = SwarmScale::recommend(32, &req, &text, &dims, &p);
        assert_eq!(
            (s.max_active_lanes, s.waves_required, s.integrator_per_wave),
            (4, 8, true)
        );
        req.max_parallel_lanes = 4;
        let s = SwarmScale::recommend(50, &req, &text, &dims, &p);
        assert_eq!((s.max_active_lanes, s.waves_required), (4, 13));
    }
}
