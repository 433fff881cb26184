//! `gaffer trust`: the operator signs `policy.yaml` and `providers.yaml` as trusted. The agent
//! can edit both between the operator's last look and the signature, so what is signed is
//! exactly what was shown: each file's digest and how it differs from what is trusted now,
//! confirmed on the terminal, or the digests the operator names with `--expect`.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;

use serde_json::json;

use super::operations::{open_without_providers, print};
use super::operator::{confirmed, fail, signer};
use super::output::json_line;
use crate::operations::trust;
use crate::operator::OperatorPublic;
use crate::util::visible;
use crate::workspace::Workspace;

/// Most edits and bytes of one file's difference printed before the review says it stopped.
const REVIEW_EDITS: usize = 20_000;
const REVIEW_BYTES: usize = 64 * 1024;

/// Signs the files on disk now: the `--expect` ones, or those the operator confirmed after
/// reading the review (only on a terminal).
pub async fn sign(root: &Path, expect: &[String]) -> Result<ExitCode, ExitCode> {
    let mut expected = BTreeMap::new();
    for e in expect {
        let Some((file, digest)) = e.split_once('=') else {
            return Err(fail(format!("--expect {e:?}: write FILE=SHA256"), 2));
        };
        expected.insert(file.trim().to_string(), digest.trim().to_string());
    }
    let signer = signer()?;
    let app = open_without_providers(root)?;
    let ws = &app.workspace;
    if expected.is_empty() {
        expected = confirmed_review(ws, &signer.public())?;
    }
    let files: Vec<String> = expected.keys().cloned().collect();
    let signed = trust::sign(ws, &signer, &files, &expected)
        .await
        .map_err(|e| fail(format!("nothing trusted: {e}"), 1))?;
    print(&json!({
        "trusted": signed,
        "note": "a running gaffer applies the policy at once; restart it to start trusted providers",
    }));
    Ok(ExitCode::SUCCESS)
}

/// Without `--expect`: prints what signing the files on disk now would trust and asks on a
/// terminal; returns the digests shown (what the signature is then bound to). Signs nothing
/// off a terminal, nor from a review cut at its bound.
fn confirmed_review(
    ws: &Workspace,
    key: &OperatorPublic,
) -> Result<BTreeMap<String, String>, ExitCode> {
    let files: Vec<String> = trust::TRUSTED_FILES
        .iter()
        .filter(|f| ws.gaffer_dir().join(f).exists())
        .map(|f| f.to_string())
        .collect();
    if files.is_empty() {
        eprintln!("gaffer: neither policy.yaml nor providers.yaml exists; nothing to trust");
    }
    let (text, shown, whole) = review(ws, key, &files);
    eprint!("{text}");
    if !whole {
        return Err(fail(
            "nothing signed: a difference is longer than this review shows; read the files \
             and sign them with --expect FILE=SHA256 (the digests above)",
            2,
        ));
    }
    if !std::io::stdin().is_terminal() {
        return Err(fail(
            "nothing signed: confirm on a terminal, or pass --expect FILE=SHA256 for each \
             file you reviewed (the digests above)",
            2,
        ));
    }
    if !confirmed()? {
        return Err(fail("nothing signed", 1));
    }
    Ok(shown)
}

/// `gaffer trust --show`: read-only; needs only the public key.
pub fn show(root: &Path) -> Result<ExitCode, ExitCode> {
    let app = open_without_providers(root)?;
    let key = crate::operator::current_public();
    print(&json!({ "files": trust::report(&app.workspace, key.as_ref()) }));
    Ok(ExitCode::SUCCESS)
}

/// What signing `files` would trust, in words, the digest of each as shown (what the
/// signature will be bound to), and whether every difference was shown whole: per file its
/// digest, then its difference from the trusted content (all of it when nothing is trusted),
/// the agent's text spelled out.
fn review(
    ws: &Workspace,
    key: &OperatorPublic,
    files: &[String],
) -> (String, BTreeMap<String, String>, bool) {
    let mut out = String::from("gaffer: signing with the operator key, as trusted:\n");
    let mut shown = BTreeMap::new();
    let mut whole = true;
    for file in files {
        let checked = match trust::check(ws, file, Some(key)) {
            Ok(c) => c,
            Err(e) => {
                out.push_str(&format!("  {file}: cannot be read: {e}\n"));
                continue;
            }
        };
        let Some(disk) = &checked.disk else {
            out.push_str(&format!("  {file}: absent; not signed\n"));
            continue;
        };
        let digest = crate::util::sha256_hex(disk);
        out.push_str(&format!("  {file} sha256 {digest}\n"));
        let (text, complete) = difference(file, checked.trusted_bytes.as_deref(), disk);
        out.push_str(&text);
        out.push_str(&as_read(ws, file, disk));
        whole &= complete;
        shown.insert(file.clone(), digest);
    }
    (out, shown, whole)
}

/// The file as gaffer reads it, one line per rule or provider with every default filled in:
/// a text difference can look harmless while it changes what the lines around it mean (a
/// quoted string opened on one added line and closed on another swallows the rule between).
fn as_read(ws: &Workspace, file: &str, disk: &[u8]) -> String {
    let path = ws.gaffer_dir().join(file);
    let Ok(text) = std::str::from_utf8(disk) else {
        return "    (not UTF-8: it will not be signed)\n".into();
    };
    let read = if file == crate::operations::policy::POLICY_FILE {
        crate::operations::policy::Policy::parse(text, &path)
            .map(|p| {
                let mut lines: Vec<String> = p
                    .rules
                    .unwrap_or_default()
                    .iter()
                    .map(|r| format!("rule {}", json_line(r)))
                    .collect();
                if p.sandbox != crate::sandbox::Setting::Required {
                    lines.push(format!("sandbox {:?}", p.sandbox));
                }
                lines
            })
            .map_err(|e| e.to_string())
    } else {
        crate::operations::adapters::external::declared(text, &path)
    };
    match read {
        Ok(lines) if lines.is_empty() => "    as gaffer reads it: nothing declared\n".into(),
        Ok(lines) => {
            let mut out = String::from("    as gaffer reads it:\n");
            for l in lines {
                out.push_str(&format!("      {}\n", visible(&l)));
            }
            out
        }
        Err(e) => format!("    it will not be signed: {}\n", visible(&e)),
    }
}

/// How `disk` differs from the trusted bytes, as a unified diff with every line passed
/// through [`visible`], and whether it is all there (a padded file's difference is cut: the
/// lines after the cut were never shown, so they are never signed from this review).
fn difference(file: &str, trusted: Option<&[u8]>, disk: &[u8]) -> (String, bool) {
    if trusted == Some(disk) {
        return ("    (already trusted: unchanged)\n".into(), true);
    }
    let old = trusted.map(String::from_utf8_lossy).unwrap_or_default();
    let new = String::from_utf8_lossy(disk);
    let old_name = match trusted {
        Some(_) => format!("{file} (trusted now)"),
        None => "(nothing trusted)".to_string(),
    };
    let diff = crate::operations::diff::unified(
        &old,
        &new,
        &old_name,
        &format!("{file} (to sign)"),
        REVIEW_EDITS,
        REVIEW_BYTES,
    );
    let mut out = String::new();
    for line in diff.text.lines() {
        out.push_str(&format!("    {}\n", visible(line)));
    }
    if diff.truncated {
        out.push_str(&format!(
            "    [the difference goes on: {} lines added, {} removed in all; read the file]\n",
            diff.added, diff.removed
        ));
    }
    (out, !diff.truncated)
}
