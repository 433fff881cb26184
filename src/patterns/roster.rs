//! The caller's roster of named workers: where it is, how it is read, how lanes are mapped onto
//! it, and how a roster file is validated.
//!
//! As the reference says (spec §7.1), a roster path that does not exist means no roster. Unlike
//! the reference (spec §12, weakness 17), a roster that exists but cannot be read never breaks a
//! selection that does not map persistent workers: the plan says so in a diagnostic instead.
//! When persistent workers are requested, such a roster is an error naming `roster`.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use serde::Serialize;
use serde_yaml::Value as Yaml;

use super::SelectContext;
use super::lanes::Lane;
use super::policy::SharedList;
use super::vocab::LaneRole;

pub const ENV_ROSTER_PATH: &str = "WORKER_PATTERNS_ROSTER_PATH";
pub const ENV_LEGACY_ROSTER_PATH: &str = "HERMES_SWARM_ROSTER_PATH";
pub const ENV_UNAVAILABLE: &str = "WORKER_PATTERNS_UNAVAILABLE_WORKERS";
pub const ENV_LEGACY_UNHEALTHY: &str = "HERMES_SWARM_UNHEALTHY_PROFILES";
pub const ENV_LEGACY_BLOCKED: &str = "HERMES_SWARM_BLOCKED_PROFILES";
pub const ENV_LEGACY_PROVIDER_BLOCKED: &str = "HERMES_SWARM_PROVIDER_BLOCKED_PROFILES";

/// The roster-related environment, captured by the caller (never read inside the selector).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RosterEnv {
    pub roster_path: Option<String>,
    pub legacy_roster_path: Option<String>,
    pub unavailable_workers: Option<String>,
    pub legacy_unhealthy: Option<String>,
    pub legacy_blocked: Option<String>,
    pub legacy_provider_blocked: Option<String>,
}

impl RosterEnv {
    /// Every variable this module reads.
    pub const VARS: [&'static str; 6] = [
        ENV_ROSTER_PATH,
        ENV_LEGACY_ROSTER_PATH,
        ENV_UNAVAILABLE,
        ENV_LEGACY_UNHEALTHY,
        ENV_LEGACY_BLOCKED,
        ENV_LEGACY_PROVIDER_BLOCKED,
    ];

    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        Self {
            roster_path: lookup(ENV_ROSTER_PATH),
            legacy_roster_path: lookup(ENV_LEGACY_ROSTER_PATH),
            unavailable_workers: lookup(ENV_UNAVAILABLE),
            legacy_unhealthy: lookup(ENV_LEGACY_UNHEALTHY),
            legacy_blocked: lookup(ENV_LEGACY_BLOCKED),
            legacy_provider_blocked: lookup(ENV_LEGACY_PROVIDER_BLOCKED),
        }
    }

    pub fn from_process() -> Self {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Build from `(name, value)` pairs; unknown names are ignored.
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let pairs: Vec<(&str, &str)> = pairs.into_iter().collect();
        Self::from_lookup(|k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    /// The deprecated variables that are set, for `doctor` warnings.
    pub fn deprecated_in_use(&self) -> Vec<&'static str> {
        [
            (ENV_LEGACY_ROSTER_PATH, &self.legacy_roster_path),
            (ENV_LEGACY_UNHEALTHY, &self.legacy_unhealthy),
            (ENV_LEGACY_BLOCKED, &self.legacy_blocked),
            (ENV_LEGACY_PROVIDER_BLOCKED, &self.legacy_provider_blocked),
        ]
        .into_iter()
        .filter(|(_, v)| v.is_some())
        .map(|(k, _)| k)
        .collect()
    }

    /// Union of the comma-separated unavailable-worker lists (all four variables), sorted.
    pub fn unavailable(&self) -> BTreeSet<String> {
        [
            &self.unavailable_workers,
            &self.legacy_unhealthy,
            &self.legacy_blocked,
            &self.legacy_provider_blocked,
        ]
        .into_iter()
        .flatten()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
    }
}

/// Where a roster comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RosterOrigin {
    Param,
    Env(&'static str),
    Workspace,
}

/// A roster file to read: the path as shown to users (after `~` expansion) and as opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RosterLocation {
    pub shown: String,
    pub path: PathBuf,
    pub origin: RosterOrigin,
}

