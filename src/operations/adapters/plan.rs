//! The `plan` provider: `plan.launch` runs a selected worker pattern's lanes. Its plan is the
//! launch plan derived afresh (selection, mechanism, each lane's profile, argv, declarations,
//! prompt and dependencies), so one approval or trusted rule covers exactly those lanes.

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
use crate::plans::{LaunchSpec, LaunchTarget, PlanRuntime};

pub const PROVIDER: &str = "plan";
pub const OPERATION: &str = "plan.launch";

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LaunchArgs {}

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
        summary: "Run a selected worker pattern's lanes as workers of a pinned bundle".into(),
        risk: Risk::High,
        target_kind: "plan".into(),
        target_schema: schema_of::<LaunchTarget>(),
        arguments_schema: schema_of::<LaunchArgs>(),
        request_ttl_seconds: 3600,
        approval_ttl_seconds: 600,
        requires_approval: false,
        implemented: true,
    }
}

pub struct PlanLaunchAdapter {
    desc: Descriptor,
    plans: Arc<PlanRuntime>,
}

pub fn adapters(plans: Arc<PlanRuntime>) -> Vec<Arc<dyn Adapter>> {
    vec![Arc::new(PlanLaunchAdapter {
        desc: descriptor(),
        plans,
    })]
}

pub fn launch_error(e: crate::plans::LaunchError) -> AdapterError {
    AdapterError {
        code: e.code.to_string(),
        message: e.message,
        field: e.field.map(|f| format!("target.{f}")),
    }
}

fn decode_spec(plan: &Resolved) -> Result<LaunchSpec, AdapterError> {
    let s: LaunchSpec = serde_json::from_value(plan.preconditions.clone())
        .map_err(|e| AdapterError::input(None, format!("unreadable launch plan: {e}")))?;
    // Each lane's argv (classified and shown) must be the command its profile runs, and the
    // secret names those of the declarations resolved: otherwise the plan authorizes nothing.
    let same = s.lanes.iter().all(|l| l.argv == l.profile.command)
        && s.secrets == crate::secrets::names(&s.declarations);
    same.then_some(s).ok_or_else(|| {
        AdapterError::coded(
            codes::PRECONDITION_FAILED,
            "the launch plan's argv or secrets disagree with what it would run",
        )
    })
}

/// Fields rules match: plan digest, pattern, mechanism, bundle id and digest, each lane's
/// role, profile, program and scope, the secrets (which an allow rule must name) and
/// declarations.
pub fn classify(s: &LaunchSpec) -> Classification {
    let one = |v: &str| BTreeSet::from([v.to_string()]);
    let set = |f: &dyn Fn(&crate::plans::spec::LaneSpec) -> Vec<String>| -> BTreeSet<String> {
        s.lanes.iter().flat_map(f).collect()
    };
    let mut fields = BTreeMap::from([
        ("selection_digest".to_string(), one(&s.selection_digest)),
        ("pattern".to_string(), one(&s.pattern)),
        ("mechanism".to_string(), one(&s.mechanism)),
        ("bundle_id".to_string(), one(&s.config_bundle.id)),
        ("bundle_digest".to_string(), one(&s.config_bundle.digest)),
        ("roles".to_string(), set(&|l| vec![l.role.clone()])),
        (
            "profiles".to_string(),
            set(&|l| vec![l.profile.selector.value().to_string()]),
        ),
        (
            "programs".to_string(),
            set(&|l| l.argv.first().cloned().into_iter().collect()),
        ),
    ]);
    let scopes = set(&|l| l.scope.clone());
    if !scopes.is_empty() {
        fields.insert("scopes".into(), scopes);
    }
    let mut must_name = BTreeSet::new();
    declaration_fields(&s.secrets, &s.declarations, &mut fields, &mut must_name);
    Classification {
        target_kind: "plan".into(),
        fields,
        attrs: BTreeMap::new(),
        must_name,
        argv: None,
    }
}

pub fn present(s: &LaunchSpec) -> Presentation {
    let lanes: Vec<String> = s
        .lanes
        .iter()
        .map(|l| {
            format!(
                "{} → {} {:?}",
                l.lane_id,
                l.profile.selector.value(),
                l.argv
            )
        })
        .collect();
    Presentation {
        title: format!(
            "Launch plan {} ({}, {}, {} lanes)",
            s.plan_id,
            s.pattern,
            s.mechanism,
            s.lanes.len()
        ),
        // What widens every lane's sandbox or hands over secrets comes first (a summary cut
        // at its bound loses lanes, never these).
        summary: format!(
            "{}; secrets [{}]; bundle {} {}; {}",
            declarations_shown(&s.declarations),
            s.secrets.join(", "),
            s.config_bundle.id,
            s.config_bundle.digest,
            lanes.join("; ")
        ),
    }
}

impl Adapter for PlanLaunchAdapter {
    fn descriptor(&self) -> &Descriptor {
        &self.desc
    }

    fn decode<'a>(
        &'a self,
        target: &'a Value,
        arguments: &'a Value,
    ) -> BoxFuture<'a, Result<Decoded, AdapterError>> {
        ready(decode_typed::<LaunchTarget, LaunchArgs>(target, arguments))
    }

    fn resolve<'a>(
        &'a self,
        ctx: &'a AdapterCtx,
        input: Decoded,
    ) -> BoxFuture<'a, Result<Resolved, AdapterError>> {
        ready((|| {
            let t: LaunchTarget = decode_closed("target", &input.target)?;
            let plan_id = crate::plans::spec::plan_id(&ctx.operation_id);
            let spec = crate::plans::spec::derive(self.plans.workspace(), &t, &plan_id)
                .map_err(launch_error)?;
            Ok(Resolved {
                target: input.target,
                arguments: input.arguments,
                preconditions: to_value(&spec),
            })
        })())
    }

    fn authorize<'a>(
        &'a self,
        plan: &'a Resolved,
    ) -> BoxFuture<'a, Result<Classification, AdapterError>> {
        ready(decode_spec(plan).map(|s| classify(&s)))
    }

    fn present<'a>(
        &'a self,
        plan: &'a Resolved,
    ) -> BoxFuture<'a, Result<Presentation, AdapterError>> {
        ready(decode_spec(plan).map(|s| present(&s)))
    }

    fn execute<'a>(
        &'a self,
        ctx: &'a AdapterCtx,
        plan: &'a Resolved,
    ) -> BoxFuture<'a, Result<Outcome, ExecError>> {
        Box::pin(async move {
            let spec = decode_spec(plan)
                .map_err(|e| ExecError::new(FailureKind::NotStarted, &e.code, e.message))?;
            let plan_id = spec.plan_id.clone();
            let lanes = spec.lanes.len();
            match self
                .plans
                .launch(&ctx.operation_id, &ctx.client_id, spec, ctx.sandbox)
                .await
            {
                Ok(()) => Ok(Outcome {
                    proven: true,
                    result: Some(serde_json::json!({ "plan_id": plan_id, "lanes": lanes })),
                    upstream_status: None,
                }),
                Err(e) => Err(ExecError::new(
                    FailureKind::NotStarted,
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
            let spec = decode_spec(plan)
                .map_err(|e| ExecError::new(FailureKind::PossiblyPartial, &e.code, e.message))?;
            let started = self.plans.workspace().read(|s| {
                s.plans
                    .get(&spec.plan_id)
                    .is_some_and(|p| p.executor.is_some() && p.operation_id == ctx.operation_id)
            });
            Ok(Outcome {
                proven: started,
                result: started.then(|| serde_json::json!({ "plan_id": spec.plan_id })),
                upstream_status: None,
            })
        })())
    }
}
