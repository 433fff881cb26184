//! The `workspace` provider: atomic file writes and deletes inside the workspace, pinned to
//! the content digest observed at resolve time and proven by reading back.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::super::adapter::{
    Adapter, AdapterCtx, AdapterError, BoxFuture, Catalog, Decoded, Descriptor, ExecError,
    FailureKind, Outcome, Presentation, Resolved, Risk,
};
use super::super::lifecycle::codes;
use super::super::policy::Classification;
use super::common::{decode_closed, ready, schema_of, to_value};
use super::handle::{self, FileError, Parent, ReplaceError};
use super::paths::{inside_workspace, normalize_relative};

pub const PROVIDER: &str = "workspace";
/// Largest file content accepted in one write.
const MAX_CONTENT_BYTES: usize = 1 << 20;

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
/// A file inside the workspace, by workspace-relative path.
pub struct FileTarget {
    pub path: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
/// New UTF-8 content of the file.
pub struct WriteArgs {
    pub content: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
/// `file.delete` takes no arguments.
pub struct NoArgs {}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Pinned {
    /// sha256 of the file's content when the plan was made; `None` = did not exist.
    prior_sha256: Option<String>,
}

pub fn catalog() -> Catalog {
    Catalog {
        provider: PROVIDER.into(),
        descriptors: vec![write_descriptor(), delete_descriptor()],
    }
}

fn write_descriptor() -> Descriptor {
    Descriptor {
        name: "file.write".into(),
        provider: PROVIDER.into(),
        operation_revision: 1,
        summary: "Atomically replace (or create) a file inside the workspace".into(),
        risk: Risk::Medium,
        target_kind: "file".into(),
        target_schema: schema_of::<FileTarget>(),
        arguments_schema: schema_of::<WriteArgs>(),
        request_ttl_seconds: 1800,
        approval_ttl_seconds: 600,
        requires_approval: false,
        implemented: true,
    }
}

fn delete_descriptor() -> Descriptor {
    Descriptor {
        name: "file.delete".into(),
        provider: PROVIDER.into(),
        operation_revision: 1,
        summary: "Delete a file inside the workspace".into(),
        risk: Risk::High,
        target_kind: "file".into(),
        target_schema: schema_of::<FileTarget>(),
        arguments_schema: schema_of::<NoArgs>(),
        request_ttl_seconds: 1800,
        approval_ttl_seconds: 600,
        requires_approval: false,
        implemented: true,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Write,
    Delete,
}

pub struct FileAdapter {
    kind: Kind,
    desc: Descriptor,
}

/// Both adapters of the provider.
pub fn adapters() -> Vec<std::sync::Arc<dyn Adapter>> {
    vec![
        std::sync::Arc::new(FileAdapter {
            kind: Kind::Write,
            desc: write_descriptor(),
        }),
        std::sync::Arc::new(FileAdapter {
            kind: Kind::Delete,
            desc: delete_descriptor(),
        }),
    ]
}

/// Opens the file's directory by handle (re-checked at every step: a link may have appeared
/// since the plan was made) and digests the file through it.
fn open(ctx: &AdapterCtx, rel: &str, create: bool) -> Result<(Parent, Option<String>), FileError> {
    let parent = handle::parent(&ctx.workspace_root, rel, create)?;
    let digest = parent.digest()?;
    Ok((parent, digest))
}

fn not_started(code: &str, e: FileError) -> ExecError {
    ExecError::new(FailureKind::NotStarted, code, e.to_string())
}

struct Plan<'a> {
    rel: &'a str,
    content: Option<&'a str>,
    prior: Option<String>,
}

fn plan_parts(plan: &Resolved) -> Result<Plan<'_>, ExecError> {
    let bad = || {
        ExecError::new(
            FailureKind::NotStarted,
            codes::INVALID_STORED,
            "plan is malformed",
        )
    };
    let rel = plan
        .target
        .get("path")
        .and_then(Value::as_str)
        .ok_or_else(bad)?;
    let content = plan.arguments.get("content").and_then(Value::as_str);
    let pinned: Pinned = serde_json::from_value(plan.preconditions.clone()).map_err(|_| bad())?;
    Ok(Plan {
        rel,
        content,
        prior: pinned.prior_sha256,
    })
}

fn locate(ctx: &AdapterCtx, rel: &str) -> Result<PathBuf, ExecError> {
    // Re-checked at execution time: a link may have appeared since the plan was made.
    inside_workspace(&ctx.workspace_root, "target.path", rel, true).map_err(|e| {
        ExecError::new(
            FailureKind::NotStarted,
            codes::PRECONDITION_FAILED,
            e.message,
        )
    })
}

impl FileAdapter {
    fn write(&self, ctx: &AdapterCtx, plan: &Resolved) -> Result<Outcome, ExecError> {
        let p = plan_parts(plan)?;
        let content = p.content.ok_or_else(|| {
            ExecError::new(
                FailureKind::NotStarted,
                codes::INVALID_STORED,
                "plan has no content",
            )
        })?;
        locate(ctx, p.rel)?;
        let (parent, current) =
            open(ctx, p.rel, true).map_err(|e| not_started("file_write_failed", e))?;
        if current != p.prior {
            return Err(ExecError::new(
                FailureKind::NotStarted,
                codes::PRECONDITION_FAILED,
                "the file changed after the operation was planned",
            ));
        }
        let tmp = format!(".{}.gaffer-{}.tmp", parent.name, ctx.operation_id);
        parent.replace(&tmp, content.as_bytes()).map_err(|e| {
            let kind = match e {
                ReplaceError::NotWritten => FailureKind::NotStarted,
                ReplaceError::NotRenamed => FailureKind::Definitive,
                ReplaceError::NotDurable => FailureKind::PossiblyPartial,
            };
            ExecError::new(kind, "file_write_failed", e.to_string())
        })?;
        self.read_back(ctx, plan)
    }

