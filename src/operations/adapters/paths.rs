//! Workspace-relative path checks shared by the built-in providers.

use std::path::{Component, Path, PathBuf};

use super::super::adapter::AdapterError;
use super::super::lifecycle::codes;

const MAX_PATH_BYTES: usize = 4096;

/// Normalises a workspace-relative path without touching the disk: no absolute paths, no
/// `..`, no NUL, and never the store directory `.gaffer`. Returns `a/b/c` form.
pub fn normalize_relative(field: &str, raw: &str) -> Result<String, AdapterError> {
    let bad = |msg: &str| AdapterError::input(Some(field), msg.to_string());
    if raw.is_empty() {
        return Err(bad("path must not be empty"));
    }
    if raw.len() > MAX_PATH_BYTES || raw.contains('\0') {
        return Err(bad("path is too long or contains NUL"));
    }
    let p = Path::new(raw);
    let mut parts: Vec<String> = Vec::new();
    for c in p.components() {
        match c {
            Component::Normal(s) => match s.to_str() {
                Some(s) => parts.push(s.to_string()),
                None => return Err(bad("path must be UTF-8")),
            },
            Component::CurDir => {}
            Component::ParentDir => return Err(bad("path must not contain '..'")),
            Component::RootDir | Component::Prefix(_) => {
                return Err(bad("path must be relative to the workspace"));
            }
        }
    }
    if parts.first().is_some_and(|f| f == ".gaffer") {
        return Err(bad("the .gaffer store directory is off limits"));
    }
    Ok(parts.join("/"))
}

/// Joins a normalised relative path to the workspace root, refusing symlinks anywhere on the
/// way (they could lead outside) and non-directories in the middle. The final component may
/// be missing; missing middle directories are allowed when `allow_missing_dirs`.
pub fn inside_workspace(
    root: &Path,
    field: &str,
    rel: &str,
    allow_missing_dirs: bool,
) -> Result<PathBuf, AdapterError> {
    let root = root.canonicalize().map_err(|_| {
        AdapterError::coded(
            codes::PROVIDER_UNAVAILABLE,
            "workspace root is not readable",
        )
    })?;
    if rel.is_empty() {
        return Ok(root);
    }
    let parts: Vec<&str> = rel.split('/').collect();
    let mut cur = root.clone();
    for (i, part) in parts.iter().enumerate() {
        cur.push(part);
        let last = i + 1 == parts.len();
        match std::fs::symlink_metadata(&cur) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(AdapterError::input(
                    Some(field),
                    format!(
                        "{} is a symbolic link; links are not followed",
                        parts[..=i].join("/")
                    ),
                ));
            }
            Ok(m) if !last && !m.is_dir() => {
                return Err(AdapterError::input(
                    Some(field),
                    format!("{} is not a directory", parts[..=i].join("/")),
                ));
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if !last && !allow_missing_dirs {
                    return Err(AdapterError::input(
                        Some(field),
                        format!("{} does not exist", parts[..=i].join("/")),
                    ));
                }
                // Nothing further down can be a link if this level does not exist.
                cur.extend(&parts[i + 1..]);
                break;
            }
            Err(_) => {
                return Err(AdapterError::coded(
                    codes::PROVIDER_UNAVAILABLE,
                    format!("cannot inspect {}", parts[..=i].join("/")),
                ));
            }
        }
    }
    if !cur.starts_with(&root) {
        return Err(AdapterError::input(
            Some(field),
            "path leaves the workspace",
        ));
    }
    Ok(cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalisation_refuses_escapes_and_the_store() {
        assert_eq!(normalize_relative("p", "./a//b/./c").unwrap(), "a/b/c");
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            ".gaffer/journal",
            "a\0b",
        ] {
            let e = normalize_relative("target.path", bad).unwrap_err();
            assert_eq!(e.field.as_deref(), Some("target.path"), "{bad}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn symlinks_on_the_way_are_refused() {
        let ws = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), ws.path().join("out")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", ws.path().join("f")).unwrap();
        std::fs::create_dir(ws.path().join("d")).unwrap();
        std::fs::write(ws.path().join("plain"), "x").unwrap();
        assert!(inside_workspace(ws.path(), "p", "out/x", true).is_err());
        assert!(inside_workspace(ws.path(), "p", "f", true).is_err());
        assert!(inside_workspace(ws.path(), "p", "plain/x", true).is_err());
        assert!(inside_workspace(ws.path(), "p", "d/x", true).is_ok());
        assert!(inside_workspace(ws.path(), "p", "new/dir/x", true).is_ok());
        assert!(inside_workspace(ws.path(), "p", "new/dir/x", false).is_err());
    }
}
