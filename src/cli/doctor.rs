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
    checks.push(anchor_check(root));
    checks.push(lock_check(&dir));
    checks.push(seal_check(root));
    key_checks(root, &mut checks);
    trust_checks(root, &mut checks);
    checks.push(command_rules_check(root));
    checks.push(sandbox_check(root));
    let ok = checks.iter().all(|c| c.ok);
    Report {
        ok,
        workspace: root.display().to_string(),
        checks,
    }
}

/// Whether the store's lock is free: writers hold it for one batch, so a lock held for as
/// long as a waiting writer is patient is kept by some process, and every write waits for
/// it. Named, never taken away. (The file at the path: a server holding its handle on a file
/// the agent renamed away is not seen here, but its own log names what it waits for.)
fn lock_check(dir: &Path) -> Check {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join("lock");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path);
    let (ok, detail) = match file {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            (true, "no lock file yet: nobody has written".to_string())
        }
        Err(e) => (false, format!("{}: {e}", path.display())),
        Ok(file) => match lock_free_within(&file, crate::store::lock_wait::PATIENCE) {
            Ok(true) => (true, "free".to_string()),
            Ok(false) => (
                false,
                format!(
                    "{} holds {} and every write to this workspace waits for it",
                    crate::store::lock_wait::named_holders(&file),
                    path.display()
                ),
            ),
            Err(e) => (false, format!("{}: {e}", path.display())),
        },
    };
    Check {
        name: "store lock",
        ok,
        detail,
    }
}