fn non_empty(v: &Option<String>) -> Option<&str> {
    v.as_deref().filter(|s| !s.is_empty())
}

/// `roster_path` param, then the primary env variable, then the deprecated one, then the
/// workspace default if that file exists.
pub fn locate(param: Option<&str>, ctx: &SelectContext) -> Option<RosterLocation> {
    let configured = param
        .map(|p| (p, RosterOrigin::Param))
        .or_else(|| {
            non_empty(&ctx.env.roster_path).map(|p| (p, RosterOrigin::Env(ENV_ROSTER_PATH)))
        })
        .or_else(|| {
            non_empty(&ctx.env.legacy_roster_path)
                .map(|p| (p, RosterOrigin::Env(ENV_LEGACY_ROSTER_PATH)))
        });
    if let Some((raw, origin)) = configured {
        let shown = expand_home(raw, ctx.home_dir.as_deref());
        let path = match &ctx.base_dir {
            Some(base) if Path::new(&shown).is_relative() => base.join(&shown),
            _ => PathBuf::from(&shown),
        };
        return Some(RosterLocation {
            shown,
            path,
            origin,
        });
    }
    let default = ctx.workspace_roster.as_ref()?;
    default.exists().then(|| RosterLocation {
        shown: default.display().to_string(),
        path: default.clone(),
        origin: RosterOrigin::Workspace,
    })
}

fn expand_home(raw: &str, home: Option<&Path>) -> String {
    match (home, raw.strip_prefix('~')) {
        (Some(home), Some(rest)) if rest.is_empty() || rest.starts_with('/') => {
            format!("{}{}", home.display(), rest)
        }
        _ => raw.to_owned(),
    }
}

/// One worker as the mapper sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RosterEntry {
    pub id: String,
    pub name: String,
    /// Singular `role` only (the mapper ignores `roles`, as the reference does).
    pub role: String,
    pub model: String,
    pub preferred_task_types: Vec<String>,
    pub accepts_broadcast: bool,
}

/// Result of reading a roster file for mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RosterLoad {
    /// Shared with the parse cache: a selection takes it without copying every entry.
    Loaded(Arc<[RosterEntry]>),
    Missing,
    Broken(String),
}

pub fn load(path: &Path) -> RosterLoad {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return RosterLoad::Missing,
        Err(e) => return RosterLoad::Broken(format!("cannot inspect the roster: {e}")),
    };
    if !meta.is_file() {
        return RosterLoad::Broken("the roster path is not a regular file".to_owned());
    }
    let text = match read_text(path) {
        Ok(t) => t,
        Err(e) => return RosterLoad::Broken(format!("cannot read the roster: {e}")),
    };
    parse_cached(text)
}

/// The roster's text, read as a workspace file the agent may have replaced by a FIFO or device.
fn read_text(path: &Path) -> std::io::Result<String> {
    let bytes = crate::util::read_regular_file(path, Some(crate::util::CONFIG_FILE_LIMIT))?;
    String::from_utf8(bytes).map_err(std::io::Error::other)
}

/// Rosters parsed so far, by file text: the file is read on every selection (so an edit
/// applies at once) but parsed again only when its text changes.
static PARSED: Mutex<Vec<(String, RosterLoad)>> = Mutex::new(Vec::new());
const PARSED_KEPT: usize = 8;

fn parse_cached(text: String) -> RosterLoad {
    let lock = || PARSED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, load)) = lock().iter().find(|(t, _)| *t == text) {
        return load.clone();
    }
    let load = match serde_yaml::from_str::<Yaml>(&text) {
        Ok(doc) => RosterLoad::Loaded(entries_of(&doc).into()),
        Err(e) => RosterLoad::Broken(format!("the roster is not valid YAML: {e}")),
    };
    let mut cache = lock();
    if cache.len() >= PARSED_KEPT {
        cache.remove(0);
    }
    cache.push((text, load.clone()));
    load
}

/// Entries of a parsed roster: a top-level list, or a mapping's `workers` list. Anything that is
/// not a mapping with a truthy `id` is skipped.
pub fn entries_of(doc: &Yaml) -> Vec<RosterEntry> {
    let items = match doc {
        Yaml::Sequence(items) => items.as_slice(),
        Yaml::Mapping(m) => match m.get("workers") {
            Some(Yaml::Sequence(items)) => items.as_slice(),
            _ => &[],
        },
        _ => &[],
    };
    items.iter().filter_map(entry_of).collect()
}

