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
    let ok = checks.iter().all(|c| c.ok);
    Report {
        ok,
        workspace: root.display().to_string(),
        checks,
    }
}