    fn delete(&self, ctx: &AdapterCtx, plan: &Resolved) -> Result<Outcome, ExecError> {
        let p = plan_parts(plan)?;
        locate(ctx, p.rel)?;
        let (parent, current) =
            open(ctx, p.rel, false).map_err(|e| not_started("file_delete_failed", e))?;
        if current != p.prior {
            return Err(ExecError::new(
                FailureKind::NotStarted,
                codes::PRECONDITION_FAILED,
                "the file changed after the operation was planned",
            ));
        }
        parent.remove().map_err(|_| {
            ExecError::new(
                FailureKind::Definitive,
                "file_delete_failed",
                "cannot delete the file",
            )
        })?;
        if parent.sync().is_err() {
            return Err(ExecError::new(
                FailureKind::PossiblyPartial,
                "file_delete_failed",
                "cannot make the delete durable",
            ));
        }
        self.read_back(ctx, plan)
    }

    /// Proves the desired end state from the disk alone.
    fn read_back(&self, ctx: &AdapterCtx, plan: &Resolved) -> Result<Outcome, ExecError> {
        let p = plan_parts(plan)?;
        locate(ctx, p.rel)?;
        let now = match open(ctx, p.rel, false) {
            Ok((_, d)) => d,
            Err(FileError::Io {
                kind: std::io::ErrorKind::NotFound,
                ..
            }) => None,
            Err(e) => {
                return Err(ExecError::new(
                    FailureKind::PossiblyPartial,
                    codes::RECONCILIATION_FAILED,
                    format!("cannot read back: {e}"),
                ));
            }
        };
        let (proven, result) = match self.kind {
            Kind::Write => {
                let content = p.content.unwrap_or_default();
                let want = crate::util::sha256_hex(content.as_bytes());
                (
                    now.as_deref() == Some(want.as_str()),
                    serde_json::json!({"path": p.rel, "sha256": want, "bytes": content.len()}),
                )
            }
            Kind::Delete => (
                now.is_none(),
                serde_json::json!({"path": p.rel, "deleted": true, "prior_sha256": p.prior}),
            ),
        };
        Ok(Outcome {
            proven,
            result: proven.then_some(result),
            upstream_status: None,
        })
    }
}

impl FileAdapter {
    fn copy(&self) -> FileAdapter {
        FileAdapter {
            kind: self.kind,
            desc: self.desc.clone(),
        }
    }

