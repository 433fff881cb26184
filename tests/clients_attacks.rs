//! An agent that can read and write `.gaffer/` tries to become a named client: by rebuilding a
//! credential's token from the journal's `client.issued` record, and by using a revoked token
//! in a copy of the workspace whose journal it cut back before the revocation. The primary
//! assertion is that the write only `ci-agent` may make never lands.

mod common;

use common::Server;
use common::forge::*;
use common::gate::*;
use serde_json::{Value, json};

/// Only `ci-agent` may write under `out/`; everyone else is denied.
const CI_WRITES_OUT: &str = r#"
rules:
  - id: ci-writes-out
    effect: allow
    clients: ["ci-agent"]
    operations: ["file.write"]
    targets: [{kind: file, fields: {path: ["out/**"]}}]
"#;

/// A connection to the workspace at `root` presenting `token`: the initialize reply (or
/// error) and the connection.
fn present(env: &Env, root: &std::path::Path, token: &str) -> (Value, Server) {
    let key = env.key_file.display().to_string();
    let mut s = Server::start_env(
        root,
        common::Wire::Ndjson,
        &[],
        &[("GAFFER_OPERATOR_KEY_FILE", key.as_str())],
    );
    let r = s.request(
        "initialize",
        json!({"clientInfo": {"name": "ci-agent"}, "initializationOptions": {"clientToken": token}}),
    );
    (r, s)
}

fn write_out(s: &mut Server, key: &str) -> Value {
    submit(
        s,
        "file.write",
        json!({"path": "out/pwned.txt"}),
        json!({"content": "written as ci-agent by the agent\n"}),
        key,
    )
}

#[test]
fn a_token_rebuilt_from_the_journal_is_no_credential() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(CI_WRITES_OUT));
    // The operator issues ci-agent's token; the CI host keeps it, the agent never sees it.
    let real = env.token("ci-agent");
    // The agent reads the journal's record of it and makes every token it could.
    let seg = the_segment(env.root());
    let i = seg.find("client.issued", |kind, _| kind == "client.issued");
    let sig = seg.recs[i].payload()["operator_signature"].clone();
    let payload = sig["payload"].as_str().unwrap();
    let signature = sig["signature"].as_str().unwrap();
    let recorded: Value = serde_json::from_str(payload).unwrap();
    let old_form = format!(
        "{}.{signature}",
        gaffer::util::base64url(payload.as_bytes())
    );
    let secret = real.rsplit('.').next().unwrap();
    assert!(
        !seg.recs[i]
            .body
            .windows(secret.len())
            .any(|w| w == secret.as_bytes()),
        "the record holds the token's secret"
    );
    let digest = recorded["secret_sha256"].as_str().unwrap();
    for forged in [
        old_form.clone(),
        format!("{old_form}."),
        format!("{old_form}.{digest}"),
        format!("{old_form}.{}", &secret[..secret.len() - 1]),
    ] {
        let (r, mut s) = present(&env, env.root(), &forged);
        assert_eq!(
            r["error"]["data"]["code"], "client_credential_invalid",
            "{forged}: {r}"
        );
        // Refused, the agent goes on as anonymous: the rule naming ci-agent does not match.
        s.call("initialize", json!({}));
        let v = ok(&write_out(&mut s, "k")).clone();
        assert_eq!(v["client_id"], "anonymous", "{v}");
        assert_eq!(v["state"], "denied", "{v}");
    }
    assert!(!env.root().join("out/pwned.txt").exists());
    // The token the operator handed out is the credential.
    let (r, mut s) = present(&env, env.root(), &real);
    assert_eq!(r["result"]["client"], "ci-agent", "{r}");
    let v = ok(&write_out(&mut s, "real")).clone();
    let v = wait_state(&mut s, v["id"].as_str().unwrap(), &["succeeded", "failed"]);
    assert_eq!(v["state"], "succeeded", "{v}");
}

/// The operator revoked ci-agent's credential; the agent, holding the old token, copies the
/// workspace's store into a directory of the workspace, cuts the copy's journal back before
/// the revocation and connects to the copy (a host that takes the workspace root from the
/// client does that on the agent's word).
#[test]
fn a_revoked_credential_stays_revoked_in_a_copy_cut_back_before_the_revocation() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(CI_WRITES_OUT));
    let token = env.token("ci-agent");
    let (code, out, err) = env.cli(&["client", "revoke", "ci-agent"]);
    assert_eq!(code, 0, "gaffer client revoke: {out}{err}");
    // The token is never shown to the original store first: `gaffer client revoke` itself
    // must have made the revocation last.
    refused_in_a_cut_back_copy(&env, &token, |seg| {
        seg.find("client.revoked", |kind, _| kind == "client.revoked")
    });
    let (r, _s) = present(&env, env.root(), &token);
    assert_eq!(
        r["error"]["data"]["code"], "client_credential_invalid",
        "{r}"
    );
}

/// Before the operator revokes it, the agent floods ci-agent's credential with forged
/// revocation records (so the credential already looks revoked, and a revoke that signed only
/// for credentials not yet revoked would sign nothing); after the operator's revoke it cuts a
/// copy back before the flood.
#[test]
fn a_flood_of_forged_revocations_does_not_stop_the_operators() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(CI_WRITES_OUT));
    let token = env.token("ci-agent");
    let cid = credential_id(&token);
    flood_client_revocations(env.root(), &cid, 8);
    let (code, out, err) = env.cli(&["client", "revoke", "ci-agent"]);
    assert_eq!(code, 0, "gaffer client revoke: {out}{err}");
    let done: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(done["signed"], json!([cid]), "{done}");
    refused_in_a_cut_back_copy(&env, &token, |seg| {
        (0..seg.recs.len())
            .find(|&i| seg.recs[i].kind() == "client.revoked")
            .expect("the flood")
    });
}

/// Copies the store into `sub/` of the workspace, cuts the copy's journal back before the
/// batch holding the record `first_cut` picks (and so before every revocation after it), and
/// checks that `token` proves no name there and writes nothing.
fn refused_in_a_cut_back_copy(env: &Env, token: &str, first_cut: impl Fn(&Segment) -> usize) {
    let copy = env.root().join("sub");
    std::fs::create_dir_all(&copy).unwrap();
    let st = std::process::Command::new("cp")
        .arg("-a")
        .arg(env.root().join(".gaffer"))
        .arg(copy.join(".gaffer"))
        .status()
        .unwrap();
    assert!(st.success());
    let seg = the_segment(&copy);
    let i = first_cut(&seg);
    seg.cut_before(seg.batch_start(i));
    assert!(
        the_segment(&copy)
            .recs
            .iter()
            .all(|r| r.kind() != "client.revoked"),
        "the copy's journal no longer holds a revocation"
    );
    let (r, mut s) = present(env, &copy, token);
    assert_eq!(
        r["error"]["data"]["code"], "client_credential_invalid",
        "a revoked token proved its name in a cut-back copy: {r}"
    );
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("revoked"),
        "{r}"
    );
    s.call("initialize", json!({}));
    let v = ok(&write_out(&mut s, "copy")).clone();
    assert_eq!(v["client_id"], "anonymous", "{v}");
    assert!(!copy.join("out/pwned.txt").exists());
}
