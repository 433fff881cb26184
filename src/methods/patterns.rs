//! Worker-pattern methods: `patterns/select`, `patterns/execution_plan`, `patterns/render` and
//! `roster/validate`, plus the MCP tools `select_worker_pattern` and `render_execution_plan`.
//!
//! The selector itself is pure (`crate::patterns`); this module supplies what it needs from the
//! outside world: the workspace's policy (cached, reloaded when the file changes), the roster
//! environment read per request, and the workspace root for relative roster paths. Params are
//! parsed with the reference's loose coercions, so the typed parameter here is a thin wrapper
//! around the raw JSON whose schema is the canonical request.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use super::App;
use crate::json_out::{self, Raw};
use crate::patterns::request::{PatternRequestSchema, SelectParamsSchema};
use crate::patterns::roster::{self, RosterOrigin};
use crate::patterns::{
    self, OutputKind, PatternError, Policy, PolicyError, RosterReport, SelectContext, TextForm,
    build_plan,
};
use crate::rpc::{Access, AppCode, Audience, CallCtx, MethodDef, Profile, Router, RpcError};

pub fn register(r: &mut Router<App>) {
    r.add_encoded(
        MethodDef {
            name: "patterns/select",
            doc: "Plan how to split a task into worker lanes: give the `objective` (and optionally `scopes`, `tests_required`, `persistent_workers`, ...). Returns a dry-run wrapper whose `kind` says which payload it holds, chosen by `output` (default `execution_plan`; over MCP the default is `select`, the selection with its lanes, proof expectations and safety notes; other forms render task specs for one mechanism). Nothing is executed: to act on the plan, sync a bundle and create workers.",
            access: Access::Read,
            audience: Audience::Anyone,
            mcp_tool: Some("select_worker_pattern"),
        },
        select,
    );
    r.add_encoded(
        MethodDef {
            name: "patterns/execution_plan",
            doc: "Plan a task like `select_worker_pattern` and return the dry-run execution plan: lanes, task specs for the chosen mechanism and safety notes, ready to hand to workers. Nothing is executed.",
            access: Access::Read,
            audience: Audience::Anyone,
            mcp_tool: Some("render_execution_plan"),
        },
        execution_plan,
    );
    r.add(
        MethodDef {
            name: "patterns/render",
            doc: "Choose a worker pattern and render a text form: `summary` (the `select --text` lines) or `prompt_contract` (the contract handed to every lane).",
            access: Access::Read,
            audience: Audience::Anyone,
            mcp_tool: None,
        },
        render,
    );
    r.add(
        MethodDef {
            name: "roster/validate",
            doc: "Check a worker roster file (default: the configured or workspace roster) and report errors and warnings.",
            access: Access::Read,
            audience: Audience::Anyone,
            mcp_tool: None,
        },
        validate,
    );
}

// ----- params and results --------------------------------------------------------------------

/// Selection params as sent (aliases and loose types included); parsed by
/// [`patterns::parse_params`], described by [`SelectParamsSchema`].
#[derive(Debug)]
pub struct SelectInput(pub Value);

impl<'de> Deserialize<'de> for SelectInput {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Value::deserialize(d).map(SelectInput)
    }
}

impl JsonSchema for SelectInput {
    fn schema_name() -> Cow<'static, str> {
        "SelectParams".into()
    }
    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        SelectParamsSchema::json_schema(g)
    }
}

/// Execution-plan params: the request (no `output`; it is always `execution_plan`).
#[derive(Debug)]
pub struct PlanInput(pub Value);

impl<'de> Deserialize<'de> for PlanInput {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Value::deserialize(d).map(PlanInput)
    }
}

/// Schema of [`PlanInput`]: the request plus an optional roster file.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct PlanParamsSchema {
    #[serde(flatten)]
    pub request: PatternRequestSchema,
    /// Roster YAML inside the workspace to map persistent workers from.
    #[serde(default)]
    pub roster_path: Option<String>,
}

impl JsonSchema for PlanInput {
    fn schema_name() -> Cow<'static, str> {
        "PlanParams".into()
    }
    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        PlanParamsSchema::json_schema(g)
    }
}

/// Render params: the request plus the text `form`.
#[derive(Debug)]
pub struct RenderInput(pub Value);

