//! Worker-pattern selection: a pure planner that turns a task description into an execution
//! shape (pattern, overlays, lanes, runtime mapping, proof expectations, safety notes).
//!
//! The decisions reproduce the public worker-patterns selector (see
//! `reference/worker-patterns-spec.md`); the prose is gaffer's own. Everything here is pure:
//! the environment (roster variables, workspace roster path) is passed in through
//! [`SelectContext`], so the same params and context always give the same bytes.
//!
//! Layout, one concept per module:
//! - [`request`]: params parsing with the reference's loose coercions, and the JSON schema;
//! - [`policy`]: keyword lists, weights, role table and escalation, loaded from YAML data;
//! - [`signals`]: the keyword blob, matched signals and the six dimensions;
//! - [`select`]: scores, overrides, the decision order and the overlay;
//! - [`lanes`]: lanes, profile escalation and module-swarm scale;
//! - [`notes`]: proof expectations and safety notes;
//! - [`roster`]: roster loading, mapping onto lanes and validation;
//! - [`runtime`]: mechanisms, fallbacks, invocation hint and prompt contract;
//! - [`plan`]: assembles a [`plan::Plan`];
//! - [`render`]: the `output` wrappers, renderers and text forms;
//! - [`encode`]: the common reply forms written straight to bytes.

pub mod encode;
pub mod lanes;
pub mod notes;
pub mod phrases;
pub mod plan;
pub mod policy;
pub mod render;
pub mod request;
pub mod roster;
pub mod runtime;
pub mod select;
pub mod signals;
mod vocab;

use std::path::PathBuf;
use std::sync::Arc;

pub use plan::{Plan, PlanOutcome, build_plan};
pub use policy::{Policy, PolicyError};
pub use render::{OutputKind, Rendered, TextForm};
pub use request::{PatternRequest, SelectParams, parse_params};
pub use roster::{RosterEnv, RosterReport, validate_roster};
pub use vocab::{Dimension, LaneRole, Pattern};

/// A request that cannot be planned. `field` names the offending parameter (or `roster`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct PatternError {
    pub field: String,
    pub message: String,
}

impl PatternError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// Everything outside the request that a selection may depend on. Built once by the caller
/// (server, CLI, test) and passed in, so nothing deep inside reads the process environment.
#[derive(Debug, Clone)]
pub struct SelectContext {
    pub policy: Arc<Policy>,
    /// Roster and unavailable-worker variables, captured by the caller.
    pub env: RosterEnv,
    /// The workspace's default roster (e.g. `<root>/.gaffer/roster.yaml`); used when neither a
    /// `roster_path` param nor an env variable names one, and only if the file exists.
    pub workspace_roster: Option<PathBuf>,
    /// Relative roster paths resolve against this directory (the workspace root, or a test's
    /// fixture folder). `None` means the process working directory.
    pub base_dir: Option<PathBuf>,
    /// Home directory for `~` expansion in roster paths.
    pub home_dir: Option<PathBuf>,
}

impl SelectContext {
    /// The built-in policy, no roster variables, no workspace roster.
    pub fn isolated() -> Self {
        Self {
            policy: Policy::builtin(),
            env: RosterEnv::default(),
            workspace_roster: None,
            base_dir: None,
            home_dir: None,
        }
    }

    /// The built-in policy with roster variables read from the process environment and the
    /// default roster of `workspace` (`.gaffer/roster.yaml`). Meant for binaries, not tests.
    pub fn for_workspace(workspace: &std::path::Path, policy: Arc<Policy>) -> Self {
        let (env, home_dir) = process_env();
        Self {
            policy,
            env: env.clone(),
            workspace_roster: Some(workspace.join(".gaffer").join("roster.yaml")),
            base_dir: Some(workspace.to_path_buf()),
            home_dir: home_dir.clone(),
        }
    }
}

/// The process's roster variables and home directory, read at the first selection: a process's
/// environment changes only by its own hand, and gaffer never changes its own, so one read
/// serves every request.
fn process_env() -> &'static (RosterEnv, Option<PathBuf>) {
    static ENV: std::sync::OnceLock<(RosterEnv, Option<PathBuf>)> = std::sync::OnceLock::new();
    ENV.get_or_init(|| {
        (
            RosterEnv::from_process(),
            std::env::var_os("HOME").map(PathBuf::from),
        )
    })
}

/// Parse `params` (the reference request vocabulary plus `output` and `roster_path`), select a
/// pattern and render the requested wrapper as JSON.
pub fn select(
    params: &serde_json::Value,
    ctx: &SelectContext,
) -> Result<serde_json::Value, PatternError> {
    let parsed = parse_params(params)?;
    let outcome = build_plan(&parsed.request, parsed.roster_path.as_deref(), ctx)?;
    let rendered = render::render_output(&outcome, parsed.output);
    serde_json::to_value(&rendered)
        .map_err(|e| PatternError::new("output", format!("could not encode the result: {e}")))
}

/// Parse `params`, select, and render one of the text forms.
pub fn render_text(
    params: &serde_json::Value,
    form: TextForm,
    ctx: &SelectContext,
) -> Result<String, PatternError> {
    let parsed = parse_params(params)?;
    let outcome = build_plan(&parsed.request, parsed.roster_path.as_deref(), ctx)?;
    Ok(render::render_text_form(&outcome, form))
}
