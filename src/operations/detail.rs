//! What `approvals/get` adds to an approval for the operator deciding it, all from the
//! digest-checked plan text: the canonical plan, a unified diff for a file change (the file as
//! it is now against the proposed content, pinned digest compared), the argv / env names /
//! limits of a command, the narrowings the operator may sign, and the time left.

use std::path::Path;

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value;

use super::diff;
use super::plan::Plan;
use super::policy::GrantMode;
use super::state::Approval;
use super::views::rfc3339;

/// Canonical plan text shown at most this long.
pub const MAX_PLAN_BYTES: usize = 64 * 1024;
/// Diff text at most this long.
pub const MAX_DIFF_BYTES: usize = 64 * 1024;
/// Past this many changed lines (after trimming common ends) the middle is one replacement.
pub const MAX_DIFF_EDITS: usize = 4000;
/// A current file larger than this is summarised, not diffed.
pub const MAX_CURRENT_BYTES: u64 = 2 << 20;

#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ApprovalDetail {
    /// The plan's canonical (RFC 8785) text, the bytes its digest is over (cut at 64 KiB).
    pub plan: String,
    pub plan_truncated: bool,
    /// When the plan itself stops being executable.
    pub plan_expires_at: String,
    /// Seconds until the request expires unanswered (0 once past).
    pub expires_in_seconds: u64,
    pub narrowing: NarrowingChoices,
    /// `file.write` / `file.delete`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_change: Option<FileChange>,
    /// `command.run`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<CommandShown>,
}