fn entry_of(item: &Yaml) -> Option<RosterEntry> {
    let m = item.as_mapping()?;
    let id = m.get("id").filter(|v| yaml_truthy(v))?;
    let text = |key: &str| {
        m.get(key)
            .filter(|v| !v.is_null())
            .map(yaml_str)
            .unwrap_or_default()
    };
    let types = m
        .get("preferred_task_types")
        .filter(|v| yaml_truthy(v))
        .or_else(|| m.get("preferredTaskTypes"))
        .map(|v| match v {
            Yaml::Sequence(items) => items.iter().map(|i| yaml_str(i).to_lowercase()).collect(),
            Yaml::Null => Vec::new(),
            other => vec![yaml_str(other).to_lowercase()],
        })
        .unwrap_or_default();
    let broadcast = m
        .get("accepts_broadcast")
        .or_else(|| m.get("acceptsBroadcast"))
        .is_none_or(yaml_truthy);
    Some(RosterEntry {
        id: yaml_str(id),
        name: text("name"),
        role: text("role"),
        model: text("model"),
        preferred_task_types: types,
        accepts_broadcast: broadcast,
    })
}

fn yaml_truthy(v: &Yaml) -> bool {
    match v {
        Yaml::Null => false,
        Yaml::Bool(b) => *b,
        Yaml::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Yaml::String(s) => !s.is_empty(),
        Yaml::Sequence(s) => !s.is_empty(),
        Yaml::Mapping(m) => !m.is_empty(),
        Yaml::Tagged(t) => yaml_truthy(&t.value),
    }
}

fn yaml_str(v: &Yaml) -> String {
    match v {
        Yaml::Null => "None".to_owned(),
        Yaml::Bool(true) => "True".to_owned(),
        Yaml::Bool(false) => "False".to_owned(),
        Yaml::Number(n) => n.to_string(),
        Yaml::String(s) => s.clone(),
        Yaml::Tagged(t) => yaml_str(&t.value),
        other => serde_yaml::to_string(other)
            .map(|s| s.trim_end().to_owned())
            .unwrap_or_default(),
    }
}

/// Task types a lane scope stands for.
fn expand_scope(scope: &str, out: &mut Vec<Cow<'static, str>>) {
    let lower = scope.to_lowercase();
    let family: &'static [&'static str] = match lower.as_str() {
        "docs" | "documentation" | "runbook" | "handoff" | "spec" => {
            &["docs", "runbook", "handoff", "spec"]
        }
        "review" | "qa" | "verification" | "test" | "tests" | "smoke" => {
            &["review", "qa", "verification", "smoke"]
        }
        "scheduler" | "cron" | "ops" | "health" | "monitoring" => {
            &["ops", "lifecycle", "backend", "implementation"]
        }
        _ => {
            out.push(Cow::Owned(lower));
            return;
        }
    };
    out.extend(family.iter().map(|s| Cow::Borrowed(*s)));
}

/// The task types a lane can be matched on, in order (fixed ones borrowed: this runs for every
/// lane of every roster-mapped selection). A type may repeat: matching takes the first type a
/// worker fits, so a repeat never changes the match, and removing them costs a comparison per
/// pair (thousands for a lane over every request scope).
pub fn lane_task_types(lane: &Lane) -> Vec<Cow<'static, str>> {
    let mut scope_types = Vec::new();
    for s in &lane.scope {
        expand_scope(s, &mut scope_types);
    }
    let (fixed, scopes_first): (&'static [&'static str], bool) = match lane.role {
        LaneRole::Builder | LaneRole::PhaseWorker | LaneRole::RecoveryWorker => (
            &[
                "implementation",
                "feature",
                "patch",
                "backend",
                "integration",
            ],
            true,
        ),
        LaneRole::Reviewer => (&["review", "qa", "verification", "smoke"], false),
        LaneRole::Integrator | LaneRole::Curator => (
            &["coordination", "handoff", "integration", "merge-gate"],
            false,
        ),
        LaneRole::VariantDesigner => (&["research", "analysis", "options", "spec"], true),
    };
    let fixed = fixed.iter().map(|s| Cow::Borrowed(*s));
    if scopes_first {
        scope_types.into_iter().chain(fixed).collect()
    } else {
        fixed.chain(scope_types).collect()
    }
}

