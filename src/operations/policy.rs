//! Workspace policy (`.gaffer/policy.yaml`): rules that allow, send for approval, or deny an
//! operation, decided with precedence deny > active grant > allow > request > no_match.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub const POLICY_FILE: &str = "policy.yaml";

/// What the adapter says about a plan, for policy matching. Every value is a set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default, JsonSchema)]
pub struct Classification {
    pub target_kind: String,
    #[serde(default)]
    pub fields: BTreeMap<String, BTreeSet<String>>,
    #[serde(default)]
    pub attrs: BTreeMap<String, BTreeSet<String>>,
    /// Fields an allow rule must name to match at all (a worker's secrets): a broad rule never
    /// covers them by omission.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub must_name: BTreeSet<String>,
    /// A command's argv in order, for rules that match arguments by position.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyRequest<'a> {
    pub client: &'a str,
    pub operation: &'a str,
    pub class: &'a Classification,
    /// The scope of the plan lane the client is, when this process runs that lane (a lane's
    /// scope is never read from a record).
    pub lane_scope: Option<&'a [String]>,
}

/// `lane_scope` on a rule: whether the target's paths lie inside the submitting lane's scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LaneScope {
    /// Every path the plan names lies inside the lane's scope.
    Inside,
    /// Some path lies outside it (or the plan names no path).
    Outside,
}