impl<'de> Deserialize<'de> for RenderInput {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Value::deserialize(d).map(RenderInput)
    }
}

/// The text forms `patterns/render` produces.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TextFormName {
    /// `selected_pattern: …` lines, lanes and proof expectations (the CLI `select --text`).
    Summary,
    /// The contract every lane works under (the CLI `render`).
    PromptContract,
}

/// Schema of [`RenderInput`].
#[derive(Debug, Deserialize, JsonSchema)]
pub struct RenderParamsSchema {
    #[serde(flatten)]
    pub request: PatternRequestSchema,
    /// Which text to render; default `prompt_contract`.
    #[serde(default)]
    pub form: Option<TextFormName>,
    /// Roster YAML inside the workspace to map persistent workers from.
    #[serde(default)]
    pub roster_path: Option<String>,
}

impl JsonSchema for RenderInput {
    fn schema_name() -> Cow<'static, str> {
        "RenderParams".into()
    }
    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        RenderParamsSchema::json_schema(g)
    }
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct RenderResult {
    /// Always true: the text describes a plan, nothing ran.
    pub dry_run: bool,
    /// `worker_pattern_prompt_contract` or `worker_pattern_summary`.
    pub kind: String,
    pub text: String,
    /// Problems with optional inputs (e.g. an unreadable roster) that did not change the plan
    /// (empty when there were none).
    pub diagnostics: Vec<String>,
}

/// A selection result: one of the reference's wrappers, already encoded (the typed plan is
/// written straight to JSON text rather than built up as a `Value` tree).
#[derive(Debug)]
pub struct PatternsResult(pub Raw);

impl From<PatternsResult> for Raw {
    fn from(result: PatternsResult) -> Raw {
        result.0
    }
}

impl JsonSchema for PatternsResult {
    fn schema_name() -> Cow<'static, str> {
        "PatternsResult".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "object",
            "description": "A dry-run wrapper. `kind` tells which payload key is present: `plan` (selection, execution plan), `execution_plan`, `prompt_bundle`, `ephemeral_workers` (+ deprecated `delegate`), `persistent_workers` (+ `swarm`), `task_graph` (+ `kanban`).",
            "required": ["dry_run", "kind"],
            "properties": {
                "dry_run": {"const": true},
                "kind": {"enum": [
                    "worker_pattern_selection", "worker_pattern_execution_plan",
                    "worker_pattern_prompt_bundle", "worker_pattern_ephemeral_worker_spec",
                    "worker_pattern_persistent_worker_spec", "worker_pattern_task_graph_spec"
                ]},
                "plan": {"type": "object"},
                "execution_plan": {"type": "object"},
                "prompt_bundle": {"type": "object"},
                "ephemeral_workers": {"type": "object"},
                "delegate": {"type": "object"},
                "persistent_workers": {"type": "object"},
                "swarm": {"type": "object"},
                "task_graph": {"type": "object"},
                "kanban": {"type": "object"},
                "diagnostics": {"type": "array", "items": {"type": "string"}}
            }
        })
    }
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ValidateParams {
    /// Roster file inside the workspace. Default: the roster a selection would use
    /// (`WORKER_PATTERNS_ROSTER_PATH`, the deprecated `HERMES_SWARM_ROSTER_PATH`, then
    /// `.gaffer/roster.yaml`).
    #[serde(default)]
    pub path: Option<String>,
}

// ----- handlers ------------------------------------------------------------------------------

async fn select(app: Arc<App>, ctx: CallCtx, p: SelectInput) -> Result<PatternsResult, RpcError> {
    // Over MCP the default form is the selection (as the reference's MCP bridge answers);
    // an explicit `output` is honoured.
    let mut params = p.0;
    if ctx.client.profile == Profile::Mcp
        && let Value::Object(map) = &mut params
        && !map.contains_key("output")
    {
        map.insert("output".into(), Value::String("select".into()));
    }
    run_select(&app, &params, None).map(PatternsResult)
}

async fn execution_plan(
    app: Arc<App>,
    _ctx: CallCtx,
    p: PlanInput,
) -> Result<PatternsResult, RpcError> {
    run_select(&app, &p.0, Some(OutputKind::ExecutionPlan)).map(PatternsResult)
}

