//! The selection policy as data: keyword lists, weights, role table and escalation profiles.
//!
//! The built-in policy is `default_policy.yaml`, compiled into the binary. A workspace can
//! override parts of it with `.gaffer/patterns.yaml` (or an explicit file): mappings merge key by
//! key over the built-in document, lists and scalars replace. The merged document is validated
//! and every error names the offending key path (e.g. `weights.sequential.positive.speed`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};

pub use super::phrases::{PhraseHits, PhraseIndex, Phrases};
use super::vocab::{Dimension, LaneRole, Pattern};

const DEFAULT_POLICY_YAML: &str = include_str!("default_policy.yaml");

/// File name of the workspace override, under `<workspace>/.gaffer/`.
pub const WORKSPACE_POLICY_FILE: &str = "patterns.yaml";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("policy key `{key}`: {message}")]
pub struct PolicyError {
    /// Dotted path of the offending key (`<file>` for whole-file problems).
    pub key: String,
    pub message: String,
}

impl PolicyError {
    fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            message: message.into(),
        }
    }
}

// ----- the YAML document ---------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyDoc {
    selector_version: String,
    keywords: BTreeMap<String, Phrases>,
    adjustment_cap: i64,
    weights: BTreeMap<String, WeightsDoc>,
    close_score_margin: i64,
    close_score_patterns: Vec<String>,
    simpler_pattern_order: Vec<String>,
    signals: SignalsDoc,
    roles: BTreeMap<String, RoleRule>,
    lane_roles: BTreeMap<String, String>,
    unknown_role_profile: String,
    escalation: Escalation,
    default_workstreams: Vec<String>,
    default_phases: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct WeightsDoc {
    #[serde(default)]
    positive: BTreeMap<String, i64>,
    #[serde(default)]
    negative: BTreeMap<String, i64>,
}

/// Phrase lists used outside the per-pattern keyword lists. All are substring tests on the
/// lower-cased request text.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Signals {
    /// Raise merge-conflict risk...
    pub merge_conflict: Phrases,
    /// ...unless one of these is present.
    pub merge_conflict_negation: Phrases,
    /// Keep a separable swarm's merge risk at 0.
    pub separability_disjoint: Phrases,
    /// Let a module swarm use its full parallel width.
    pub swarm_disjoint: Phrases,
    /// Make a lane code-heavy for patterns other than sequential and phased-assembly.
    pub code_heavy: Phrases,
    /// Make a sequential or phased-assembly lane code-heavy (any mention of code counts).
    pub code_mention: Phrases,
    pub browser: Phrases,
    pub safety_sensitive: Phrases,
    pub packaging: Phrases,
}
type SignalsDoc = Signals;

/// One role policy: the profile a lane prefers, what it falls back to, and its tools.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RoleRule {
    pub preferred_profile: String,
    #[serde(default)]
    pub fallback_profiles: Vec<String>,
    #[serde(default)]
    pub disable_reasoning: bool,
    #[serde(default)]
    pub toolsets: Vec<String>,
}

/// Profiles that escalation rules switch lanes to.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Escalation {
    pub premium_escalation_profile: String,
    pub module_swarm_default_profile: String,
    pub code_heavy_profile: String,
    pub premium_code_cap: i64,
}

// ----- the compiled policy -------------------------------------------------------------------

/// A list shared by every lane that uses it (toolsets are the same for a role in every plan),
/// with its JSON encoding made once per policy: every rendering of a lane copies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedList {
    items: Arc<[String]>,
    json: Arc<crate::json_out::Raw>,
}

impl SharedList {
    pub fn new(items: Vec<String>) -> Self {
        // A list of strings always encodes; `null` is only a guard.
        let json = crate::json_out::to_raw(&items).unwrap_or_else(|_| crate::json_out::Raw::null());
        SharedList {
            items: items.into(),
            json: Arc::new(json),
        }
    }
}

impl SharedList {
    /// The list as encoded JSON.
    pub fn json(&self) -> &str {
        self.json.get()
    }
}

impl Default for SharedList {
    /// The empty list, made once and shared.
    fn default() -> Self {
        static EMPTY: std::sync::LazyLock<SharedList> =
            std::sync::LazyLock::new(|| SharedList::new(Vec::new()));
        EMPTY.clone()
    }
}

