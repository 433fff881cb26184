//! The operator key: a secret kept outside the workspace (the user's config directory) that
//! proves a connection is a human operator. An agent that can write the workspace cannot read
//! it (when the user keeps it out of the agent's sandbox), so it cannot approve its own work.

use std::path::PathBuf;

use sha2::{Digest, Sha256};

use crate::rpc::{AppCode, RpcError};

/// `$GAFFER_OPERATOR_KEY_FILE`, else `$XDG_CONFIG_HOME/gaffer/operator.key`, else
/// `~/.config/gaffer/operator.key`.
pub fn key_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("GAFFER_OPERATOR_KEY_FILE") {
        return Some(PathBuf::from(p));
    }
    let config = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(config.join("gaffer").join("operator.key"))
}

/// The key as stored (trimmed text), or None when there is none.
pub fn load_key() -> Option<String> {
    let path = key_path()?;
    let text = std::fs::read_to_string(&path).ok()?;
    let key = text.trim().to_string();
    (!key.is_empty()).then_some(key)
}

/// Equal-time comparison of two secrets (compares their digests, so lengths leak nothing).
pub fn same_secret(a: &str, b: &str) -> bool {
    let da = Sha256::digest(a.as_bytes());
    let db = Sha256::digest(b.as_bytes());
    da.iter()
        .zip(db.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// Checks a presented operator key against the one on disk.
pub fn authenticate(presented: &str) -> Result<(), RpcError> {
    let Some(key) = load_key() else {
        return Err(RpcError::app(
            AppCode::Forbidden,
            "operator_key_missing",
            "no operator key is set up on this machine; run `gaffer operator init`",
        ));
    };
    if presented.is_empty() || !same_secret(presented, &key) {
        return Err(RpcError::app(
            AppCode::Forbidden,
            "operator_key_invalid",
            "the operator key does not match",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_comparison() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "abcd"));
    }
}