/// Whether `path` lies in one of a lane's scope entries. An entry with a glob character is a
/// glob; a plain entry names a directory (or file) and everything beneath it.
pub fn in_lane_scope(scope: &[String], path: &str) -> bool {
    scope.iter().any(|entry| {
        let entry = entry.trim_end_matches('/');
        if entry.contains(['*', '?']) {
            glob_match(entry, path)
        } else {
            path == entry
                || path
                    .strip_prefix(entry)
                    .is_some_and(|rest| rest.starts_with('/'))
        }
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    Allow,
    Request,
    Deny,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum GrantMode {
    /// One approval authorises exactly one execution.
    Execution,
    /// One approval authorises up to `max_uses` matching operations until it expires.
    Window,
}

/// Approval bounds a request rule attaches to the approvals it creates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GrantPolicy {
    pub mode: GrantMode,
    /// How long an approval stays usable once approved.
    pub default_minutes: u32,
    pub max_minutes: u32,
    /// How long a request waits for a human before it expires.
    pub request_ttl_minutes: u32,
    #[serde(default = "one")]
    pub default_max_uses: u32,
    /// `null` means unlimited (window mode only).
    #[serde(default = "some_one")]
    pub max_uses: Option<u32>,
}

fn one() -> u32 {
    1
}
fn some_one() -> Option<u32> {
    Some(1)
}

impl GrantPolicy {
    /// Bounds used when the workspace has no policy file: every operation waits for a human.
    pub fn default_for_missing_policy() -> GrantPolicy {
        GrantPolicy {
            mode: GrantMode::Execution,
            default_minutes: 10,
            max_minutes: 60,
            request_ttl_minutes: 30,
            default_max_uses: 1,
            max_uses: Some(1),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetMatcher {
    pub kind: String,
    #[serde(default)]
    pub fields: BTreeMap<String, Vec<String>>,
    /// A command's arguments by position (see [`argv_match`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawRule")]
pub struct Rule {
    pub id: String,
    pub effect: Effect,
    pub clients: Vec<String>,
    pub operations: Vec<String>,
    pub targets: Vec<TargetMatcher>,
    pub attrs: BTreeMap<String, Vec<String>>,
    pub grant_policy: Option<GrantPolicy>,
    pub description: Option<String>,
    pub lane_scope: Option<LaneScope>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    id: String,
    effect: Effect,
    #[serde(default)]
    clients: Option<Vec<String>>,
    #[serde(default)]
    operations: Option<Vec<String>>,
    #[serde(default)]
    targets: Vec<TargetMatcher>,
    #[serde(default)]
    attrs: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    grant_policy: Option<GrantPolicy>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    lane_scope: Option<LaneScope>,
}

impl TryFrom<RawRule> for Rule {
    type Error = String;
    fn try_from(r: RawRule) -> Result<Rule, String> {
        if r.id.trim().is_empty() {
            return Err("rule id must not be empty".into());
        }
        match (r.effect, &r.grant_policy) {
            (Effect::Request, None) => {
                return Err(format!(
                    "rule {:?}: a request rule needs grant_policy",
                    r.id
                ));
            }
            (Effect::Allow | Effect::Deny, Some(_)) => {
                return Err(format!(
                    "rule {:?}: grant_policy is only allowed on request rules",
                    r.id
                ));
            }
            _ => {}
        }
        if let Some(gp) = &r.grant_policy {
            for (name, v) in [
                ("default_minutes", gp.default_minutes),
                ("max_minutes", gp.max_minutes),
                ("request_ttl_minutes", gp.request_ttl_minutes),
                ("default_max_uses", gp.default_max_uses),
            ] {
                if v == 0 {
                    return Err(format!(
                        "rule {:?}: grant_policy.{name} must be positive",
                        r.id
                    ));
                }
            }
            if gp.max_uses == Some(0) {
                return Err(format!(
                    "rule {:?}: grant_policy.max_uses must be positive or null",
                    r.id
                ));
            }
        }
        // No `clients` means everyone, plan lanes (`plan/lane`) included.
        let clients = r.clients.unwrap_or_else(|| vec!["**".into()]);
        let operations = r.operations.unwrap_or_else(|| vec!["*".into()]);
        for (what, list) in [("clients", &clients), ("operations", &operations)] {
            if list.is_empty() || list.iter().any(|p| p.is_empty()) {
                return Err(format!(
                    "rule {:?}: {what} must list at least one non-empty pattern",
                    r.id
                ));
            }
        }
        for t in &r.targets {
            if t.kind.is_empty() {
                return Err(format!("rule {:?}: targets[].kind must not be empty", r.id));
            }
            if t.argv.as_ref().is_some_and(Vec::is_empty) {
                return Err(format!(
                    "rule {:?}: targets[].argv needs at least the program's pattern",
                    r.id
                ));
            }
            if t.fields.values().any(|v| v.is_empty()) {
                return Err(format!(
                    "rule {:?}: target field matchers need at least one pattern",
                    r.id
                ));
            }
        }
        if r.attrs.values().any(|v| v.is_empty()) {
            return Err(format!(
                "rule {:?}: attrs matchers need at least one pattern",
                r.id
            ));
        }
        Ok(Rule {
            id: r.id,
            effect: r.effect,
            clients,
            operations,
            targets: r.targets,
            attrs: r.attrs,
            grant_policy: r.grant_policy,
            description: r.description,
            lane_scope: r.lane_scope,
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    #[serde(default)]
    rules: Vec<Rule>,
    #[serde(default)]
    sandbox: SandboxSwitch,
}

/// `sandbox: on` (the default); `sandbox: shared_proc`: sandboxed, the host's `/proc` accepted
/// where the kernel refuses a sandbox its own (containers); `sandbox: off`: start processes
/// unconfined, for kernels without Landlock or user namespaces (`gaffer doctor` says which).
#[derive(Deserialize, Default, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum SandboxSwitch {
    #[default]
    On,
    SharedProc,
    Off,
}

/// A parse or validation failure, located in the file.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{}:{}: {}: {}", file.display(), line.map(|l| l.to_string()).unwrap_or_else(|| "?".into()), key, message)]
pub struct PolicyError {
    pub file: PathBuf,
    pub line: Option<usize>,
    /// Path of the offending key, e.g. `rules[2].effect`.
    pub key: String,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Policy {
    /// `None` when the workspace has no policy file.
    pub rules: Option<Vec<Rule>>,
    /// The file is not signed by the operator: only its deny rules were kept, and every
    /// other operation waits for a human with the default bounds.
    pub untrusted: bool,
    /// Set when the trusted policy cannot be had (its kept bytes are missing or unreadable):
    /// every operation is denied, so no trusted deny rule is ever lost.
    pub refuse_all: Option<String>,
    /// `sandbox: off` in the file; counts only once the operator trusted it.
    pub sandbox: crate::sandbox::Setting,
}

/// An approved, still usable approval that acts as an extra allow rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveGrant {
    pub id: String,
    pub client: String,
    pub operation: String,
    pub class: Classification,
    pub expires_at_ms: u64,
    /// `None` = unlimited.
    pub uses_left: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DecisionEffect {
    Allow,
    Request,
    Deny,
    NoMatch,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Decision {
    pub effect: DecisionEffect,
    /// `policy_denied`, `grant_allowed`, `policy_allowed`, `approval_required`,
    /// `no_matching_rule`, `no_policy_file` or `untrusted_policy` (the file is not signed by
    /// the operator, so only its deny rules count).
    pub reason: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rule_ids: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant_policy: Option<GrantPolicy>,
}

impl Policy {
    /// Loads `<gaffer_dir>/policy.yaml`; a missing file is not an error.
    pub fn load(gaffer_dir: &Path) -> Result<Policy, PolicyError> {
        let file = gaffer_dir.join(POLICY_FILE);
        let read = crate::util::read_regular_file(&file, Some(crate::util::CONFIG_FILE_LIMIT))
            .and_then(|b| String::from_utf8(b).map_err(std::io::Error::other));
        match read {
            Ok(text) => Policy::parse(&text, &file),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Policy::default()),
            Err(e) => Err(PolicyError {
                file,
                line: None,
                key: String::new(),
                message: format!("cannot read: {e}"),
            }),
        }
    }

    pub fn parse(text: &str, file: &Path) -> Result<Policy, PolicyError> {
        let de = serde_yaml::Deserializer::from_str(text);
        let parsed: PolicyFile = serde_path_to_error::deserialize(de).map_err(|e| {
            let key = e.path().to_string();
            let inner = e.into_inner();
            PolicyError {
                file: file.to_path_buf(),
                line: inner.location().map(|l| l.line()),
                key: if key == "." { String::new() } else { key },
                message: strip_location(&inner.to_string()),
            }
        })?;
        let mut seen = BTreeSet::new();
        for (i, rule) in parsed.rules.iter().enumerate() {
            if !seen.insert(rule.id.clone()) {
                return Err(PolicyError {
                    file: file.to_path_buf(),
                    line: line_of_nth_id(text, &rule.id, 2),
                    key: format!("rules[{i}].id"),
                    message: format!("duplicate rule id {:?}", rule.id),
                });
            }
        }
        Ok(Policy {
            rules: Some(parsed.rules),
            untrusted: false,
            refuse_all: None,
            sandbox: match parsed.sandbox {
                SandboxSwitch::On => crate::sandbox::Setting::Required,
                SandboxSwitch::SharedProc => crate::sandbox::Setting::SharedProc,
                SandboxSwitch::Off => crate::sandbox::Setting::Off,
            },
        })
    }

    /// Allow rules that let `command.run` run a program with any arguments: no target, or a
    /// `command` target without `argv` patterns (`program: [git]` is arbitrary code).
    pub fn broad_command_rules(&self) -> Vec<String> {
        let runs = |r: &Rule| r.operations.iter().any(|o| glob_match(o, "command.run"));
        let open = |t: &TargetMatcher| glob_match(&t.kind, "command") && t.argv.is_none();
        self.rules
            .iter()
            .flatten()
            .filter(|r| r.effect == Effect::Allow && runs(r))
            .filter(|r| r.targets.is_empty() || r.targets.iter().any(open))
            .map(|r| r.id.clone())
            .collect()
    }

    /// What a policy the operator has not trusted may still do: deny rules only restrict, so
    /// they stay; allow rules and request bounds could have been written by the agent, so
    /// they go.
    pub fn into_untrusted(self) -> Policy {
        let denies = self
            .rules
            .unwrap_or_default()
            .into_iter()
            .filter(|r| r.effect == Effect::Deny)
            .collect();
        // Turning the sandbox off is never a deny: an untrusted file cannot do it.
        Policy {
            rules: Some(denies),
            untrusted: true,
            refuse_all: None,
            sandbox: crate::sandbox::Setting::Required,
        }
    }

    /// A policy that denies everything, saying why.
    pub fn refuse_all(why: impl Into<String>) -> Policy {
        Policy {
            rules: Some(vec![]),
            untrusted: false,
            refuse_all: Some(why.into()),
            sandbox: crate::sandbox::Setting::Required,
        }
    }

    /// Adds `other`'s deny rules (from an untrusted file: denies only ever restrict).
    pub fn with_denies_of(mut self, other: Policy) -> Policy {
        let mut seen: BTreeSet<String> =
            self.rules.iter().flatten().map(|r| r.id.clone()).collect();
        let extra: Vec<Rule> = other
            .rules
            .unwrap_or_default()
            .into_iter()
            .filter(|r| r.effect == Effect::Deny)
            .map(|mut r| {
                if !seen.insert(r.id.clone()) {
                    r.id = format!("untrusted:{}", r.id);
                }
                r
            })
            .collect();
        if !extra.is_empty() {
            self.rules.get_or_insert_with(Vec::new).extend(extra);
        }
        self
    }

    pub fn decide(&self, req: &PolicyRequest<'_>, grants: &[ActiveGrant], now_ms: u64) -> Decision {
        if let Some(why) = &self.refuse_all {
            return Decision {
                effect: DecisionEffect::Deny,
                reason: "policy_unavailable".into(),
                rule_ids: vec![why.clone()],
                grant_id: None,
                grant_policy: None,
            };
        }
        let Some(rules) = &self.rules else {
            // Without a policy file a human decides everything; an active grant still counts.
            if let Some(g) = grants.iter().find(|g| grant_covers(g, req, now_ms)) {
                return grant_decision(g);
            }
            return Decision {
                effect: DecisionEffect::Request,
                reason: "no_policy_file".into(),
                rule_ids: vec![],
                grant_id: None,
                grant_policy: Some(GrantPolicy::default_for_missing_policy()),
            };
        };
        let matching = |effect: Effect| -> Vec<&Rule> {
            rules
                .iter()
                .filter(|r| r.effect == effect && rule_matches(r, req))
                .collect()
        };
        let denies = matching(Effect::Deny);
        if !denies.is_empty() {
            return Decision {
                effect: DecisionEffect::Deny,
                reason: "policy_denied".into(),
                rule_ids: denies.iter().map(|r| r.id.clone()).collect(),
                grant_id: None,
                grant_policy: None,
            };
        }
        if let Some(g) = grants.iter().find(|g| grant_covers(g, req, now_ms)) {
            return grant_decision(g);
        }
        if self.untrusted {
            return Decision {
                effect: DecisionEffect::Request,
                reason: "untrusted_policy".into(),
                rule_ids: vec![],
                grant_id: None,
                grant_policy: Some(GrantPolicy::default_for_missing_policy()),
            };
        }
        let allows = matching(Effect::Allow);
        if !allows.is_empty() {
            return Decision {
                effect: DecisionEffect::Allow,
                reason: "policy_allowed".into(),
                rule_ids: allows.iter().map(|r| r.id.clone()).collect(),
                grant_id: None,
                grant_policy: None,
            };
        }
        let requests = matching(Effect::Request);
        if let Some(first) = requests.first() {
            return Decision {
                effect: DecisionEffect::Request,
                reason: "approval_required".into(),
                rule_ids: requests.iter().map(|r| r.id.clone()).collect(),
                grant_id: None,
                grant_policy: first.grant_policy.clone(),
            };
        }
        Decision {
            effect: DecisionEffect::NoMatch,
            reason: "no_matching_rule".into(),
            rule_ids: vec![],
            grant_id: None,
            grant_policy: None,
        }
    }
}

fn grant_decision(g: &ActiveGrant) -> Decision {
    Decision {
        effect: DecisionEffect::Allow,
        reason: "grant_allowed".into(),
        rule_ids: vec![],
        grant_id: Some(g.id.clone()),
        grant_policy: None,
    }
}

/// serde_yaml appends " at line X column Y"; the location is reported separately.
fn strip_location(msg: &str) -> String {
    match msg.find(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg.to_string(),
    }
}

fn line_of_nth_id(text: &str, id: &str, nth: usize) -> Option<usize> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| {
            let t = l.trim_start().trim_start_matches("- ").trim_start();
            t.strip_prefix("id:")
                .map(|v| v.trim().trim_matches(|c| c == '"' || c == '\'') == id)
                .unwrap_or(false)
        })
        .nth(nth - 1)
        .map(|(i, _)| i + 1)
}

fn rule_matches(rule: &Rule, req: &PolicyRequest<'_>) -> bool {
    let any_of = |patterns: &[String], value: &str| patterns.iter().any(|p| glob_match(p, value));
    // An unauthenticated connection is matched only by allow and request rules that name it
    // (no glob grants it anything); deny rules reach it like anyone else.
    let client_ok = if req.client == crate::clients::ANONYMOUS && rule.effect != Effect::Deny {
        rule.clients.iter().any(|p| p == crate::clients::ANONYMOUS)
    } else {
        any_of(&rule.clients, req.client)
    };
    if !client_ok || !any_of(&rule.operations, req.operation) {
        return false;
    }
    if let Some(want) = rule.lane_scope {
        // Only a lane this process runs has a scope; anyone else matches neither.
        let Some(scope) = req.lane_scope else {
            return false;
        };
        let paths = req.class.fields.get("path");
        let inside =
            paths.is_some_and(|ps| !ps.is_empty() && ps.iter().all(|p| in_lane_scope(scope, p)));
        if inside != (want == LaneScope::Inside) {
            return false;
        }
    }
    // Allow and request rules need every value to match; a deny rule fires on any value.
    let every = rule.effect != Effect::Deny;
    let values_match = |patterns: &[String], values: Option<&BTreeSet<String>>| -> bool {
        match values {
            None => false,
            Some(vs) if vs.is_empty() => false,
            Some(vs) if every => vs.iter().all(|v| any_of(patterns, v)),
            Some(vs) => vs.iter().any(|v| any_of(patterns, v)),
        }
    };
    // An allow rule covers a plan's `must_name` fields (or attrs) only by naming them; a
    // request rule needs not, as the operator then decides from a plan that names them.
    let allow = rule.effect == Effect::Allow;
    let names =
        |t: Option<&TargetMatcher>| {
            !allow
                || req.class.must_name.iter().all(|n| {
                    rule.attrs.contains_key(n) || t.is_some_and(|t| t.fields.contains_key(n))
                })
        };
    if rule.targets.is_empty() && !names(None) {
        return false;
    }
    let argv_ok = |t: &TargetMatcher| match (&t.argv, &req.class.argv) {
        (None, _) => true,
        (Some(p), Some(argv)) => argv_match(p, argv),
        (Some(_), None) => false,
    };
    if !rule.targets.is_empty() {
        let target_ok = rule.targets.iter().any(|t| {
            glob_match(&t.kind, &req.class.target_kind)
                && names(Some(t))
                && argv_ok(t)
                && t.fields
                    .iter()
                    .all(|(name, pats)| values_match(pats, req.class.fields.get(name)))
        });
        if !target_ok {
            return false;
        }
    }
    rule.attrs
        .iter()
        .all(|(name, pats)| values_match(pats, req.class.attrs.get(name)))
}

fn grant_covers(g: &ActiveGrant, req: &PolicyRequest<'_>, now_ms: u64) -> bool {
    g.client == req.client
        && g.operation == req.operation
        && now_ms < g.expires_at_ms
        && g.uses_left.is_none_or(|n| n > 0)
        && g.class.target_kind == req.class.target_kind
        && subset(&req.class.fields, &g.class.fields)
        && subset(&req.class.attrs, &g.class.attrs)
        && req.class.argv == g.class.argv
}

/// A command's argv against a rule's per-position patterns: pattern `i` globs argument `i`
/// (`argv[0]` is the program as written); a last pattern `**` also matches any number of
/// further arguments, none included; otherwise the argv has exactly as many entries as there
/// are patterns.
pub fn argv_match(patterns: &[String], argv: &[String]) -> bool {
    let (fixed, open) = match patterns.split_last() {
        Some((last, init)) if last == "**" => (init, true),
        _ => (patterns, false),
    };
    let len_ok = if open {
        argv.len() >= fixed.len()
    } else {
        argv.len() == fixed.len()
    };
    len_ok && fixed.iter().zip(argv).all(|(p, a)| glob_match(p, a))
}

/// Every requested value must be one the grant was approved for.
fn subset(
    req: &BTreeMap<String, BTreeSet<String>>,
    grant: &BTreeMap<String, BTreeSet<String>>,
) -> bool {
    req.iter().all(|(k, vs)| {
        grant
            .get(k)
            .is_some_and(|gs| vs.iter().all(|v| gs.contains(v)))
    }) && grant.keys().all(|k| req.contains_key(k))
}

/// Glob match: `**` spans anything, `**/` also matches no directory at all, `*` spans
/// anything but `/`, `?` is one character other than `/`.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    // Most patterns name one thing exactly (an operation, a kind), anything, or anything
    // under a literal prefix (`file.*`, `docs/**`): nothing to build for them.
    let literal = |p: &str| !p.contains(['*', '?']);
    match pattern {
        "**" => true,
        "*" => !text.contains('/'),
        _ if literal(pattern) => pattern == text,
        _ => {
            if let Some(prefix) = pattern.strip_suffix("**")
                && literal(prefix)
            {
                return text.starts_with(prefix);
            }
            if let Some(prefix) = pattern.strip_suffix('*')
                && literal(prefix)
            {
                return text
                    .strip_prefix(prefix)
                    .is_some_and(|rest| !rest.contains('/'));
            }
            glob_match_general(pattern, text)
        }
    }
}

/// [`glob_match`] for any pattern: the memoized matcher the fast paths must agree with.
fn glob_match_general(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let mut memo = vec![None; (p.len() + 1) * (t.len() + 1)];
    glob_at(&p, &t, 0, 0, &mut memo)
}

fn glob_at(p: &[char], t: &[char], pi: usize, ti: usize, memo: &mut [Option<bool>]) -> bool {
    let slot = pi * (t.len() + 1) + ti;
    if let Some(v) = memo[slot] {
        return v;
    }
    let v = if pi == p.len() {
        ti == t.len()
    } else if p[pi] == '*' && p.get(pi + 1) == Some(&'*') {
        if p.get(pi + 2) == Some(&'/') {
            // Zero directories, or any prefix ending in '/'.
            glob_at(p, t, pi + 3, ti, memo)
                || (ti..t.len()).any(|j| t[j] == '/' && glob_at(p, t, pi + 3, j + 1, memo))
        } else {
            (ti..=t.len()).any(|j| glob_at(p, t, pi + 2, j, memo))
        }
    } else if p[pi] == '*' {
        let mut j = ti;
        loop {
            if glob_at(p, t, pi + 1, j, memo) {
                break true;
            }
            if j == t.len() || t[j] == '/' {
                break false;
            }
            j += 1;
        }
    } else if p[pi] == '?' {
        ti < t.len() && t[ti] != '/' && glob_at(p, t, pi + 1, ti + 1, memo)
    } else {
        ti < t.len() && t[ti] == p[pi] && glob_at(p, t, pi + 1, ti + 1, memo)
    };
    memo[slot] = Some(v);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(kind: &str, fields: &[(&str, &[&str])], attrs: &[(&str, &[&str])]) -> Classification {
        let conv = |xs: &[(&str, &[&str])]| {
            xs.iter()
                .map(|(k, vs)| (k.to_string(), vs.iter().map(|v| v.to_string()).collect()))
                .collect()
        };
        Classification {
            target_kind: kind.into(),
            fields: conv(fields),
            attrs: conv(attrs),
            must_name: Default::default(),
            argv: None,
        }
    }

    fn parse(text: &str) -> Result<Policy, PolicyError> {
        Policy::parse(text, Path::new("/ws/.gaffer/policy.yaml"))
    }

    const POLICY: &str = r#"
rules:
  - id: no-secrets
    effect: deny
    operations: ["file.*"]
    targets:
      - kind: file
        fields:
          path: ["secrets/**", "**/.env"]
  - id: docs
    effect: allow
    clients: ["agent-*"]
    operations: ["file.write"]
    targets:
      - kind: file
        fields:
          path: ["docs/**"]
  - id: ask
    effect: request
    operations: ["file.*", "command.run"]
    grant_policy:
      mode: execution
      default_minutes: 5
      max_minutes: 60
      request_ttl_minutes: 10
"#;

    #[test]
    fn an_allow_rule_covers_must_name_fields_only_by_naming_them() {
        let p = parse(
            r#"
rules:
  - id: broad
    effect: allow
    operations: ["worker.start"]
  - id: by-profile
    effect: allow
    operations: ["worker.start"]
    targets: [{kind: worker, fields: {profile: ["p"]}}]
  - id: with-secrets
    effect: allow
    operations: ["worker.start"]
    targets: [{kind: worker, fields: {profile: ["p"], secrets: ["a", "b"]}}]
"#,
        )
        .unwrap();
        let decide = |secrets: &[&str]| {
            let mut c = class("worker", &[("profile", &["p"]), ("secrets", secrets)], &[]);
            c.must_name.insert("secrets".into());
            let req = PolicyRequest {
                client: "agent",
                operation: "worker.start",
                class: &c,
                lane_scope: None,
            };
            p.decide(&req, &[], 0).rule_ids
        };
        assert_eq!(decide(&["a"]), vec!["with-secrets"]);
        assert_eq!(decide(&["a", "b"]), vec!["with-secrets"]);
        assert!(
            decide(&["a", "c"]).is_empty(),
            "a secret no rule names is never allowed"
        );
        let plain = class("worker", &[("profile", &["p"])], &[]);
        let req = PolicyRequest {
            client: "agent",
            operation: "worker.start",
            class: &plain,
            lane_scope: None,
        };
        assert!(
            p.decide(&req, &[], 0)
                .rule_ids
                .contains(&"broad".to_string())
        );
    }

    fn command(argv: &[&str], env: &[&str]) -> Classification {
        let mut c = class("command", &[("program", &argv[..1])], &[]);
        c.argv = Some(argv.iter().map(|a| a.to_string()).collect());
        if !env.is_empty() {
            c.attrs
                .insert("env".into(), env.iter().map(|e| e.to_string()).collect());
            c.must_name.insert("env".into());
        }
        c
    }

    #[test]
    fn argv_patterns_match_by_position_and_env_only_when_named() {
        let p = parse(
            r#"
rules:
  - id: status
    effect: allow
    operations: ["command.run"]
    targets: [{kind: command, argv: ["git", "status", "**"]}]
  - id: test-one
    effect: allow
    operations: ["command.run"]
    targets: [{kind: command, argv: ["cargo", "test", "*"]}]
    attrs: {env: ["RUST_LOG"]}
  - id: no-push
    effect: deny
    operations: ["command.run"]
    targets: [{kind: command, argv: ["git", "push", "**"]}]
"#,
        )
        .unwrap();
        let ids = |c: &Classification| {
            let req = PolicyRequest {
                client: "agent",
                operation: "command.run",
                class: c,
                lane_scope: None,
            };
            p.decide(&req, &[], 0).rule_ids
        };
        assert_eq!(ids(&command(&["git", "status"], &[])), vec!["status"]);
        assert_eq!(
            ids(&command(&["git", "status", "-s", "src/a b"], &[])),
            vec!["status"]
        );
        assert!(ids(&command(&["git", "log"], &[])).is_empty());
        assert!(ids(&command(&["git"], &[])).is_empty(), "too short");
        assert_eq!(
            ids(&command(&["git", "push", "origin"], &[])),
            vec!["no-push"]
        );
        // `*` is one argument without `/`; the length is exact without a last `**`.
        assert_eq!(
            ids(&command(&["cargo", "test", "x"], &["RUST_LOG"])),
            vec!["test-one"]
        );
        assert!(ids(&command(&["cargo", "test", "a/b"], &["RUST_LOG"])).is_empty());
        assert!(ids(&command(&["cargo", "test", "x", "y"], &["RUST_LOG"])).is_empty());
        // A variable reaches the program only under a rule naming it.
        assert!(ids(&command(&["git", "status"], &["GIT_DIR"])).is_empty());
        assert!(ids(&command(&["cargo", "test", "x"], &["RUST_LOG", "GIT_DIR"])).is_empty());
        assert!(argv_match(&["**".into()], &[]));
        let broad = parse(
            "rules:\n  - id: git\n    effect: allow\n    operations: [\"command.*\"]\n    targets: [{kind: command, fields: {program: [git]}}]\n",
        )
        .unwrap();
        assert_eq!(broad.broad_command_rules(), vec!["git"]);
        assert!(p.broad_command_rules().is_empty());
    }

    #[test]
    fn a_window_grant_covers_only_the_argv_it_was_approved_for() {
        let approved = command(&["git", "status"], &[]);
        let g = ActiveGrant {
            id: "ap".into(),
            client: "agent".into(),
            operation: "command.run".into(),
            class: approved.clone(),
            expires_at_ms: 10,
            uses_left: None,
        };
        let covers = |c: &Classification| {
            grant_covers(
                &g,
                &PolicyRequest {
                    client: "agent",
                    operation: "command.run",
                    class: c,
                    lane_scope: None,
                },
                0,
            )
        };
        assert!(covers(&approved));
        assert!(!covers(&command(&["git", "push"], &[])));
    }

    #[test]
    fn sandbox_off_counts_only_in_a_trusted_policy() {
        use crate::sandbox::Setting;
        assert_eq!(parse("rules: []\n").unwrap().sandbox, Setting::Required);
        assert_eq!(parse("sandbox: on\n").unwrap().sandbox, Setting::Required);
        let off = parse("sandbox: off\nrules: []\n").unwrap();
        assert_eq!(off.sandbox, Setting::Off);
        assert_eq!(off.into_untrusted().sandbox, Setting::Required);
        let shared = parse("sandbox: shared_proc\nrules: []\n").unwrap();
        assert_eq!(shared.sandbox, Setting::SharedProc);
        assert_eq!(shared.into_untrusted().sandbox, Setting::Required);
        let e = parse("sandbox: maybe\n").unwrap_err();
        assert_eq!(e.key, "sandbox", "{e}");
    }

    proptest::proptest! {
        /// The fast paths (literal, `*`, `**`, a literal prefix then `*` or `**`) decide as
        /// the general matcher does, for
        /// patterns and texts over an alphabet dense in `/`, `*`, `?` and non-ASCII.
        #[test]
        fn glob_fast_paths_agree_with_the_general_matcher(
            pattern in "[a/*?é.]{0,6}",
            text in "[a/é.]{0,8}",
        ) {
            proptest::prop_assert_eq!(
                glob_match(&pattern, &text),
                glob_match_general(&pattern, &text),
                "pattern {:?} text {:?}", pattern, text
            );
        }
    }

    #[test]
    fn glob_semantics() {
        assert!(glob_match("*", "file.write"));
        assert!(glob_match("file.*", "file.write"));
        assert!(!glob_match("file.*", "command.run"));
        assert!(glob_match("docs/**", "docs/a/b.md"));
        assert!(glob_match("docs/*", "docs/a.md"));
        assert!(!glob_match("docs/*", "docs/a/b.md"));
        assert!(glob_match("**/.env", ".env"));
        assert!(glob_match("**/.env", "a/b/.env"));
        assert!(!glob_match("**/.env", "a/b/x.env"));
        assert!(glob_match("a?c", "abc"));
        assert!(!glob_match("a?c", "a/c"));
        assert!(glob_match("", ""));
        assert!(!glob_match("", "x"));
        // Literal patterns (the fast path) match exactly themselves: no prefix, no case.
        assert!(glob_match("file.write", "file.write"));
        assert!(!glob_match("file.write", "file.writes"));
        assert!(!glob_match("file.write", "file.wri"));
        assert!(!glob_match("File.write", "file.write"));
        assert!(glob_match("dé/ü", "dé/ü"));
        assert!(glob_match("*", ""));
        assert!(!glob_match("*", "a/b"));
        assert!(glob_match("**", "a/b"));
        assert!(glob_match("**", ""));
        // A literal prefix, then `*` (no `/` after it) or `**` (anything after it).
        assert!(glob_match("file.*", "file."));
        assert!(!glob_match("file.*", "file"));
        assert!(!glob_match("file.*", "file.a/b"));
        assert!(glob_match("docs/**", "docs/"));
        assert!(!glob_match("docs/**", "docs"));
        assert!(glob_match("dé**", "dé/ü/x"));
        assert!(!glob_match("dé**", "d"));
    }

    #[test]
    fn lane_scope_rules_match_only_lanes_this_process_runs_and_their_paths() {
        assert!(in_lane_scope(&["router".into()], "router/a.rs"));
        assert!(in_lane_scope(&["router/".into()], "router"));
        assert!(!in_lane_scope(&["router".into()], "routerx/a.rs"));
        assert!(!in_lane_scope(&["router".into()], "billing/a.rs"));
        assert!(in_lane_scope(&["src/*/mod.rs".into()], "src/a/mod.rs"));
        assert!(!in_lane_scope(&[], "router/a.rs"));
        let p = parse(
            r#"rules:
  - id: in
    effect: allow
    clients: ["pl_*/*"]
    operations: ["file.write"]
    lane_scope: inside
  - id: out
    effect: deny
    clients: ["pl_*/*"]
    operations: ["file.write"]
    lane_scope: outside
"#,
        )
        .unwrap();
        let scope = vec!["router".to_string()];
        let d = |client: &str, path: &str, lane: Option<&[String]>| {
            let c = class("file", &[("path", &[path])], &[]);
            p.decide(
                &PolicyRequest {
                    client,
                    operation: "file.write",
                    class: &c,
                    lane_scope: lane,
                },
                &[],
                1_000,
            )
            .effect
        };
        assert_eq!(
            d("pl_a/lane-1", "router/x", Some(&scope)),
            DecisionEffect::Allow
        );
        assert_eq!(
            d("pl_a/lane-1", "billing/x", Some(&scope)),
            DecisionEffect::Deny
        );
        // A client named like a lane that this process does not run has no scope: no rule.
        assert_eq!(d("pl_a/lane-1", "router/x", None), DecisionEffect::NoMatch);
        // `*` does not span `/`: an ordinary client never matches lane rules.
        assert_eq!(
            d("agent", "router/x", Some(&scope)),
            DecisionEffect::NoMatch
        );
    }

    #[test]
    fn precedence_is_deny_then_grant_then_allow_then_request_then_no_match() {
        let p = parse(POLICY).unwrap();
        let d = |client: &str, op: &str, c: &Classification, grants: &[ActiveGrant]| {
            p.decide(
                &PolicyRequest {
                    client,
                    operation: op,
                    class: c,
                    lane_scope: None,
                },
                grants,
                1_000,
            )
        };
        let docs = class("file", &[("path", &["docs/a.md"])], &[]);
        assert_eq!(
            d("agent-1", "file.write", &docs, &[]).effect,
            DecisionEffect::Allow
        );
        // Allow needs every value to match; one outside docs/ falls through to request.
        let mixed = class("file", &[("path", &["docs/a.md", "src/x.rs"])], &[]);
        let dec = d("agent-1", "file.write", &mixed, &[]);
        assert_eq!(dec.effect, DecisionEffect::Request);
        assert_eq!(dec.grant_policy.unwrap().default_minutes, 5);
        // Deny fires on any value.
        let secret = class("file", &[("path", &["docs/a.md", "secrets/k"])], &[]);
        let dec = d("agent-1", "file.write", &secret, &[]);
        assert_eq!(dec.effect, DecisionEffect::Deny);
        assert_eq!(dec.rule_ids, vec!["no-secrets"]);
        // Client glob.
        assert_eq!(
            d("human", "file.write", &docs, &[]).effect,
            DecisionEffect::Request
        );
        // No rule at all.
        let other = class("repo", &[], &[]);
        assert_eq!(
            d("agent-1", "repo.create", &other, &[]).effect,
            DecisionEffect::NoMatch
        );
        // An active grant beats allow/request but not deny.
        let src = class("file", &[("path", &["src/x.rs"])], &[]);
        let grant = ActiveGrant {
            id: "g1".into(),
            client: "agent-1".into(),
            operation: "file.write".into(),
            class: src.clone(),
            expires_at_ms: 2_000,
            uses_left: Some(1),
        };
        let dec = d("agent-1", "file.write", &src, std::slice::from_ref(&grant));
        assert_eq!(dec.effect, DecisionEffect::Allow);
        assert_eq!(dec.grant_id.as_deref(), Some("g1"));
        let used = ActiveGrant {
            uses_left: Some(0),
            ..grant.clone()
        };
        assert_eq!(
            d("agent-1", "file.write", &src, &[used]).effect,
            DecisionEffect::Request
        );
        let expired = ActiveGrant {
            expires_at_ms: 1_000,
            ..grant.clone()
        };
        assert_eq!(
            d("agent-1", "file.write", &src, &[expired]).effect,
            DecisionEffect::Request
        );
        let g_secret = ActiveGrant {
            class: secret.clone(),
            ..grant
        };
        assert_eq!(
            d("agent-1", "file.write", &secret, &[g_secret]).effect,
            DecisionEffect::Deny
        );
    }

    #[test]
    fn missing_file_means_every_operation_needs_approval() {
        let dir = tempfile::tempdir().unwrap();
        let p = Policy::load(dir.path()).unwrap();
        assert!(p.rules.is_none());
        let c = class("file", &[("path", &["x"])], &[]);
        let dec = p.decide(
            &PolicyRequest {
                client: "a",
                operation: "file.write",
                class: &c,
                lane_scope: None,
            },
            &[],
            0,
        );
        assert_eq!(dec.effect, DecisionEffect::Request);
        assert_eq!(dec.reason, "no_policy_file");
        // An empty rule list, by contrast, matches nothing.
        let empty = parse("rules: []\n").unwrap();
        let dec = empty.decide(
            &PolicyRequest {
                client: "a",
                operation: "file.write",
                class: &c,
                lane_scope: None,
            },
            &[],
            0,
        );
        assert_eq!(dec.effect, DecisionEffect::NoMatch);
    }

    #[test]
    fn an_untrusted_policy_keeps_its_denies_and_asks_a_human_for_the_rest() {
        let p = parse(POLICY).unwrap().into_untrusted();
        let d = |c: &Classification| {
            p.decide(
                &PolicyRequest {
                    client: "agent-1",
                    operation: "file.write",
                    class: c,
                    lane_scope: None,
                },
                &[],
                0,
            )
        };
        let dec = d(&class("file", &[("path", &["secrets/k"])], &[]));
        assert_eq!(dec.effect, DecisionEffect::Deny);
        assert_eq!(dec.rule_ids, vec!["no-secrets"]);
        // The allow rule for docs/ and the request rule's 5-minute bounds are both ignored.
        let dec = d(&class("file", &[("path", &["docs/a.md"])], &[]));
        assert_eq!(dec.effect, DecisionEffect::Request);
        assert_eq!(dec.reason, "untrusted_policy");
        assert_eq!(
            dec.grant_policy,
            Some(GrantPolicy::default_for_missing_policy())
        );
        let dec = d(&class("file", &[("path", &["src/x.rs"])], &[]));
        assert_eq!(dec.grant_policy.unwrap().default_minutes, 10);
    }

    #[test]
    fn parse_errors_name_file_line_and_key() {
        let e = parse("rules:\n  - id: a\n    effect: maybe\n").unwrap_err();
        assert_eq!(e.line, Some(3));
        assert_eq!(e.key, "rules[0].effect");
        assert!(
            e.to_string()
                .starts_with("/ws/.gaffer/policy.yaml:3: rules[0].effect:"),
            "{e}"
        );

        let e = parse("rules:\n  - id: a\n    effect: allow\n    colour: red\n").unwrap_err();
        assert_eq!(e.line, Some(4));
        assert!(e.message.contains("colour"), "{e}");

        let e = parse("rules:\n  - id: a\n    effect: request\n").unwrap_err();
        assert!(e.message.contains("grant_policy"), "{e}");
        assert!(e.key.starts_with("rules[0]"), "{e}");

        let e = parse(
            "rules:\n  - id: a\n    effect: allow\n    grant_policy: {mode: execution, default_minutes: 1, max_minutes: 1, request_ttl_minutes: 1}\n",
        )
        .unwrap_err();
        assert!(e.message.contains("only allowed on request"), "{e}");

        let e = parse("rules:\n  - id: a\n    effect: allow\n  - id: a\n    effect: deny\n")
            .unwrap_err();
        assert_eq!(e.line, Some(4));
        assert_eq!(e.key, "rules[1].id");

        let e = parse("rules:\n  - id: a\n    effect: allow\n    clients: []\n").unwrap_err();
        assert!(e.message.contains("clients"), "{e}");
    }
}