impl std::ops::Deref for SharedList {
    type Target = [String];
    fn deref(&self) -> &[String] {
        &self.items
    }
}

impl Serialize for SharedList {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.json.serialize(s)
    }
}

/// Which escalation rule chose a lane's profile: a module swarm beats premium, premium beats
/// code-heavy, and code-heavy beats the role's own preferred profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Escalated {
    No,
    CodeHeavy,
    Premium,
    ModuleSwarm,
}

impl Escalated {
    pub const ALL: [Escalated; 4] = [
        Escalated::No,
        Escalated::CodeHeavy,
        Escalated::Premium,
        Escalated::ModuleSwarm,
    ];

    pub const fn index(self) -> usize {
        self as usize
    }
}

/// A lane's profile: selected, the fallbacks in order, the role's toolsets, and whether
/// reasoning is off. Shared by every lane that has it (cloning takes no allocation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneProfile {
    pub selected: Arc<str>,
    pub fallbacks: SharedList,
    pub toolsets: SharedList,
    pub disable_reasoning: bool,
}

/// The profile of a lane whose role policy is `rule` (none: the bare default profile) under
/// the escalation `how`: an escalation selects its own profile (a module swarm also drops the
/// role's fallbacks and turns reasoning off). Each fallback is kept at its first occurrence,
/// and never the selected profile.
fn resolve_lane_profile(
    rule: Option<&RoleRule>,
    how: Escalated,
    unknown_role_profile: &str,
    esc: &Escalation,
    toolsets: &SharedList,
) -> LaneProfile {
    let (preferred, role_fallbacks, role_reasoning_off) = match rule {
        Some(r) => (
            r.preferred_profile.as_str(),
            &r.fallback_profiles[..],
            r.disable_reasoning,
        ),
        None => (unknown_role_profile, &[][..], false),
    };
    let (selected, role_fallbacks, disable_reasoning) = match how {
        Escalated::ModuleSwarm => (&esc.module_swarm_default_profile[..], &[][..], true),
        Escalated::Premium => (
            &esc.premium_escalation_profile[..],
            role_fallbacks,
            role_reasoning_off,
        ),
        Escalated::CodeHeavy => (
            &esc.code_heavy_profile[..],
            role_fallbacks,
            role_reasoning_off,
        ),
        Escalated::No => (preferred, role_fallbacks, role_reasoning_off),
    };
    let mut fallbacks: Vec<String> = Vec::with_capacity(role_fallbacks.len());
    for f in role_fallbacks {
        if *f != selected && !fallbacks.contains(f) {
            fallbacks.push(f.clone());
        }
    }
    LaneProfile {
        selected: selected.into(),
        fallbacks: SharedList::new(fallbacks),
        toolsets: toolsets.clone(),
        disable_reasoning,
    }
}