/// What an approval may be narrowed to when approving: any duration in
/// `1..=max_duration_seconds` and any use count in `1..=max_uses`. The mode is fixed by the
/// policy rule that asked.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct NarrowingChoices {
    pub mode: GrantMode,
    /// The requested duration: the longest an approval may be signed for.
    pub max_duration_seconds: u64,
    /// The requested uses: the most an approval may be signed for.
    pub max_uses: u32,
    pub duration_narrowable: bool,
    /// Only a window grant with more than one use can be narrowed in uses.
    pub uses_narrowable: bool,
    /// What one approval covers in this mode.
    pub covers: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    Create,
    Modify,
    Delete,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct FileSide {
    pub bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Not UTF-8 text (or has NUL bytes): summarised, not diffed.
    pub binary: bool,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct FileChange {
    /// Workspace-relative path.
    pub path: String,
    pub change: ChangeKind,
    /// The file as it is now (absent when it does not exist).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current: Option<FileSide>,
    /// The content the plan writes (absent for a delete).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proposed: Option<FileSide>,
    /// The file is as the plan pinned it; when false the execution will refuse to run.
    pub current_matches_plan: bool,
    /// Unified diff from the current to the proposed content (absent when either side is
    /// binary, too large or unreadable; see `summary`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diff: Option<String>,
    pub diff_truncated: bool,
    pub lines_added: usize,
    pub lines_removed: usize,
    /// One line for humans: what changes, or why there is no diff.
    pub summary: String,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct CommandShown {
    pub argv: Vec<String>,
    /// Working directory relative to the workspace root (`""` = the root).
    pub cwd: String,
    /// Names of the variables the plan sets (values are in `arguments`).
    pub env_names: Vec<String>,
    /// Variables passed through from gaffer's environment; nothing else is.
    pub inherited_env: Vec<String>,
    pub timeout_ms: u64,
}

/// The detail of a pending (or decided) approval whose plan verified as `plan`.
pub fn detail(root: &Path, a: &Approval, plan: &Plan, now_ms: u64) -> ApprovalDetail {
    let text = plan.canonical();
    let plan_truncated = text.len() > MAX_PLAN_BYTES;
    let plan_text = if plan_truncated {
        let mut cut = MAX_PLAN_BYTES;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text[..cut].to_string()
    } else {
        text
    };
    ApprovalDetail {
        plan: plan_text,
        plan_truncated,
        plan_expires_at: rfc3339(plan.expires_at_ms),
        expires_in_seconds: a.pending_expires_at_ms.saturating_sub(now_ms) / 1000,
        narrowing: narrowing(a),
        file_change: match plan.operation.as_str() {
            "file.write" | "file.delete" => Some(file_change(root, plan)),
            _ => None,
        },
        command: (plan.operation == "command.run").then(|| command(plan)),
    }
}

pub fn narrowing(a: &Approval) -> NarrowingChoices {
    NarrowingChoices {
        mode: a.mode,
        max_duration_seconds: a.requested_duration_seconds,
        max_uses: a.requested_max_uses,
        duration_narrowable: a.requested_duration_seconds > 1,
        uses_narrowable: a.mode == GrantMode::Window && a.requested_max_uses > 1,
        covers: match a.mode {
            GrantMode::Execution => "exactly this one execution".into(),
            GrantMode::Window => format!(
                "up to {} operations with this classification until the approval expires",
                a.requested_max_uses
            ),
        },
    }
}

fn is_binary(bytes: &[u8]) -> bool {
    bytes.contains(&0) || std::str::from_utf8(bytes).is_err()
}

fn side(bytes: &[u8]) -> FileSide {
    FileSide {
        bytes: bytes.len() as u64,
        sha256: Some(crate::util::sha256_hex(bytes)),
        binary: is_binary(bytes),
    }
}

enum Current {
    Missing,
    Read(Vec<u8>),
    TooLarge(u64),
    Unreadable(String),
}

fn read_current(root: &Path, rel: &str) -> Current {
    let path = match super::adapters::paths::inside_workspace(root, "target.path", rel, true) {
        Ok(p) => p,
        Err(e) => return Current::Unreadable(e.message),
    };
    match std::fs::metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Current::Missing,
        Err(_) => return Current::Unreadable("cannot read the current file".into()),
        Ok(m) if !m.is_file() => return Current::Unreadable("the target is not a file".into()),
        Ok(m) if m.len() > MAX_CURRENT_BYTES => return Current::TooLarge(m.len()),
        Ok(_) => {}
    }
    match std::fs::read(&path) {
        Ok(b) => Current::Read(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Current::Missing,
        Err(_) => Current::Unreadable("cannot read the current file".into()),
    }
}

fn file_change(root: &Path, plan: &Plan) -> FileChange {
    let rel = plan
        .target
        .get("path")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let proposed = plan.arguments.get("content").and_then(Value::as_str);
    let pinned = plan
        .preconditions
        .get("prior_sha256")
        .and_then(Value::as_str)
        .map(str::to_string);
    let current = read_current(root, &rel);
    let current_side = match &current {
        Current::Read(b) => Some(side(b)),
        Current::TooLarge(n) => Some(FileSide {
            bytes: *n,
            sha256: None,
            binary: false,
        }),
        _ => None,
    };
    let current_sha = match &current {
        Current::Read(b) => Some(crate::util::sha256_hex(b)),
        _ => None,
    };
    let current_matches_plan = match &current {
        Current::Missing => pinned.is_none(),
        Current::Read(_) => current_sha == pinned,
        _ => false,
    };
    let change = match (proposed.is_some(), &current) {
        (false, _) => ChangeKind::Delete,
        (true, Current::Missing) => ChangeKind::Create,
        (true, _) => ChangeKind::Modify,
    };
    let mut out = FileChange {
        path: rel.clone(),
        change,
        current: current_side,
        proposed: proposed.map(|p| side(p.as_bytes())),
        current_matches_plan,
        diff: None,
        diff_truncated: false,
        lines_added: 0,
        lines_removed: 0,
        summary: String::new(),
    };
    let old_text: Result<Option<&str>, String> = match &current {
        Current::Missing => Ok(None),
        Current::Read(b) if is_binary(b) => Err(format!("binary file ({} bytes)", b.len())),
        Current::Read(b) => Ok(std::str::from_utf8(b).ok()),
        Current::TooLarge(n) => Err(format!("the current file is too large to diff ({n} bytes)")),
        Current::Unreadable(m) => Err(m.clone()),
    };
    let stale = if current_matches_plan {
        ""
    } else {
        " (the file changed since the plan was made: executing it will be refused)"
    };
    match old_text {
        Err(why) => {
            out.summary = match proposed {
                Some(p) => format!("replace {rel}: {why} -> {} bytes{stale}", p.len()),
                None => format!("delete {rel}: {why}{stale}"),
            };
        }
        Ok(old) => {
            let u = diff::unified(
                old.unwrap_or(""),
                proposed.unwrap_or(""),
                &if old.is_some() {
                    format!("a/{rel}")
                } else {
                    "/dev/null".into()
                },
                &if proposed.is_some() {
                    format!("b/{rel}")
                } else {
                    "/dev/null".into()
                },
                MAX_DIFF_EDITS,
                MAX_DIFF_BYTES,
            );
            let verb = match change {
                ChangeKind::Create => "create",
                ChangeKind::Modify => "modify",
                ChangeKind::Delete => "delete",
            };
            out.summary = format!("{verb} {rel}: +{} -{} lines{stale}", u.added, u.removed);
            out.lines_added = u.added;
            out.lines_removed = u.removed;
            out.diff_truncated = u.truncated;
            out.diff = Some(u.text);
        }
    }
    out
}

fn command(plan: &Plan) -> CommandShown {
    let strings = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    CommandShown {
        argv: strings(plan.target.get("argv")),
        cwd: plan
            .arguments
            .get("cwd")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        env_names: plan
            .arguments
            .get("env")
            .and_then(Value::as_object)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default(),
        inherited_env: super::adapters::command::INHERITED_ENV
            .iter()
            .map(|s| s.to_string())
            .collect(),
        timeout_ms: plan
            .arguments
            .get("timeout_ms")
            .and_then(Value::as_u64)
            .unwrap_or(super::adapters::command::DEFAULT_TIMEOUT_MS),
    }
}