/// Map lanes onto roster workers (each worker at most once, lanes in order) and return the
/// roster notes. Unmatched lanes keep their logical profile.
pub fn apply(
    lanes: &mut [Lane],
    entries: &[RosterEntry],
    unavailable: &BTreeSet<String>,
    shown_path: &str,
) -> Vec<String> {
    let mut notes = vec![
        format!("Persistent lanes were mapped onto named workers from the roster at {shown_path}."),
        "The selector chose only the execution shape; the roster remains the authority on which worker is which.".to_owned(),
    ];
    if !unavailable.is_empty() {
        let names: Vec<&str> = unavailable.iter().map(String::as_str).collect();
        notes.push(format!(
            "Workers reported unavailable were skipped: {}.",
            names.join(", ")
        ));
    }
    let mut used = vec![false; entries.len()];
    for lane in lanes.iter_mut() {
        let types = lane_task_types(lane);
        let chosen = types.iter().find_map(|t| {
            entries.iter().enumerate().position(|(i, e)| {
                !used[i]
                    && e.accepts_broadcast
                    && !unavailable.contains(&e.id)
                    && e.preferred_task_types.iter().any(|p| p == t)
            })
        });
        match chosen {
            Some(i) => {
                used[i] = true;
                let e = &entries[i];
                lane.selected_profile = e.id.as_str().into();
                lane.fallback_profiles = SharedList::default();
                lane.runtime_hint = format!(
                    "{} Roster worker: {} ({}; role: {}; model: {}).",
                    lane.runtime_hint, e.id, e.name, e.role, e.model
                )
                .into();
            }
            None => {
                let note = format!(
                    "No roster worker fitted the {} lane, so it keeps the profile {}.",
                    lane.role.as_str(),
                    lane.selected_profile
                );
                if !notes.contains(&note) {
                    notes.push(note);
                }
            }
        }
    }
    notes
}

// ----- validation ----------------------------------------------------------------------------

/// Result of `validate-roster` / `roster/validate`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct RosterReport {
    /// True when there are no errors (warnings do not count).
    pub ok: bool,
    pub path: String,
    pub worker_count: usize,
    pub errors: Vec<String>,
    pub warnings: Vec<String>,
}

/// Keys that belong inside a worker's `adapter` block, not at its top level.
const ADAPTER_KEYS: [&str; 6] = ["url", "endpoint", "api_key", "token", "secret", "password"];

/// Validate the roster at `path` (shown as given).
pub fn validate_roster(path: &Path) -> RosterReport {
    validate_roster_at(&path.display().to_string(), path)
}

/// Validate the roster at `resolved`, reporting it as `shown`.
pub fn validate_roster_at(shown: &str, resolved: &Path) -> RosterReport {
    let mut report = RosterReport {
        ok: false,
        path: shown.to_owned(),
        worker_count: 0,
        errors: Vec::new(),
        warnings: Vec::new(),
    };
    if !resolved.exists() {
        report
            .errors
            .push(format!("roster path does not exist: {shown}"));
        return report;
    }
    let text = match read_text(resolved) {
        Ok(t) => t,
        Err(e) => {
            report.errors.push(format!("cannot read the roster: {e}"));
            return report;
        }
    };
    let doc: Yaml = match serde_yaml::from_str(&text) {
        Ok(d) => d,
        Err(e) => {
            report.errors.push(format!("YAML parse failure: {e}"));
            return report;
        }
    };
    let workers = match &doc {
        Yaml::Mapping(m) => m.get("workers"),
        other => Some(other),
    };
    let Some(Yaml::Sequence(workers)) = workers else {
        report.errors.push(
            "the roster needs a top-level list of workers (a list, or a `workers:` list)"
                .to_owned(),
        );
        return report;
    };
    report.worker_count = workers.len();
    let mut seen_ids: Vec<String> = Vec::new();
    for (i, w) in workers.iter().enumerate() {
        let index = i + 1;
        let Some(m) = w.as_mapping() else {
            report
                .errors
                .push(format!("worker {index} must be a mapping"));
            continue;
        };
        let id = m
            .get("id")
            .filter(|v| !v.is_null())
            .map(yaml_str)
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty());
        let label = match &id {
            Some(id) => format!("worker {id:?}"),
            None => {
                report.errors.push(format!("worker {index} has no id"));
                format!("worker {index}")
            }
        };
        if let Some(id) = &id {
            if seen_ids.contains(id) {
                report.errors.push(format!("duplicate worker id {id:?}"));
            } else {
                seen_ids.push(id.clone());
            }
        }
        let roles = m.get("roles").or_else(|| m.get("role"));
        let has_role = match roles {
            Some(Yaml::String(s)) => !s.trim().is_empty(),
            Some(Yaml::Sequence(items)) => items
                .iter()
                .any(|r| matches!(r, Yaml::String(s) if !s.trim().is_empty())),
            _ => false,
        };
        if !has_role {
            report
                .errors
                .push(format!("{label} declares no role (`roles` or `role`)"));
        }
        if let Some(caps) = m.get("capabilities").filter(|v| !v.is_null())
            && !caps.is_sequence()
        {
            report
                .errors
                .push(format!("{label}: `capabilities` must be a list"));
        }
        if m.get("adapter").is_none() {
            for key in ADAPTER_KEYS {
                if m.get(key).is_some() {
                    report.warnings.push(format!(
                        "{label}: `{key}` is adapter-specific and belongs under an `adapter` block"
                    ));
                }
            }
        }
    }
    report.ok = report.errors.is_empty();
    report
}