/// The `role_rules` entry of a plan (static per policy).
#[derive(Debug, Clone, Serialize)]
pub struct RoleRuleView {
    pub preferred_profile: String,
    pub fallback_profiles: Vec<String>,
    pub model_policy: ModelPolicyView,
    pub toolsets: Vec<String>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct ModelPolicyView {
    pub disable_reasoning: bool,
}

/// A validated policy, with lookups indexed by the enums so selection does no string work.
#[derive(Debug, Clone)]
pub struct Policy {
    pub selector_version: String,
    /// Keyword lists indexed by [`Pattern::index`].
    pub keywords: [Phrases; 7],
    pub adjustment_cap: i64,
    /// Net weight (positive minus negative) of each dimension, indexed by pattern then dimension.
    pub weights: [[i64; 6]; 7],
    pub close_score_margin: i64,
    pub close_score_patterns: Vec<Pattern>,
    pub simpler_pattern_order: Vec<Pattern>,
    pub signals: Signals,
    /// Every keyword and signal phrase, for one-pass matching.
    pub phrase_index: PhraseIndex,
    /// Role policies by name.
    pub roles: BTreeMap<String, RoleRule>,
    /// Role-policy name for each lane role, indexed by [`LaneRole::index`].
    pub lane_roles: [String; 7],
    /// The profile of each lane role under each escalation, indexed by [`LaneRole::index`]
    /// then [`Escalated::index`]: the same in every plan, so resolved here once.
    pub lane_profiles: [[LaneProfile; 4]; 7],
    pub unknown_role_profile: String,
    pub escalation: Escalation,
    pub default_workstreams: Vec<String>,
    pub default_phases: Vec<String>,
    /// Precomputed `role_rules` and `profile_mapping` of every plan.
    pub role_rules_view: BTreeMap<String, RoleRuleView>,
    pub profile_mapping_view: BTreeMap<String, String>,
    /// The same two objects, pre-encoded: they are static, and every plan carries them.
    pub role_rules_json: Box<serde_json::value::RawValue>,
    pub profile_mapping_json: Box<serde_json::value::RawValue>,
}

impl Policy {
    /// The built-in policy (parsed once per process).
    pub fn builtin() -> Arc<Policy> {
        static BUILTIN: OnceLock<Arc<Policy>> = OnceLock::new();
        BUILTIN
            .get_or_init(|| {
                // The embedded document is part of the program and covered by a unit test.
                #[allow(clippy::expect_used)]
                let policy = Policy::from_yaml_override("").expect("the built-in policy is valid");
                Arc::new(policy)
            })
            .clone()
    }

    /// The built-in policy with `override_yaml` merged over it (empty text: no override).
    pub fn from_yaml_override(override_yaml: &str) -> Result<Policy, PolicyError> {
        let mut base: serde_yaml::Value = serde_yaml::from_str(DEFAULT_POLICY_YAML)
            .map_err(|e| PolicyError::new("<builtin>", e.to_string()))?;
        if !override_yaml.trim().is_empty() {
            let overlay: serde_yaml::Value = serde_yaml::from_str(override_yaml)
                .map_err(|e| PolicyError::new("<file>", format!("not valid YAML: {e}")))?;
            match overlay {
                serde_yaml::Value::Null => {}
                serde_yaml::Value::Mapping(_) => merge(&mut base, overlay),
                _ => {
                    return Err(PolicyError::new(
                        "<file>",
                        "the policy must be a YAML mapping",
                    ));
                }
            }
        }
        let doc: PolicyDoc = serde_path_to_error::deserialize(base).map_err(|e| {
            let key = e.path().to_string();
            PolicyError::new(
                if key == "." { "<file>".to_owned() } else { key },
                e.inner().to_string(),
            )
        })?;
        compile(doc)
    }

    /// Load the policy for a workspace: `explicit` if given (must exist), else
    /// `<workspace>/.gaffer/patterns.yaml` if present, else the built-in policy.
    pub fn load(workspace: &Path, explicit: Option<&Path>) -> Result<Arc<Policy>, PolicyError> {
        let path: PathBuf = match explicit {
            Some(p) => p.to_path_buf(),
            None => {
                let candidate = workspace.join(".gaffer").join(WORKSPACE_POLICY_FILE);
                if !candidate.is_file() {
                    return Ok(Policy::builtin());
                }
                candidate
            }
        };
        let text = crate::util::read_regular_file(&path, Some(crate::util::CONFIG_FILE_LIMIT))
            .and_then(|b| String::from_utf8(b).map_err(std::io::Error::other))
            .map_err(|e| {
                PolicyError::new("<file>", format!("cannot read {}: {e}", path.display()))
            })?;
        Policy::from_yaml_override(&text).map(Arc::new)
    }

    pub fn keywords(&self, p: Pattern) -> &Phrases {
        &self.keywords[p.index()]
    }

    pub fn weight(&self, p: Pattern, d: Dimension) -> i64 {
        self.weights[p.index()][d.index()]
    }

    /// The role policy of a lane role, or `None` when the table has no entry for it.
    pub fn role_rule(&self, role: LaneRole) -> Option<&RoleRule> {
        self.roles.get(&self.lane_roles[role.index()])
    }

