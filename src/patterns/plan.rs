//! Assembles a [`Plan`] from a request: signals → dimensions → decision → lanes → notes →
//! roster mapping → runtime mapping.

use std::borrow::Cow;

use serde::Serialize;
use serde::ser::{SerializeStruct, Serializer};
use serde_json::value::RawValue;

use super::lanes::{Lane, SwarmScale, build_lanes};
use super::notes::{proof_expectations, safety_notes};
use super::request::PatternRequest;
use super::roster::{self, RosterLoad, RosterOrigin};
use super::runtime::{Mechanism, RuntimeMapping, map_runtime, prompt_contract};
use super::select::{Selection, decide, parse_directives};
use super::signals::{Dimensions, TextSignals};
use super::{PatternError, SelectContext};

/// The selector's output: an execution shape, never a permission to execute.
#[derive(Debug, Clone)]
pub struct Plan<'a> {
    pub request: &'a PatternRequest,
    pub selection: Selection,
    pub lanes: Vec<Lane>,
    pub runtime_mapping: RuntimeMapping,
    pub proof_expectations: Vec<Cow<'static, str>>,
    pub safety_notes: Vec<Cow<'static, str>>,
    /// Static per policy; pre-encoded (see [`super::policy::Policy::role_rules_json`]).
    pub role_rules: &'a RawValue,
    pub profile_mapping: &'a RawValue,
    pub module_swarm_scale: Option<SwarmScale>,
}

impl Plan<'_> {
    /// `runtime_mapping.prompt_contract`.
    pub fn prompt_contract(&self) -> String {
        let m = &self.runtime_mapping;
        prompt_contract(
            self.request,
            self.selection.selected_pattern,
            &self.selection.overlays,
            m.primary_mechanism,
            m.invocation_hint,
            &self.lanes,
        )
    }
}

/// `runtime_mapping` as a plan is written: the mapping and its prompt contract.
#[derive(Serialize)]
struct RuntimeMappingView<'a> {
    primary_mechanism: Mechanism,
    fallback_mechanisms: &'a [Mechanism],
    invocation_hint: &'a str,
    prompt_contract: String,
}

impl Serialize for Plan<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let m = &self.runtime_mapping;
        let mapping = RuntimeMappingView {
            primary_mechanism: m.primary_mechanism,
            fallback_mechanisms: &m.fallback_mechanisms,
            invocation_hint: m.invocation_hint,
            prompt_contract: self.prompt_contract(),
        };
        let mut st = s.serialize_struct("Plan", 9)?;
        st.serialize_field("request", self.request)?;
        st.serialize_field("selection", &self.selection)?;
        st.serialize_field("lanes", &self.lanes)?;
        st.serialize_field("runtime_mapping", &mapping)?;
        st.serialize_field("proof_expectations", &self.proof_expectations)?;
        st.serialize_field("safety_notes", &self.safety_notes)?;
        st.serialize_field("role_rules", self.role_rules)?;
        st.serialize_field("profile_mapping", self.profile_mapping)?;
        st.serialize_field("module_swarm_scale", &self.module_swarm_scale)?;
        st.end()
    }
}

/// A plan plus diagnostics about its inputs (e.g. a roster that could not be read but was not
/// needed). Diagnostics are gaffer's addition; they never change the decision.
#[derive(Debug, Clone)]
pub struct PlanOutcome<'a> {
    pub plan: Plan<'a>,
    pub diagnostics: Vec<String>,
}

fn origin_of(origin: &RosterOrigin) -> String {
    match origin {
        RosterOrigin::Param => "the roster_path param".to_owned(),
        RosterOrigin::Env(var) => (*var).to_owned(),
        RosterOrigin::Workspace => "the workspace default".to_owned(),
    }
}

/// Build the plan for a validated request. `roster_param` is the `roster_path` param, if any.
pub fn build_plan<'a>(
    req: &'a PatternRequest,
    roster_param: Option<&str>,
    ctx: &'a SelectContext,
) -> Result<PlanOutcome<'a>, PatternError> {
    req.validate()?;
    let policy = &*ctx.policy;
    let (directives, blob_notes) = parse_directives(&req.notes);
    let text = TextSignals::analyze(req, &blob_notes, policy);
    let dims = Dimensions::compute(req, &text, policy);
    let selection = decide(req, &directives, &text, dims, policy);
    let pattern = selection.selected_pattern;
    let (mut lanes, scale) = build_lanes(req, pattern, &selection.overlays, &text, &dims, policy);
    let proof = proof_expectations(req, pattern, &selection.overlays);
    let mut notes = safety_notes(req, &text, policy);

    let mut diagnostics = Vec::new();
    if let Some(loc) = roster::locate(roster_param, ctx) {
        let problem = match roster::load(&loc.path) {
            RosterLoad::Loaded(entries) => {
                if req.persistent_workers && !entries.is_empty() {
                    let mapped =
                        roster::apply(&mut lanes, &entries, &ctx.env.unavailable(), &loc.shown);
                    for note in mapped {
                        let note = Cow::Owned(note);
                        if !notes.contains(&note) {
                            notes.push(note);
                        }
                    }
                }
                None
            }
            // Spec §7.1: a path that does not exist means no roster (no mapping, no notes).
            RosterLoad::Missing => {
                diagnostics.push(format!(
                    "Roster {} ({}) does not exist, so no roster was used.",
                    loc.shown,
                    origin_of(&loc.origin)
                ));
                None
            }
            RosterLoad::Broken(reason) => Some(reason),
        };
        if let Some(problem) = problem {
            let origin = origin_of(&loc.origin);
            // Where the reference crashes every selection on a broken roster (spec §12, weakness
            // 17), gaffer fails only the selections that would use it, naming the problem.
            if req.persistent_workers {
                return Err(PatternError::new(
                    "roster",
                    format!(
                        "persistent workers need a readable roster, but {} ({origin}): {problem}",
                        loc.shown
                    ),
                ));
            }
            diagnostics.push(format!(
                "Roster {} ({origin}) was not used: {problem}. Persistent workers were not requested, so the plan is unaffected.",
                loc.shown
            ));
        }
    }

    let runtime_mapping = map_runtime(req, pattern, &lanes);
    Ok(PlanOutcome {
        plan: Plan {
            request: req,
            selection,
            lanes,
            runtime_mapping,
            proof_expectations: proof,
            safety_notes: notes,
            role_rules: &policy.role_rules_json,
            profile_mapping: &policy.profile_mapping_json,
            module_swarm_scale: scale,
        },
        diagnostics,
    })
}