async fn render(app: Arc<App>, _ctx: CallCtx, p: RenderInput) -> Result<RenderResult, RpcError> {
    let form = match p.0.get("form") {
        None | Some(Value::Null) => TextForm::PromptContract,
        Some(Value::String(s)) if s == "prompt_contract" => TextForm::PromptContract,
        Some(Value::String(s)) if s == "summary" => TextForm::Summary,
        Some(other) => {
            return Err(RpcError::invalid_params(
                "form",
                format!("unknown form {other}; use \"summary\" or \"prompt_contract\""),
            ));
        }
    };
    let root = app.workspace.root();
    let sctx = context(root, app.config.patterns_policy.as_deref())?;
    let parsed = patterns::parse_params(&p.0).map_err(invalid)?;
    let roster_path = confined_param(root, parsed.roster_path.as_deref())?;
    let outcome = build_plan(&parsed.request, roster_path.as_deref(), &sctx).map_err(invalid)?;
    Ok(RenderResult {
        dry_run: true,
        kind: match form {
            TextForm::PromptContract => "worker_pattern_prompt_contract",
            TextForm::Summary => "worker_pattern_summary",
        }
        .to_owned(),
        text: patterns::render::render_text_form(&outcome, form),
        diagnostics: outcome.diagnostics.clone(),
    })
}

async fn validate(
    app: Arc<App>,
    _ctx: CallCtx,
    p: ValidateParams,
) -> Result<RosterReport, RpcError> {
    let root = app.workspace.root();
    match p.path {
        Some(raw) => {
            let path = confine(root, &raw, "path")?;
            Ok(roster::validate_roster_at(&raw, &path))
        }
        None => {
            let sctx = context(root, app.config.patterns_policy.as_deref())?;
            match roster::locate(None, &sctx) {
                Some(loc) => Ok(roster::validate_roster_at(&loc.shown, &loc.path)),
                None => Err(RpcError::invalid_params(
                    "path",
                    "no roster is configured (no path given, no roster variable set, no .gaffer/roster.yaml)",
                )),
            }
        }
    }
}

/// Parse, select and render `params` for the workspace of `app`, as encoded JSON.
pub fn run_select(app: &App, params: &Value, forced: Option<OutputKind>) -> Result<Raw, RpcError> {
    let root = app.workspace.root();
    let sctx = context(root, app.config.patterns_policy.as_deref())?;
    let mut parsed = patterns::parse_params(params).map_err(invalid)?;
    if let Some(output) = forced {
        parsed.output = output;
    }
    let roster_path = confined_param(root, parsed.roster_path.as_deref())?;
    let outcome = build_plan(&parsed.request, roster_path.as_deref(), &sctx).map_err(invalid)?;
    let mut out = Vec::with_capacity(16 * 1024);
    patterns::render::write_output(&outcome, parsed.output, &mut out)
        .and_then(|()| json_out::into_raw(out))
        .map_err(|e| {
            tracing::error!(error = %e, "selection result did not serialize");
            RpcError::internal("encoding the selection")
        })
}

fn invalid(e: PatternError) -> RpcError {
    RpcError::invalid_params(&e.field, e.message)
}

// ----- workspace plumbing (shared with the CLI) ------------------------------------------------

/// Selection context for `root`: its policy, the roster environment of this process (read
/// now, so changes apply to the next request), and the workspace roster default.
pub fn context(root: &Path, policy_file: Option<&Path>) -> Result<SelectContext, RpcError> {
    let policy = cached_policy(root, policy_file).map_err(|(path, e)| {
        RpcError::app(
            AppCode::Failed,
            "patterns_policy_invalid",
            format!(
                "the selection policy {} is invalid at `{}`: {}",
                path.display(),
                e.key,
                e.message
            ),
        )
        .with_data("key", e.key)
    })?;
    Ok(SelectContext::for_workspace(root, policy))
}

type PolicyStamp = Option<(SystemTime, u64)>;
type PolicyCache = Mutex<HashMap<PathBuf, (PolicyStamp, Arc<Policy>)>>;