    /// The profile a lane of `role` gets under the escalation `how`.
    pub fn lane_profile(&self, role: LaneRole, how: Escalated) -> &LaneProfile {
        &self.lane_profiles[role.index()][how.index()]
    }
}

/// Merge `overlay` into `base`: mappings key by key, everything else replaced.
fn merge(base: &mut serde_yaml::Value, overlay: serde_yaml::Value) {
    match (base, overlay) {
        (serde_yaml::Value::Mapping(b), serde_yaml::Value::Mapping(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(existing) if existing.is_mapping() && v.is_mapping() => merge(existing, v),
                    _ => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (slot, v) => *slot = v,
    }
}

fn parse_pattern(key: &str, value: &str) -> Result<Pattern, PolicyError> {
    Pattern::parse(value).ok_or_else(|| PolicyError::new(key, format!("unknown pattern {value:?}")))
}

fn parse_base_list(key: &str, values: &[String]) -> Result<Vec<Pattern>, PolicyError> {
    values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let p = parse_pattern(&format!("{key}[{i}]"), v)?;
            if p.is_base() {
                Ok(p)
            } else {
                Err(PolicyError::new(
                    format!("{key}[{i}]"),
                    "twin-inspection is an overlay, not a base pattern",
                ))
            }
        })
        .collect()
}

fn check_phrases(key: &str, phrases: &[String]) -> Result<(), PolicyError> {
    for (i, phrase) in phrases.iter().enumerate() {
        if phrase.trim().is_empty() {
            return Err(PolicyError::new(
                format!("{key}[{i}]"),
                "phrases must not be blank",
            ));
        }
        if phrase.to_lowercase() != *phrase {
            // The text they are matched against is lower-cased, so this phrase could never hit.
            return Err(PolicyError::new(
                format!("{key}[{i}]"),
                format!("{phrase:?} must be lower-case"),
            ));
        }
    }
    Ok(())
}

fn compile(doc: PolicyDoc) -> Result<Policy, PolicyError> {
    let mut keywords = compile_keywords(doc.keywords)?;
    if doc.adjustment_cap < 0 {
        return Err(PolicyError::new("adjustment_cap", "must not be negative"));
    }
    let weights = compile_weights(&doc.weights)?;
    if doc.close_score_margin < 0 {
        return Err(PolicyError::new(
            "close_score_margin",
            "must not be negative",
        ));
    }
    let close_score_patterns = parse_base_list("close_score_patterns", &doc.close_score_patterns)?;
    let simpler_pattern_order =
        parse_base_list("simpler_pattern_order", &doc.simpler_pattern_order)?;
    if let Some(p) = Pattern::BASE
        .into_iter()
        .find(|p| !simpler_pattern_order.contains(p))
    {
        return Err(PolicyError::new(
            "simpler_pattern_order",
            format!("must list {}", p.as_str()),
        ));
    }
    let mut signals = doc.signals;
    for (name, list) in signal_lists(&mut signals) {
        check_phrases(&format!("signals.{name}"), &list.words)?;
    }
    let lane_roles = compile_lane_roles(&doc.roles, &doc.lane_roles)?;
    check_profiles(&doc.unknown_role_profile, &doc.escalation)?;
    for (key, list) in [
        ("default_workstreams", &doc.default_workstreams),
        ("default_phases", &doc.default_phases),
    ] {
        if list.is_empty() {
            return Err(PolicyError::new(key, "must list at least one name"));
        }
    }

    let (role_rules_view, profile_mapping_view) = role_views(&doc.roles);
    let encode_err =
        |e: serde_json::Error| PolicyError::new("roles", format!("cannot encode: {e}"));
    let role_rules_json = serde_json::value::to_raw_value(&role_rules_view).map_err(encode_err)?;
    let profile_mapping_json =
        serde_json::value::to_raw_value(&profile_mapping_view).map_err(encode_err)?;
    let lane_profiles: [[LaneProfile; 4]; 7] = std::array::from_fn(|i| {
        let rule = doc.roles.get(&lane_roles[i]);
        let toolsets = rule
            .map(|r| SharedList::new(r.toolsets.clone()))
            .unwrap_or_default();
        Escalated::ALL.map(|how| {
            resolve_lane_profile(
                rule,
                how,
                &doc.unknown_role_profile,
                &doc.escalation,
                &toolsets,
            )
        })
    });
    let phrase_index = PhraseIndex::build(
        keywords
            .iter_mut()
            .chain(signal_lists(&mut signals).map(|(_, list)| list)),
    );

    Ok(Policy {
        selector_version: doc.selector_version,
        keywords,
        adjustment_cap: doc.adjustment_cap,
        weights,
        close_score_margin: doc.close_score_margin,
        close_score_patterns,
        simpler_pattern_order,
        signals,
        phrase_index,
        roles: doc.roles,
        lane_roles,
        lane_profiles,
        unknown_role_profile: doc.unknown_role_profile,
        escalation: doc.escalation,
        default_workstreams: doc.default_workstreams,
        default_phases: doc.default_phases,
        role_rules_view,
        profile_mapping_view,
        role_rules_json,
        profile_mapping_json,
    })
}

/// Keyword lists by pattern: every pattern has one, each phrase lower-case and not blank.
fn compile_keywords(doc: BTreeMap<String, Phrases>) -> Result<[Phrases; 7], PolicyError> {
    let mut keywords: [Phrases; 7] = std::array::from_fn(|_| Phrases::from(Vec::new()));
    let mut seen = [false; 7];
    for (name, list) in doc {
        let key = format!("keywords.{name}");
        let p = parse_pattern(&key, &name)?;
        check_phrases(&key, &list.words)?;
        seen[p.index()] = true;
        keywords[p.index()] = list;
    }
    if let Some(p) = Pattern::ALL.into_iter().find(|p| !seen[p.index()]) {
        return Err(PolicyError::new(
            format!("keywords.{}", p.as_str()),
            "missing keyword list",
        ));
    }
    Ok(keywords)
}

/// Net weight per base pattern and dimension (positive minus negative), each from 0 to 1000.
fn compile_weights(doc: &BTreeMap<String, WeightsDoc>) -> Result<[[i64; 6]; 7], PolicyError> {
    let mut weights = [[0i64; 6]; 7];
    let mut weighted = [false; 7];
    for (name, w) in doc {
        let key = format!("weights.{name}");
        let p = parse_pattern(&key, name)?;
        if !p.is_base() {
            return Err(PolicyError::new(key, "only base patterns are scored"));
        }
        for (sign, part, map) in [(1, "positive", &w.positive), (-1, "negative", &w.negative)] {
            for (dim, value) in map {
                let dkey = format!("{key}.{part}.{dim}");
                let d = Dimension::parse(dim)
                    .ok_or_else(|| PolicyError::new(&dkey, "unknown dimension"))?;
                if !(0..=1000).contains(value) {
                    return Err(PolicyError::new(dkey, "weights must be between 0 and 1000"));
                }
                weights[p.index()][d.index()] += sign * value;
            }
        }
        weighted[p.index()] = true;
    }
    if let Some(p) = Pattern::BASE.into_iter().find(|p| !weighted[p.index()]) {
        return Err(PolicyError::new(
            format!("weights.{}", p.as_str()),
            "missing weights",
        ));
    }
    Ok(weights)
}

/// Every signal phrase list with its key under `signals`.
fn signal_lists(signals: &mut Signals) -> impl Iterator<Item = (&'static str, &mut Phrases)> {
    let Signals {
        merge_conflict,
        merge_conflict_negation,
        separability_disjoint,
        swarm_disjoint,
        code_heavy,
        code_mention,
        browser,
        safety_sensitive,
        packaging,
    } = signals;
    [
        ("merge_conflict", merge_conflict),
        ("merge_conflict_negation", merge_conflict_negation),
        ("separability_disjoint", separability_disjoint),
        ("swarm_disjoint", swarm_disjoint),
        ("code_heavy", code_heavy),
        ("code_mention", code_mention),
        ("browser", browser),
        ("safety_sensitive", safety_sensitive),
        ("packaging", packaging),
    ]
    .into_iter()
}

/// The role policy each lane role uses (every lane role named; every role with a profile).
fn compile_lane_roles(
    roles: &BTreeMap<String, RoleRule>,
    doc: &BTreeMap<String, String>,
) -> Result<[String; 7], PolicyError> {
    for (name, rule) in roles {
        if rule.preferred_profile.trim().is_empty() {
            return Err(PolicyError::new(
                format!("roles.{name}.preferred_profile"),
                "must not be blank",
            ));
        }
    }
    let mut lane_roles: [String; 7] = Default::default();
    for (name, target) in doc {
        let role = LaneRole::parse(name)
            .ok_or_else(|| PolicyError::new(format!("lane_roles.{name}"), "unknown lane role"))?;
        lane_roles[role.index()] = target.clone();
    }
    if let Some(role) = LaneRole::ALL
        .into_iter()
        .find(|r| lane_roles[r.index()].is_empty())
    {
        return Err(PolicyError::new(
            format!("lane_roles.{}", role.as_str()),
            "missing role policy name",
        ));
    }
    Ok(lane_roles)
}

/// The fallback and escalation profiles are named.
fn check_profiles(unknown_role_profile: &str, escalation: &Escalation) -> Result<(), PolicyError> {
    for (key, value) in [
        ("unknown_role_profile", unknown_role_profile),
        (
            "escalation.premium_escalation_profile",
            &escalation.premium_escalation_profile,
        ),
        (
            "escalation.module_swarm_default_profile",
            &escalation.module_swarm_default_profile,
        ),
        (
            "escalation.code_heavy_profile",
            &escalation.code_heavy_profile,
        ),
    ] {
        if value.trim().is_empty() {
            return Err(PolicyError::new(key, "must not be blank"));
        }
    }
    Ok(())
}

/// The role rules as a selection reports them, and each role's preferred profile.
fn role_views(
    roles: &BTreeMap<String, RoleRule>,
) -> (BTreeMap<String, RoleRuleView>, BTreeMap<String, String>) {
    let rules = roles
        .iter()
        .map(|(name, r)| {
            (
                name.clone(),
                RoleRuleView {
                    preferred_profile: r.preferred_profile.clone(),
                    fallback_profiles: r.fallback_profiles.clone(),
                    model_policy: ModelPolicyView {
                        disable_reasoning: r.disable_reasoning,
                    },
                    toolsets: r.toolsets.clone(),
                },
            )
        })
        .collect();
    let mapping = roles
        .iter()
        .map(|(name, r)| (name.clone(), r.preferred_profile.clone()))
        .collect();
    (rules, mapping)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_policy_loads_with_the_reference_numbers() {
        let p = Policy::builtin();
        assert_eq!(p.selector_version, "2026-05-03-policy-port");
        assert_eq!(p.weight(Pattern::Sequential, Dimension::Singularity), 3);
        assert_eq!(p.weight(Pattern::ModuleSwarm, Dimension::MergeRisk), -3);
        assert_eq!(p.keywords(Pattern::BlueprintFanout).len(), 8);
        assert_eq!(p.role_rules_view.len(), 6);
        assert!(p.role_rule(LaneRole::RecoveryWorker).is_none());
        assert_eq!(
            p.role_rule(LaneRole::Reviewer)
                .map(|r| r.preferred_profile.as_str()),
            Some("worker-review-premium")
        );
    }

    /// The table resolved with the policy, for a role whose fallbacks repeat and hold every
    /// escalation profile: each escalation selects its own profile and drops it from the
    /// fallbacks, which keep their first order; a role without a policy gets the default.
    #[test]
    fn lane_profiles_are_resolved_for_every_role_and_escalation() {
        let p = Policy::from_yaml_override(
            "roles:\n  code-worker:\n    preferred_profile: own\n    fallback_profiles: [b, gp, a, b, cw, own]\n    disable_reasoning: true\n    toolsets: [t1]\nescalation:\n  premium_escalation_profile: gp\n  code_heavy_profile: cw\n  module_swarm_default_profile: swarm\n",
        )
        .unwrap();
        let role = LaneRole::ALL
            .into_iter()
            .find(|r| p.lane_roles[r.index()] == "code-worker")
            .unwrap();
        let got = |how| {
            let prof = p.lane_profile(role, how);
            (
                prof.selected.to_string(),
                prof.fallbacks.to_vec(),
                prof.toolsets.to_vec(),
                prof.disable_reasoning,
            )
        };
        let list = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            got(Escalated::No),
            (
                "own".into(),
                list(&["b", "gp", "a", "cw"]),
                list(&["t1"]),
                true
            )
        );
        assert_eq!(
            got(Escalated::Premium),
            (
                "gp".into(),
                list(&["b", "a", "cw", "own"]),
                list(&["t1"]),
                true
            )
        );
        assert_eq!(
            got(Escalated::CodeHeavy),
            (
                "cw".into(),
                list(&["b", "gp", "a", "own"]),
                list(&["t1"]),
                true
            )
        );
        assert_eq!(
            got(Escalated::ModuleSwarm),
            ("swarm".into(), vec![], list(&["t1"]), true)
        );
        for (how, selected, reasoning_off) in [
            (Escalated::No, p.unknown_role_profile.as_str(), false),
            (Escalated::CodeHeavy, "cw", false),
            (Escalated::Premium, "gp", false),
            (Escalated::ModuleSwarm, "swarm", true),
        ] {
            // A role without a role policy: the default profile, or the escalation's.
            let none = p.lane_profile(LaneRole::RecoveryWorker, how);
            assert_eq!(
                (&*none.selected, none.disable_reasoning),
                (selected, reasoning_off)
            );
            assert!(none.toolsets.is_empty() && none.fallbacks.is_empty());
            // The pre-encoded fallbacks are what encoding the list gives.
            let prof = p.lane_profile(role, how);
            assert_eq!(
                prof.fallbacks.json(),
                serde_json::to_string(&prof.fallbacks.to_vec()).unwrap()
            );
        }
    }