/// The roster template written by `init-config`.
pub const ROSTER_TEMPLATE: &str = "\
# gaffer roster: named workers that persistent lanes may be mapped onto.
# Lanes are matched by preferred_task_types; each worker serves at most one lane per plan.
# Keep adapter-specific settings (urls, keys) under an `adapter:` block, never at top level.
workers:
  - id: worker-code-fast
    name: Fast code worker
    roles: [builder, recovery-worker]
    capabilities: [code, tests, refactor]
    accepts_broadcast: true
    preferred_task_types: [implementation, feature, patch]

  - id: worker-review
    name: Independent reviewer
    roles: [reviewer]
    capabilities: [code-review, test-review, security-review]
    accepts_broadcast: true
    preferred_task_types: [review, qa, verification]

  - id: worker-general-premium
    name: Planning and integration worker
    roles: [curator, integrator, phase-worker]
    capabilities: [planning, synthesis, integration]
    accepts_broadcast: true
    preferred_task_types: [coordination, integration, docs]
";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unavailable_is_the_sorted_union_of_all_four_variables() {
        let env = RosterEnv::from_pairs([
            (ENV_UNAVAILABLE, "b, a,,"),
            (ENV_LEGACY_BLOCKED, "c"),
            (ENV_LEGACY_UNHEALTHY, " a "),
        ]);
        let names: Vec<String> = env.unavailable().into_iter().collect();
        assert_eq!(names, vec!["a", "b", "c"]);
        assert_eq!(
            env.deprecated_in_use(),
            vec![ENV_LEGACY_UNHEALTHY, ENV_LEGACY_BLOCKED]
        );
    }

    #[test]
    fn entries_skip_non_mappings_and_missing_ids() {
        let doc: Yaml = serde_yaml::from_str(
            "- id: a\n  preferredTaskTypes: [Review]\n  acceptsBroadcast: false\n- name: x\n- just-a-string\n- id: ''\n",
        )
        .unwrap();
        let e = entries_of(&doc);
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].preferred_task_types, vec!["review"]);
        assert!(!e[0].accepts_broadcast);
    }

    #[test]
    fn template_is_a_valid_roster() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("roster.yaml");
        std::fs::write(&path, ROSTER_TEMPLATE).unwrap();
        let r = validate_roster(&path);
        assert!(r.ok, "{r:?}");
        assert_eq!(r.worker_count, 3);
    }

    #[test]
    fn home_expansion_only_for_a_leading_tilde_segment() {
        let home = Path::new("/home/u");
        assert_eq!(expand_home("~/r.yaml", Some(home)), "/home/u/r.yaml");
        assert_eq!(expand_home("~x/r.yaml", Some(home)), "~x/r.yaml");
        assert_eq!(expand_home("~/r.yaml", None), "~/r.yaml");
    }
}