    fn resolve_blocking(&self, ctx: &AdapterCtx, input: Decoded) -> Result<Resolved, AdapterError> {
        let rel = input.target["path"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        inside_workspace(&ctx.workspace_root, "target.path", &rel, true)?;
        let prior = match open(ctx, &rel, false) {
            Ok((_, d)) => d,
            // A missing parent directory is created at execution.
            Err(FileError::Io {
                kind: std::io::ErrorKind::NotFound,
                ..
            }) => None,
            Err(
                e
                @ (FileError::NotRegular { .. } | FileError::TooLarge { .. } | FileError::Link(_)),
            ) => {
                return Err(AdapterError::input(Some("target.path"), e.to_string()));
            }
            Err(_) => {
                return Err(AdapterError::coded(
                    codes::PROVIDER_UNAVAILABLE,
                    "cannot read the current file",
                ));
            }
        };
        if self.kind == Kind::Delete && prior.is_none() {
            return Err(AdapterError::coded(
                codes::PRECONDITION_FAILED,
                format!("{rel} does not exist"),
            ));
        }
        Ok(Resolved {
            target: input.target,
            arguments: input.arguments,
            preconditions: to_value(&Pinned {
                prior_sha256: prior,
            }),
        })
    }
}

impl Adapter for FileAdapter {
    fn descriptor(&self) -> &Descriptor {
        &self.desc
    }

    fn decode<'a>(
        &'a self,
        target: &'a Value,
        arguments: &'a Value,
    ) -> BoxFuture<'a, Result<Decoded, AdapterError>> {
        ready((|| {
            let t: FileTarget = decode_closed("target", target)?;
            let path = normalize_relative("target.path", &t.path)?;
            let arguments = match self.kind {
                Kind::Write => {
                    let a: WriteArgs = decode_closed("arguments", arguments)?;
                    if a.content.len() > MAX_CONTENT_BYTES {
                        return Err(AdapterError::input(
                            Some("arguments.content"),
                            format!("content is larger than {MAX_CONTENT_BYTES} bytes"),
                        ));
                    }
                    to_value(&a)
                }
                Kind::Delete => to_value(&decode_closed::<NoArgs>("arguments", arguments)?),
            };
            Ok(Decoded {
                target: serde_json::json!({ "path": path }),
                arguments,
            })
        })())
    }

