//! Bundle declarations the sandbox enforces; any other kind fails closed.
//!
//! - `mount_grant` `mount:read:VAR` or `mount:write:VAR`: the tree at the absolute path in
//!   gaffer's environment variable `VAR` becomes readable (and writable). Like secrets, the
//!   path comes from the environment the operator started gaffer with, never from the bundle;
//!   `.gaffer/` stays covered whatever is granted. The path is resolved when the grant is
//!   made and opened without following links when the process starts, and never lies in the
//!   workspace (whose entries the agent can swap for links);
//! - `network_policy` `network:tcp-connect:PORT`: TCP connections to that port are allowed
//!   (the process then shares gaffer's network namespace; Landlock allows no other TCP bind or
//!   connect); `network:none`, the default: no network at all;
//! - `secret_ref` `env:NAME`: passed by the runtime, nothing to confine.

use std::path::Path;

use super::{Grant, SandboxError, Spec};
use crate::bundles::{Declaration, DeclarationKind};

fn refuse(d: &Declaration, why: &str) -> SandboxError {
    SandboxError::Declaration {
        name: d.name.clone(),
        why: why.to_string(),
    }
}

/// The sandbox for a worker of `workspace` with these declarations.
pub fn from_declarations(workspace: &Path, decls: &[Declaration]) -> Result<Spec, SandboxError> {
    spec_of(Some(workspace), decls)
}

/// Whether the sandbox can enforce these declarations for some workspace (a backend asked
/// before there is one).
pub fn check_declarations(decls: &[Declaration]) -> Result<(), SandboxError> {
    spec_of(None, decls).map(|_| ())
}

fn spec_of(workspace: Option<&Path>, decls: &[Declaration]) -> Result<Spec, SandboxError> {
    let mut spec = Spec::new(workspace.unwrap_or(Path::new("/")));
    for d in decls {
        match d.kind {
            DeclarationKind::SecretRef => {}
            DeclarationKind::MountGrant => spec.grants.push(mount(d, workspace)?),
            DeclarationKind::NetworkPolicy => {
                if let Some(port) = network(d)? {
                    spec.tcp_connect.push(port);
                }
            }
            kind => {
                return Err(refuse(
                    d,
                    &format!("{} cannot be enforced by the sandbox", kind.as_str()),
                ));
            }
        }
    }
    Ok(spec)
}

fn mount(d: &Declaration, workspace: Option<&Path>) -> Result<Grant, SandboxError> {
    let (write, var) = match d
        .reference
        .strip_prefix("mount:")
        .and_then(|r| r.split_once(':'))
    {
        Some(("read", v)) => (false, v),
        Some(("write", v)) => (true, v),
        _ => {
            return Err(refuse(
                d,
                "a mount_grant is `mount:read:VAR` or `mount:write:VAR`",
            ));
        }
    };
    let path = std::env::var_os(var)
        .map(std::path::PathBuf::from)
        .ok_or_else(|| {
            refuse(
                d,
                &format!("environment variable {var} is not set for gaffer"),
            )
        })?;
    if !path.is_absolute() || path.components().any(|c| c.as_os_str() == "..") {
        return Err(refuse(d, "the granted path must be absolute, without `..`"));
    }
    let path = resolve_grant(&path, workspace).map_err(|why| refuse(d, why))?;
    Ok(Grant { path, write })
}

/// A granted path as the sandbox takes it: resolved now (it is opened without following any
/// link when the process starts, so what it reaches cannot be redirected in between), and
/// never in `workspace`, whose entries the agent can swap for links before this looks.
pub fn resolve_grant(
    path: &Path,
    workspace: Option<&Path>,
) -> Result<std::path::PathBuf, &'static str> {
    let resolved = std::fs::canonicalize(path).map_err(|_| "the granted path does not exist")?;
    let inside = |ws: &Path| {
        let root = std::fs::canonicalize(ws).unwrap_or_else(|_| ws.to_path_buf());
        [path, resolved.as_path()]
            .iter()
            .any(|p| p.starts_with(ws) || p.starts_with(&root))
    };
    if workspace.is_some_and(inside) {
        return Err("the granted path lies in the workspace, whose entries the agent can swap");
    }
    Ok(resolved)
}

fn network(d: &Declaration) -> Result<Option<u16>, SandboxError> {
    if d.reference == "network:none" {
        return Ok(None);
    }
    // Only the port's own spelling: rules match the text, the sandbox the number, so `0443`
    // or `+443` would pass a deny rule naming 443 and still reach it.
    d.reference
        .strip_prefix("network:tcp-connect:")
        .and_then(|text| text.parse::<u16>().ok().filter(|p| p.to_string() == text))
        .filter(|p| *p != 0)
        .map(Some)
        .ok_or_else(|| {
            refuse(
                d,
                "a network_policy is `network:none` or `network:tcp-connect:PORT` (PORT from 1 \
                 to 65535, in decimal without sign or leading zeros)",
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decl(kind: DeclarationKind, reference: &str) -> Declaration {
        Declaration {
            kind,
            name: "d".into(),
            reference: reference.into(),
        }
    }

    #[test]
    fn declarations_map_to_grants_or_fail_closed() {
        let ws = Path::new("/ws");
        // PATH is set for every test process; use a variable that holds an absolute path.
        let dir = std::env::temp_dir();
        let var = "GAFFER_SANDBOX_UNIT_DIR";
        // SAFETY: no other test reads this variable.
        unsafe { std::env::set_var(var, &dir) };
        let s = from_declarations(
            ws,
            &[
                decl(DeclarationKind::MountGrant, &format!("mount:read:{var}")),
                decl(DeclarationKind::NetworkPolicy, "network:tcp-connect:8080"),
                decl(DeclarationKind::NetworkPolicy, "network:none"),
            ],
        )
        .unwrap();
        assert_eq!(
            s.grants,
            vec![Grant {
                path: dir,
                write: false
            }]
        );
        assert_eq!(s.tcp_connect, vec![8080]);
        let ws_dir = tempfile::tempdir().expect("workspace");
        let inside = ws_dir.path().join("cache");
        std::fs::create_dir(&inside).expect("mkdir");
        // SAFETY: no other test reads this variable.
        unsafe { std::env::set_var("GAFFER_SANDBOX_UNIT_IN_WS", &inside) };
        let ws = ws_dir.path();
        for bad in [
            decl(
                DeclarationKind::MountGrant,
                "mount:read:GAFFER_SANDBOX_UNSET_VAR",
            ),
            decl(DeclarationKind::MountGrant, &format!("mount:rw:{var}")),
            // A path in the workspace (whose entries the agent can swap for links).
            decl(
                DeclarationKind::MountGrant,
                "mount:read:GAFFER_SANDBOX_UNIT_IN_WS",
            ),
            decl(DeclarationKind::NetworkPolicy, "network:tcp-connect:0"),
            // Another spelling of a port a rule may deny by its text.
            decl(DeclarationKind::NetworkPolicy, "network:tcp-connect:08080"),
            decl(DeclarationKind::NetworkPolicy, "network:tcp-connect:+8080"),
            decl(DeclarationKind::NetworkPolicy, "network:tcp-connect:65536"),
            decl(DeclarationKind::NetworkPolicy, "network:udp:53"),
            decl(DeclarationKind::ShellPolicy, "shell:x"),
        ] {
            assert!(
                from_declarations(ws, std::slice::from_ref(&bad)).is_err(),
                "{bad:?}"
            );
        }
    }
}