    #[test]
    fn overrides_merge_and_errors_name_the_key() {
        let p = Policy::from_yaml_override("keywords:\n  sequential: [tiny]\n").unwrap();
        assert_eq!(p.keywords(Pattern::Sequential).words, ["tiny"]);
        assert_eq!(p.keywords(Pattern::ModuleSwarm).len(), 7);

        let key = |y: &str| Policy::from_yaml_override(y).unwrap_err().key;
        assert_eq!(
            key("weights:\n  sequential:\n    positive: {speed: 1}\n"),
            "weights.sequential.positive.speed"
        );
        assert_eq!(key("keywords:\n  turbo: [x]\n"), "keywords.turbo");
        assert_eq!(
            key("keywords:\n  sequential: [Tiny]\n"),
            "keywords.sequential[0]"
        );
        assert_eq!(key("adjustment_cap: lots\n"), "adjustment_cap");
        assert_eq!(
            key("escalation:\n  code_heavy_profile: ''\n"),
            "escalation.code_heavy_profile"
        );
        assert_eq!(
            key("lane_roles:\n  painter: code-worker\n"),
            "lane_roles.painter"
        );
        assert_eq!(key("signals:\n  browser: [Chrome]\n"), "signals.browser[0]");
        assert_eq!(
            key("roles:\n  code-worker:\n    preferred_profile: ' '\n"),
            "roles.code-worker.preferred_profile"
        );
        assert_eq!(key("default_phases: []\n"), "default_phases");
        assert_eq!(
            key("simpler_pattern_order: [sequential]\n"),
            "simpler_pattern_order"
        );
        assert_eq!(key("close_score_margin: -1\n"), "close_score_margin");
        assert!(
            key("surprise: 1\n").contains("<file>") || key("surprise: 1\n").contains("surprise")
        );
        assert_eq!(key("- 1\n"), "<file>");
    }

    #[test]
    fn workspace_override_file_is_used_when_present() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            Policy::load(dir.path(), None).unwrap().close_score_margin,
            2
        );
        std::fs::create_dir_all(dir.path().join(".gaffer")).unwrap();
        std::fs::write(
            dir.path().join(".gaffer/patterns.yaml"),
            "close_score_margin: 5\n",
        )
        .unwrap();
        assert_eq!(
            Policy::load(dir.path(), None).unwrap().close_score_margin,
            5
        );
        let missing = dir.path().join("nope.yaml");
        assert_eq!(
            Policy::load(dir.path(), Some(&missing)).unwrap_err().key,
            "<file>"
        );
    }
}
