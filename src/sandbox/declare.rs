//! Bundle declarations the sandbox enforces; any other kind fails closed.
//!
//! - `mount_grant` `mount:read:VAR` or `mount:write:VAR`: the tree at the absolute path in
//!   gaffer's environment variable `VAR` becomes readable (and writable). Like secrets, the
//!   path comes from the environment the operator started gaffer with, never from the bundle;
//!   `.gaffer/` stays covered whatever is granted. The path is resolved each time a process
//!   starts ([`resolve_grant`]), never through the workspace (whose entries the agent can
//!   swap for links), and opened without following links;
//! - `network_policy` `network:tcp-connect:PORT`: TCP connections to that port are allowed
//!   (the process then shares gaffer's network namespace; Landlock allows no other TCP bind or
//!   connect); `network:none`, the default: no network at all;
//! - `secret_ref` `env:NAME`: passed by the runtime, nothing to confine.

use std::path::{Component, Path, PathBuf};

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
    // Without a workspace the spec is only checked, never used.
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
    // Checked now for a clear refusal at creation; resolved again, and opened without
    // following links, when the process starts (`rules::build`).
    resolve_grant(&path, workspace, true).map_err(|why| refuse(d, &why))?;
    Ok(Grant { path, write })
}

/// Where a granted path leads, resolved one component at a time as the kernel would, so that
/// every place the resolution passes through is checked and not only where it ends: none may
/// lie in `workspace`, whose entries the agent can swap for links (a link of the operator's
/// into the workspace, where the agent's link leads out again, would let the agent choose).
/// Unless `may_hold_workspace`, the path may not hold the workspace either (a process given
/// none of the workspace, reading it through its parent). The result has no links: it is
/// opened with `RESOLVE_NO_SYMLINKS`, so nothing swapped in after this redirects it.
pub fn resolve_grant(
    path: &Path,
    workspace: Option<&Path>,
    may_hold_workspace: bool,
) -> Result<PathBuf, String> {
    const IN_WS: &str = "the granted path lies in the workspace or leads through it, and the agent can swap its entries";
    let roots: Vec<PathBuf> = workspace
        .map(|ws| {
            std::iter::once(ws.to_path_buf())
                .chain(std::fs::canonicalize(ws))
                .collect()
        })
        .unwrap_or_default();
    let inside = |p: &Path| roots.iter().any(|r| p.starts_with(r));
    let mut todo: Vec<std::ffi::OsString> = Vec::new();
    let push = |todo: &mut Vec<std::ffi::OsString>, p: &Path| {
        for c in p.components().rev() {
            match c {
                Component::Normal(n) => todo.push(n.to_os_string()),
                Component::ParentDir => todo.push("..".into()),
                _ => {}
            }
        }
    };
    push(&mut todo, path);
    let mut done = PathBuf::from("/");
    let mut links = 0;
    while let Some(c) = todo.pop() {
        if c == ".." {
            done.pop();
            continue;
        }
        let next = done.join(&c);
        if inside(&next) {
            return Err(IN_WS.into());
        }
        let meta = std::fs::symlink_metadata(&next)
            .map_err(|e| format!("the granted path {}: {e}", next.display()))?;
        if !meta.file_type().is_symlink() {
            done = next;
            continue;
        }
        links += 1;
        if links > 40 {
            return Err("the granted path leads through too many links".into());
        }
        let target = std::fs::read_link(&next)
            .map_err(|e| format!("the granted path {}: {e}", next.display()))?;
        if target.is_absolute() {
            done = PathBuf::from("/");
        }
        push(&mut todo, &target);
    }
    if !may_hold_workspace && roots.iter().any(|r| r.starts_with(&done)) {
        return Err(format!(
            "the granted path {} holds the workspace, which this process may not reach",
            done.display()
        ));
    }
    Ok(done)
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

    /// The operator's grant path lies outside the workspace but leads into it through a link
    /// of the operator's (`~/cache` -> `<workspace>/cache`), and the agent swaps the
    /// workspace's `cache` for a link out: both ends of the resolution lie outside, yet the
    /// agent chose where the grant leads. (A second reader's finding.)
    #[test]
    fn a_grant_resolved_through_the_workspace_is_refused() {
        let outside = tempfile::tempdir().expect("outside");
        let ws = tempfile::tempdir().expect("workspace");
        let secret = outside.path().join("secret");
        std::fs::create_dir(&secret).expect("mkdir");
        let in_ws = ws.path().join("cache");
        std::os::unix::fs::symlink(&secret, &in_ws).expect("the agent's link");
        let granted = outside.path().join("cache");
        std::os::unix::fs::symlink(&in_ws, &granted).expect("the operator's link");
        let got = resolve_grant(&granted, Some(ws.path()), true);
        assert!(
            got.is_err(),
            "redirected by a link in the workspace to {got:?}"
        );
        // The same path without the workspace's part in it resolves, links and all.
        let direct = outside.path().join("direct");
        std::os::unix::fs::symlink(&secret, &direct).expect("link");
        let resolved = resolve_grant(&direct, Some(ws.path()), true).expect("resolves");
        assert_eq!(resolved, std::fs::canonicalize(&secret).expect("canonical"));
    }

    /// A process given none of the workspace is not given it through its parent either.
    #[test]
    fn a_grant_holding_the_workspace_is_refused_unless_the_process_may_reach_it() {
        let home = tempfile::tempdir().expect("home");
        let ws = home.path().join("proj");
        std::fs::create_dir(&ws).expect("mkdir");
        assert!(resolve_grant(home.path(), Some(&ws), false).is_err());
        assert!(resolve_grant(home.path(), Some(&ws), true).is_ok());
    }
}
