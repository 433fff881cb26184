//! `gaffer doctor`: read-only checks a user runs when something looks wrong.

use std::path::Path;

use serde::Serialize;

#[derive(Debug, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    pub detail: String,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub ok: bool,
    pub workspace: String,
    pub checks: Vec<Check>,
}

pub fn run(root: &Path) -> Report {
    let mut checks = Vec::new();
    checks.push(Check {
        name: "workspace",
        ok: root.is_dir(),
        detail: format!(
            "{} {}",
            root.display(),
            if root.is_dir() {
                "is a directory"
            } else {
                "is not a directory"
            }
        ),
    });
    let dir = root.join(".gaffer");
    if dir.is_dir() {
        match crate::store::verify(&dir) {
            Ok(r) => checks.push(Check {
                name: "store",
                ok: r.ok,
                detail: serde_json::to_string(&r).unwrap_or_default(),
            }),
            Err(e) => checks.push(Check {
                name: "store",
                ok: false,
                detail: e.to_string(),
            }),
        }
    } else {
        checks.push(Check {
            name: "store",
            ok: true,
            detail: "no .gaffer/ yet; it is created on the first write".into(),
        });
    }
    match crate::operations::operator::key_path() {
        Ok(path) => {
            let inside = path
                .canonicalize()
                .ok()
                .zip(root.canonicalize().ok())
                .is_some_and(|(k, r)| k.starts_with(r));
            checks.push(Check {
                name: "operator_key",
                ok: !inside,
                detail: if inside {
                    format!("{} is inside the workspace: an agent could read it and approve its own operations", path.display())
                } else if path.is_file() {
                    format!("{} present", path.display())
                } else {
                    format!("{} missing: operator connections are refused until `gaffer operator init`", path.display())
                },
            });
        }
        Err(_) => checks.push(Check {
            name: "operator_key",
            ok: true,
            detail: "no config directory (set GAFFER_OPERATOR_KEY_FILE)".into(),
        }),
    }
    // Policy and providers act only while the operator's signature covers them.
    for (name, file) in [
        ("policy_trust", "policy.yaml"),
        ("providers_trust", "providers.yaml"),
    ] {
        match crate::operations::trust::check(&dir, file) {
            Ok(c) => {
                use crate::operations::trust::TrustStatus;
                let ok = matches!(c.status, TrustStatus::Absent | TrustStatus::Trusted);
                let effect = match (file, ok) {
                    (_, true) => "",
                    ("policy.yaml", false) => {
                        ": its allow rules are ignored (every operation not denied needs a human); run `gaffer trust` after reviewing it"
                    }
                    _ => {
                        ": external providers are not started; run `gaffer trust` after reviewing it"
                    }
                };
                checks.push(Check {
                    name,
                    ok,
                    detail: format!(".gaffer/{file}: {}{effect}", c.status.describe()),
                });
            }
            Err(e) => checks.push(Check {
                name,
                ok: false,
                detail: e.to_string(),
            }),
        }
    }
    let ok = checks.iter().all(|c| c.ok);
    Report {
        ok,
        workspace: root.display().to_string(),
        checks,
    }
}