    fn resolve<'a>(
        &'a self,
        ctx: &'a AdapterCtx,
        input: Decoded,
    ) -> BoxFuture<'a, Result<Resolved, AdapterError>> {
        let (a, ctx) = (self.copy(), ctx.clone());
        // Reading the file may be slow (a big file, a slow disk): never on an async thread.
        Box::pin(async move {
            tokio::task::spawn_blocking(move || a.resolve_blocking(&ctx, input))
                .await
                .unwrap_or_else(|_| {
                    Err(AdapterError::coded(
                        codes::PROVIDER_UNAVAILABLE,
                        "the file task stopped",
                    ))
                })
        })
    }

    fn authorize<'a>(
        &'a self,
        plan: &'a Resolved,
    ) -> BoxFuture<'a, Result<Classification, AdapterError>> {
        let path = plan.target["path"].as_str().unwrap_or_default().to_string();
        let mut fields = BTreeMap::new();
        fields.insert("path".to_string(), BTreeSet::from([path]));
        ready(Ok(Classification {
            target_kind: "file".into(),
            fields,
            attrs: BTreeMap::new(),
            must_name: Default::default(),
            argv: None,
        }))
    }

    fn present<'a>(
        &'a self,
        plan: &'a Resolved,
    ) -> BoxFuture<'a, Result<Presentation, AdapterError>> {
        let path = plan.target["path"].as_str().unwrap_or_default();
        let existed = !plan.preconditions["prior_sha256"].is_null();
        let p = match self.kind {
            Kind::Write => {
                let n = plan.arguments["content"]
                    .as_str()
                    .map(str::len)
                    .unwrap_or(0);
                Presentation {
                    title: format!("Write {path}"),
                    summary: format!(
                        "{} {path} with {n} bytes",
                        if existed { "Replace" } else { "Create" }
                    ),
                }
            }
            Kind::Delete => Presentation {
                title: format!("Delete {path}"),
                summary: format!("Remove the file {path} from the workspace"),
            },
        };
        ready(p.bounded())
    }

    fn execute<'a>(
        &'a self,
        ctx: &'a AdapterCtx,
        plan: &'a Resolved,
    ) -> BoxFuture<'a, Result<Outcome, ExecError>> {
        Box::pin(async move {
            let ctx = ctx.clone();
            let plan = plan.clone();
            let kind = self.kind;
            let desc = self.desc.clone();
            // File I/O with fsync blocks; keep it off the async workers.
            tokio::task::spawn_blocking(move || {
                let a = FileAdapter { kind, desc };
                match kind {
                    Kind::Write => a.write(&ctx, &plan),
                    Kind::Delete => a.delete(&ctx, &plan),
                }
            })
            .await
            .unwrap_or_else(|_| {
                Err(ExecError::new(
                    FailureKind::PossiblyPartial,
                    codes::UPSTREAM_UNKNOWN,
                    "the file task stopped unexpectedly",
                ))
            })
        })
    }

    fn reconcile<'a>(
        &'a self,
        ctx: &'a AdapterCtx,
        plan: &'a Resolved,
    ) -> BoxFuture<'a, Result<Outcome, ExecError>> {
        let (a, ctx, plan) = (self.copy(), ctx.clone(), plan.clone());
        Box::pin(async move {
            tokio::task::spawn_blocking(move || a.read_back(&ctx, &plan))
                .await
                .unwrap_or_else(|_| {
                    Err(ExecError::new(
                        FailureKind::PossiblyPartial,
                        codes::RECONCILIATION_FAILED,
                        "the file task stopped",
                    ))
                })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn ctx(root: &Path) -> AdapterCtx {
        AdapterCtx {
            workspace_root: root.to_path_buf(),
            operation_id: "op_test".into(),
            client_id: "agent".into(),
            sandbox: Default::default(),
        }
    }

    fn adapter(kind: Kind) -> FileAdapter {
        FileAdapter {
            kind,
            desc: match kind {
                Kind::Write => write_descriptor(),
                Kind::Delete => delete_descriptor(),
            },
        }
    }

    #[tokio::test]
    async fn write_pins_the_prior_digest_executes_atomically_and_proves_by_reading_back() {
        let ws = tempfile::tempdir().unwrap();
        let c = ctx(ws.path());
        let a = adapter(Kind::Write);
        let d = a
            .decode(
                &serde_json::json!({"path": "./docs//a.md"}),
                &serde_json::json!({"content": "hello"}),
            )
            .await
            .unwrap();
        assert_eq!(d.target, serde_json::json!({"path": "docs/a.md"}));
        let plan = a.resolve(&c, d).await.unwrap();
        assert_eq!(
            plan.preconditions,
            serde_json::json!({"prior_sha256": null})
        );
        assert!(!a.reconcile(&c, &plan).await.unwrap().proven);
        let out = a.execute(&c, &plan).await.unwrap();
        assert!(out.proven);
        assert_eq!(
            std::fs::read_to_string(ws.path().join("docs/a.md")).unwrap(),
            "hello"
        );
        assert_eq!(out.result.unwrap()["bytes"], 5);
        assert!(a.reconcile(&c, &plan).await.unwrap().proven);
        // Executing the same plan again fails its precondition instead of writing twice.
        let again = a.execute(&c, &plan).await.unwrap_err();
        assert_eq!(again.code, codes::PRECONDITION_FAILED);
        assert_eq!(again.kind, FailureKind::NotStarted);
        // No temp files left behind.
        let names: Vec<_> = std::fs::read_dir(ws.path().join("docs")).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[tokio::test]
    async fn closed_schema_names_the_bad_field() {
        let a = adapter(Kind::Write);
        let e = a
            .decode(
                &serde_json::json!({"path": "a", "mode": 7}),
                &serde_json::json!({"content": ""}),
            )
            .await
            .unwrap_err();
        assert_eq!(e.code, codes::INPUT_INVALID);
        assert!(e.message.contains("mode"), "{e}");
        let e = a
            .decode(
                &serde_json::json!({"path": "a"}),
                &serde_json::json!({"content": 5}),
            )
            .await
            .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("arguments.content"));
        let e = a
            .decode(
                &serde_json::json!({"path": "../x"}),
                &serde_json::json!({"content": ""}),
            )
            .await
            .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("target.path"));
        let e = a
            .decode(&serde_json::json!([]), &serde_json::json!({"content": ""}))
            .await
            .unwrap_err();
        assert_eq!(e.field.as_deref(), Some("target"));
        let del = adapter(Kind::Delete);
        assert!(
            del.decode(
                &serde_json::json!({"path": "a"}),
                &serde_json::json!({"x": 1})
            )
            .await
            .is_err()
        );
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn symlink_escapes_are_refused_at_resolve_and_at_execute() {
        let ws = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let c = ctx(ws.path());
        let a = adapter(Kind::Write);
        std::os::unix::fs::symlink(outside.path(), ws.path().join("link")).unwrap();
        let d = a
            .decode(
                &serde_json::json!({"path": "link/x"}),
                &serde_json::json!({"content": "x"}),
            )
            .await
            .unwrap();
        assert!(a.resolve(&c, d).await.is_err());
        // A link planted after planning is caught before writing.
        let d = a
            .decode(
                &serde_json::json!({"path": "later/x"}),
                &serde_json::json!({"content": "x"}),
            )
            .await
            .unwrap();
        let plan = a.resolve(&c, d).await.unwrap();
        std::os::unix::fs::symlink(outside.path(), ws.path().join("later")).unwrap();
        let e = a.execute(&c, &plan).await.unwrap_err();
        assert_eq!(e.kind, FailureKind::NotStarted);
        assert!(!outside.path().join("x").exists());
    }

    #[tokio::test]
    async fn delete_needs_an_existing_file_and_proves_absence() {
        let ws = tempfile::tempdir().unwrap();
        let c = ctx(ws.path());
        let a = adapter(Kind::Delete);
        let d = a
            .decode(&serde_json::json!({"path": "gone"}), &serde_json::json!({}))
            .await
            .unwrap();
        assert_eq!(
            a.resolve(&c, d.clone()).await.unwrap_err().code,
            codes::PRECONDITION_FAILED
        );
        std::fs::write(ws.path().join("gone"), "bye").unwrap();
        let plan = a.resolve(&c, d).await.unwrap();
        assert!(!a.reconcile(&c, &plan).await.unwrap().proven);
        // A change after planning blocks the delete.
        std::fs::write(ws.path().join("gone"), "changed").unwrap();
        assert_eq!(
            a.execute(&c, &plan).await.unwrap_err().code,
            codes::PRECONDITION_FAILED
        );
        std::fs::write(ws.path().join("gone"), "bye").unwrap();
        assert!(a.execute(&c, &plan).await.unwrap().proven);
        assert!(!ws.path().join("gone").exists());
        assert!(a.reconcile(&c, &plan).await.unwrap().proven);
    }

    #[test]
    fn catalog_matches_adapters() {
        let reg = crate::operations::adapter::Registry::new(&[catalog()], adapters()).unwrap();
        assert_eq!(reg.names(), vec!["file.delete", "file.write"]);
        let d = reg.lookup("file.write").unwrap().descriptor();
        assert_eq!(d.target_schema.value()["additionalProperties"], false);
    }
}