/// Whether `file`'s lock can be taken (and is let go at once) within `patience`: a writer
/// holds it for one batch, which a slow disk can make long.
fn lock_free_within(file: &std::fs::File, patience: std::time::Duration) -> std::io::Result<bool> {
    let until = std::time::Instant::now() + patience;
    loop {
        match file.try_lock() {
            Ok(()) => return file.unlock().map(|()| true),
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < until => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(std::fs::TryLockError::WouldBlock) => return Ok(false),
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
    }
}

/// The store against what this machine anchored of it, outside the workspace.
fn anchor_check(root: &Path) -> Check {
    let (standing, dir) = match crate::workspace::Workspace::open(root) {
        Ok(ws) => (
            ws.standing(),
            ws.restricting_anchor()
                .map(|a| a.dir().display().to_string()),
        ),
        Err(e) => (
            crate::anchor::Standing::Unavailable {
                detail: format!("the workspace cannot be opened: {e}"),
            },
            None,
        ),
    };
    let place = dir.map(|d| format!(" (anchor: {d})")).unwrap_or_default();
    Check {
        name: "anchor",
        ok: standing.is_intact(),
        detail: match standing.refusal() {
            Some(why) => format!("{why}{place}"),
            None => format!("the store reaches the head this machine anchored{place}"),
        },
    }
}

/// The key requests accepted here are sealed with (`crate::operations::seal`): without it no
/// request can be verified, and none approved. Looked at, never created.
fn seal_check(root: &Path) -> Check {
    let anchor = crate::workspace::Workspace::open(root)
        .ok()
        .and_then(|ws| ws.restricting_anchor());
    let (ok, detail) = match anchor {
        None => (
            true,
            "no anchor yet: the seal key is made with it, on the first request".to_string(),
        ),
        Some(a) => {
            let path = a.dir().join("seal.key");
            match a.existing_seal_key() {
                Ok(Some(_)) => (
                    true,
                    format!("requests accepted here are sealed with {}", path.display()),
                ),
                Ok(None) => (
                    true,
                    format!(
                        "{} is made on the first request accepted here",
                        path.display()
                    ),
                ),
                Err(e) => (
                    false,
                    format!("{e}: no request can be verified or approved"),
                ),
            }
        }
    };
    Check {
        name: "seal key",
        ok,
        detail,
    }
}

/// Allow rules for `command.run` that name no arguments, in the policy on disk (what the
/// operator would trust) and the one in force.
fn command_rules_check(root: &Path) -> Check {
    use crate::operations::policy::Policy;
    let disk = Policy::load(&root.join(".gaffer")).unwrap_or_default();
    let mut broad = disk.broad_command_rules();
    if let Ok(ws) = crate::workspace::Workspace::open(root) {
        let key = crate::operator::current_public();
        let trusted = crate::operations::trust::effective_policy(&ws, key.as_ref());
        broad.extend(trusted.broad_command_rules());
    }
    broad.sort();
    broad.dedup();
    Check {
        name: "command_rules",
        ok: broad.is_empty(),
        detail: if broad.is_empty() {
            "every allow rule for command.run names its arguments (argv)".into()
        } else {
            format!(
                "broad: allow rule(s) {} let command.run run a program with any arguments (`program: [git]` is arbitrary code); name them with `argv` patterns",
                broad.join(", ")
            )
        },
    }
}

/// Whether processes are started sandboxed here: what the kernel offers and what the trusted
/// policy says (`sandbox: off`; an untrusted file saying so is ignored).
fn sandbox_check(root: &Path) -> Check {
    use crate::sandbox::{Confinement, Setting};
    let s = crate::sandbox::probe();
    let trusted = crate::workspace::Workspace::open(root)
        .map(|ws| {
            let key = crate::operator::current_public();
            crate::operations::trust::effective_policy(&ws, key.as_ref()).sandbox
        })
        .unwrap_or_default();
    let disk = crate::operations::policy::Policy::load(&root.join(".gaffer"))
        .map(|p| p.sandbox)
        .unwrap_or_default();
    let ignored = if disk != trusted && trusted == Setting::Required {
        " (policy.yaml loosens the sandbox, but that is not what the operator trusted: ignored)"
    } else {
        ""
    };
    let kernel = format!(
        "Landlock ABI {}, user namespaces{}",
        s.landlock_abi,
        if s.own_proc {
            " and a /proc of its own"
        } else {
            ""
        }
    );
    let (ok, detail) = match crate::sandbox::decide(trusted, &s) {
        Ok(Confinement::Sandboxed { own_proc: true }) => (
            true,
            format!("{kernel}: every process gaffer starts is sandboxed{ignored}"),
        ),
        Ok(Confinement::Sandboxed { own_proc: false }) => (
            false,
            format!(
                "{kernel}: every process gaffer starts is sandboxed, but {}, and the trusted policy says `sandbox: shared_proc`: they see every host process's command line in /proc",
                crate::sandbox::NO_OWN_PROC
            ),
        ),
        Ok(Confinement::Unconfined) => (
            false,
            format!(
                "the trusted policy says `sandbox: off`: workers, commands and providers start unconfined (kernel: {})",
                s.problem().unwrap_or(kernel)
            ),
        ),
        Err(e) => (
            false,
            format!("{e}: gaffer refuses to start workers, commands and providers{ignored}"),
        ),
    };
    Check {
        name: "sandbox",
        ok,
        detail,
    }
}

/// The private key must sit outside the workspace; serving processes need only the public one.
fn key_checks(root: &Path, checks: &mut Vec<Check>) {
    use crate::operator::{OperatorPublic, OperatorSigner, key_path, public_key_path};
    let (Ok(private), Ok(public)) = (key_path(), public_key_path()) else {
        checks.push(Check {
            name: "operator_key",
            ok: true,
            detail: "no config directory (set GAFFER_OPERATOR_KEY_FILE)".into(),
        });
        return;
    };
    let inside = |p: &Path| {
        p.canonicalize()
            .ok()
            .zip(root.canonicalize().ok())
            .is_some_and(|(k, r)| k.starts_with(r))
    };
    let (ok, detail) = if inside(&private) {
        (
            false,
            format!(
                "{} is inside the workspace: an agent could read it and approve its own operations",
                private.display()
            ),
        )
    } else {
        match OperatorSigner::load_from(&private) {
            Ok(_) => (true, format!("{} present (Ed25519)", private.display())),
            Err(crate::operator::OperatorKeyError::Missing(_)) => (
                true,
                format!(
                    "{} not readable here (fine for a serving process: it needs only the public key)",
                    private.display()
                ),
            ),
            Err(e) => (false, e.to_string()),
        }
    };
    checks.push(Check {
        name: "operator_key",
        ok,
        detail,
    });
    let (ok, detail) = match OperatorPublic::load_from(&public) {
        Ok(k) => (
            true,
            format!(
                "{} present, fingerprint {}",
                public.display(),
                k.fingerprint()
            ),
        ),
        Err(crate::operator::OperatorKeyError::Missing(p)) => (
            true,
            format!(
                "no public key at {}: approvals, trust and operator logins cannot be verified until `gaffer operator init`",
                p.display()
            ),
        ),
        Err(e) => (false, e.to_string()),
    };
    checks.push(Check {
        name: "operator_public_key",
        ok,
        detail,
    });
}

/// Policy and providers act only as far as the operator's signature covers them.
fn trust_checks(root: &Path, checks: &mut Vec<Check>) {
    use crate::operations::trust::{TrustStatus, check};
    let Ok(ws) = crate::workspace::Workspace::open(root) else {
        return;
    };
    let key = crate::operator::current_public();
    for (name, file) in [
        ("policy_trust", "policy.yaml"),
        ("providers_trust", "providers.yaml"),
    ] {
        let (ok, detail) = match check(&ws, file, key.as_ref()) {
            Ok(c) => {
                let ok = matches!(c.status, TrustStatus::Absent | TrustStatus::Trusted)
                    && c.invalid_records == 0;
                let effect = match c.status {
                    TrustStatus::Absent | TrustStatus::Trusted => "",
                    TrustStatus::Changed | TrustStatus::Deleted => {
                        ": the last trusted content is enforced and the file's new allow rules are ignored; review it and run `gaffer trust` to accept it"
                    }
                    TrustStatus::ContentMissing => {
                        ": every operation is refused until the operator trusts the file again"
                    }
                    TrustStatus::RolledBack => {
                        ": every operation is refused; see `gaffer store verify`, and trust the file again once the store is accepted"
                    }
                    _ if file == "policy.yaml" => {
                        ": its allow rules are ignored (every operation not denied needs a human); run `gaffer trust` after reviewing it"
                    }
                    _ => {
                        ": external providers are not started; run `gaffer trust` after reviewing it"
                    }
                };
                let forged = if c.invalid_records > 0 {
                    format!(
                        " ({} trust record(s) in the journal do not verify and are ignored)",
                        c.invalid_records
                    )
                } else {
                    String::new()
                };
                (
                    ok,
                    format!(".gaffer/{file}: {}{effect}{forged}", c.status.describe()),
                )
            }
            Err(e) => (false, e.to_string()),
        };
        checks.push(Check { name, ok, detail });
    }
}