/// Loads the policy that applies to `root`, reusing the parsed copy while the file is unchanged.
pub fn cached_policy(
    root: &Path,
    explicit: Option<&Path>,
) -> Result<Arc<Policy>, (PathBuf, PolicyError)> {
    static CACHE: OnceLock<PolicyCache> = OnceLock::new();
    let path = match explicit {
        Some(p) if p.is_relative() => root.join(p),
        Some(p) => p.to_path_buf(),
        None => root
            .join(".gaffer")
            .join(patterns::policy::WORKSPACE_POLICY_FILE),
    };
    let stamp: PolicyStamp = std::fs::metadata(&path)
        .ok()
        .filter(|m| m.is_file())
        .map(|m| (m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len()));
    if stamp.is_none() && explicit.is_none() {
        return Ok(Policy::builtin());
    }
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    if let Ok(map) = cache.lock()
        && let Some((cached_stamp, policy)) = map.get(&path)
        && stamp.is_some()
        && *cached_stamp == stamp
    {
        return Ok(policy.clone());
    }
    let policy = Policy::load(root, Some(&path)).map_err(|e| (path.clone(), e))?;
    if let Ok(mut map) = cache.lock() {
        map.insert(path, (stamp, policy.clone()));
    }
    Ok(policy)
}

fn confined_param(root: &Path, raw: Option<&str>) -> Result<Option<String>, RpcError> {
    raw.map(|r| confine(root, r, "roster_path").map(|p| p.display().to_string()))
        .transpose()
}

/// Resolve a client-supplied path inside the workspace. Clients (agents included) may only
/// point at files under the root: no `..`, no absolute path elsewhere, no symlink out.
pub fn confine(root: &Path, raw: &str, field: &str) -> Result<PathBuf, RpcError> {
    let candidate = Path::new(raw);
    if candidate
        .components()
        .any(|c| matches!(c, Component::ParentDir))
    {
        return Err(RpcError::invalid_params(
            field,
            "the path must not contain `..`",
        ));
    }
    let joined = if candidate.is_absolute() {
        candidate.to_path_buf()
    } else {
        root.join(candidate)
    };
    let canonical_root = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    let inside = match joined.canonicalize() {
        Ok(real) => real.starts_with(&canonical_root),
        // Not there (yet): judge the spelled path; loading will report it missing.
        Err(_) => joined.starts_with(root) || joined.starts_with(&canonical_root),
    };
    if !inside {
        return Err(RpcError::invalid_params(
            field,
            "the path must be inside the workspace",
        ));
    }
    Ok(joined)
}

/// Where the roster of a selection would come from, for `doctor`.
pub fn roster_origin_label(origin: &RosterOrigin) -> String {
    match origin {
        RosterOrigin::Param => "given path".to_owned(),
        RosterOrigin::Env(var) => (*var).to_owned(),
        RosterOrigin::Workspace => "workspace default".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confine_keeps_paths_inside_the_workspace() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("r.yaml"), "workers: []\n").unwrap();
        assert!(confine(root, "r.yaml", "roster_path").is_ok());
        assert!(confine(root, "missing/r.yaml", "roster_path").is_ok());
        assert_eq!(
            confine(root, "../r.yaml", "roster_path")
                .unwrap_err()
                .field(),
            Some("roster_path")
        );
        assert_eq!(
            confine(root, "/etc/passwd", "path").unwrap_err().field(),
            Some("path")
        );
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink("/etc", root.join("out")).unwrap();
            assert!(confine(root, "out/hosts", "path").is_err());
        }
    }

    #[test]
    fn policy_cache_reloads_when_the_file_changes() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        assert_eq!(cached_policy(root, None).unwrap().close_score_margin, 2);
        std::fs::create_dir_all(root.join(".gaffer")).unwrap();
        let file = root.join(".gaffer/patterns.yaml");
        std::fs::write(&file, "close_score_margin: 3\n").unwrap();
        assert_eq!(cached_policy(root, None).unwrap().close_score_margin, 3);
        std::fs::write(&file, "close_score_margin: 11\n").unwrap();
        assert_eq!(cached_policy(root, None).unwrap().close_score_margin, 11);
        std::fs::write(&file, "close_score_margin: nope\n").unwrap();
        assert_eq!(
            cached_policy(root, None).unwrap_err().1.key,
            "close_score_margin"
        );
        let err = context(root, None).unwrap_err();
        assert_eq!(err.machine_code(), Some("patterns_policy_invalid"));
    }
}
