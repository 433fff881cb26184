//! The shape of a config bundle and of what gaffer says about one.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A content-addressed configuration a host pins its workers to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Bundle {
    pub metadata: Metadata,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub profiles: Vec<Profile>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub declarations: Vec<Declaration>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    /// Write-once name of the bundle within the workspace.
    pub id: String,
    /// `sha256:<64 hex>`; optional on sync (gaffer computes it), must match when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    pub revision: String,
    /// Free text chosen by the producer; never parsed as a time.
    pub created_at: String,
    pub provenance: Provenance,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Provenance {
    pub source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// Which profile a worker runs: `{"kind": "builtin"|"named", "value": ...}`.
#[derive(
    Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
pub enum ProfileSelector {
    Builtin(String),
    Named(String),
}

impl ProfileSelector {
    pub fn kind(&self) -> &'static str {
        match self {
            ProfileSelector::Builtin(_) => "builtin",
            ProfileSelector::Named(_) => "named",
        }
    }

    pub fn value(&self) -> &str {
        match self {
            ProfileSelector::Builtin(v) | ProfileSelector::Named(v) => v,
        }
    }
}

impl std::fmt::Display for ProfileSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.kind(), self.value())
    }
}

/// How a worker's process receives its input.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum InputMode {
    /// Each input is flattened to text and written to stdin, newline-terminated.
    #[default]
    StdinText,
    /// Each input is written to stdin as one JSON object per line.
    StdinJsonl,
    /// The initial input is passed as one extra argument; later input is not accepted.
    Argument,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub selector: ProfileSelector,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// The program and its arguments, run directly (never through a shell).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    #[serde(default)]
    pub input_mode: InputMode,
    /// Wall-clock limit for the whole run, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub toolsets: Vec<String>,
    /// A model label for hosts; gaffer does not interpret it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum DeclarationKind {
    SecretRef,
    MountGrant,
    NetworkPolicy,
    ShellPolicy,
    GitPolicy,
    CapabilityGrant,
}

impl DeclarationKind {
    pub const ALL: [DeclarationKind; 6] = [
        DeclarationKind::SecretRef,
        DeclarationKind::MountGrant,
        DeclarationKind::NetworkPolicy,
        DeclarationKind::ShellPolicy,
        DeclarationKind::GitPolicy,
        DeclarationKind::CapabilityGrant,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DeclarationKind::SecretRef => "secret_ref",
            DeclarationKind::MountGrant => "mount_grant",
            DeclarationKind::NetworkPolicy => "network_policy",
            DeclarationKind::ShellPolicy => "shell_policy",
            DeclarationKind::GitPolicy => "git_policy",
            DeclarationKind::CapabilityGrant => "capability_grant",
        }
    }

    pub fn parse(s: &str) -> Option<DeclarationKind> {
        DeclarationKind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// A reference must start with one of these, so a bare value (a plaintext secret, a host
    /// path) can never pass as a reference.
    pub fn prefixes(self) -> &'static [&'static str] {
        match self {
            DeclarationKind::SecretRef => &["env:", "secret:", "secret-ref:", "vault:", "keyring:"],
            DeclarationKind::MountGrant => &["mount:", "mount-grant:"],
            DeclarationKind::NetworkPolicy => &["network:", "network-policy:"],
            DeclarationKind::ShellPolicy => &["shell:", "shell-policy:"],
            DeclarationKind::GitPolicy => &["git:", "git-policy:"],
            DeclarationKind::CapabilityGrant => &["capability:", "capability-grant:"],
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Declaration {
    pub kind: DeclarationKind,
    /// 1 to 64 letters, digits and `.` `_` `-`: a label (a `secret_ref`'s is the secret's).
    pub name: String,
    /// A typed token such as `env:GITHUB_TOKEN` or `vault:team.api-key`; never the value.
    pub reference: String,
}

impl Declaration {
    /// The environment variable a `secret_ref` of the form `env:NAME` passes to the worker.
    pub fn env_var(&self) -> Option<&str> {
        match self.kind {
            DeclarationKind::SecretRef => self.reference.strip_prefix("env:"),
            _ => None,
        }
    }
}

/// The stable identity of a synced bundle.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BundleRef {
    pub id: String,
    pub digest: String,
}

/// What gaffer reports about a bundle: metadata and counts, never the body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct BundleSummary {
    pub id: String,
    pub digest: String,
    pub digest_algorithm: String,
    pub revision: String,
    pub created_at: String,
    pub provenance: Provenance,
    pub profile_count: usize,
    pub declaration_count: usize,
    /// Selectors of the profiles, in canonical order.
    pub profiles: Vec<ProfileSelector>,
    /// Size of the canonical body in bytes.
    pub size_bytes: usize,
}

/// Returned by sync and check: the reference to pass to `workers/create`, plus the summary.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Availability {
    pub reference: BundleRef,
    pub summary: BundleSummary,
}
