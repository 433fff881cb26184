//! Finding 5: an external provider starts with a cleared environment plus only what
//! `providers.yaml` declares, inside the same sandbox as every process gaffer starts. Played
//! with the tests' Python provider, whose `probe` mode reports its environment and what
//! reading a path gave.

mod common;

use common::gate::{Env, ok, submit, wait_state};
use serde_json::{Value, json};

const POLICY: &str = "rules:\n  - id: kv\n    effect: allow\n    operations: [\"kv.*\"]\n";

fn probe(s: &mut common::Server, path: &str, key: &str) -> Value {
    let r = submit(
        s,
        "kv.set",
        json!({"key": "probe"}),
        json!({"value": path, "mode": "probe"}),
        key,
    );
    let id = ok(&r)["id"].as_str().expect("operation id").to_string();
    let v = wait_state(s, &id, &["succeeded", "failed"]);
    assert_eq!(v["state"], "succeeded", "{v}");
    v["result"].clone()
}

#[test]
fn a_provider_gets_only_its_declared_environment_and_stays_in_the_sandbox() {
    let env = Env::untrusted(Some(POLICY));
    let declared = format!(
        "{}    env: {{KV_LABEL: declared}}\n    pass_env: [KV_PASSED, KV_UNSET]\n",
        common::gate::kv_providers_yaml()
    );
    std::fs::write(env.root().join(".gaffer/providers.yaml"), declared).expect("providers");
    let (code, out, err) = env.trust_reviewed();
    assert_eq!(code, 0, "{out} {err}");
    // KV_UNSET is declared but gaffer does not have it: the provider goes without.
    let leaky = [
        ("KV_PASSED", "passed-on"),
        ("HOME", "/home/operator-leak"),
        ("GIT_DIR", "/leak/git"),
        ("LEAKED_TOKEN", "do-not-pass"),
    ];
    let mut s = env.agent_env("agent", &leaky);
    // The operator's key file lies outside the workspace: the sandbox keeps the provider out.
    let key = env.key_file.display().to_string();
    let got = probe(&mut s, &key, "key");
    let seen = got["env"].as_object().expect("the provider's env");
    let mut names: Vec<&str> = seen.keys().map(String::as_str).collect();
    names.sort_unstable();
    // Python itself may add LC_CTYPE when it coerces the locale; nothing else is allowed.
    names.retain(|n| *n != "LC_CTYPE");
    assert_eq!(
        names,
        [
            "GAFFER_WORKSPACE",
            "HOME",
            "KV_LABEL",
            "KV_PASSED",
            "LANG",
            "PATH"
        ],
        "{got}"
    );
    // It starts outside the workspace, told where the workspace is.
    assert_eq!(got["cwd"], "/", "{got}");
    assert_eq!(seen["GAFFER_WORKSPACE"], env.root().display().to_string());
    assert_eq!(seen["KV_LABEL"], "declared");
    // The provider got the token (it echoed exactly it back), and what it says is scrubbed:
    // the result, the journal and gaffer's log hold the mark, never the value.
    assert_eq!(seen["KV_PASSED"], "[secret:KV_PASSED]");
    let journal = String::from_utf8_lossy(&common::journal_bytes(env.root())).into_owned();
    assert!(!journal.contains("passed-on"), "{journal}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !env.logs().contains("probe env:") && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let logs = env.logs();
    assert!(
        logs.contains("probe env:") && logs.contains("[secret:KV_PASSED]"),
        "{logs}"
    );
    assert!(!logs.contains("passed-on"), "{logs}");
    // Its stderr is still read after bytes that are not UTF-8: the next call works.
    let again = probe(&mut s, &key, "key-again");
    assert_eq!(again["env"]["KV_PASSED"], "[secret:KV_PASSED]", "{again}");
    assert_eq!(seen["HOME"], "/nonexistent");
    assert_eq!(got["read"]["error"], "PermissionError", "{got}");
    // The control: a file in the workspace reads, and so does the provider's own directory.
    std::fs::write(env.root().join("inside.txt"), "12345").expect("inside");
    let inside = env.root().join("inside.txt").display().to_string();
    assert_eq!(probe(&mut s, &inside, "inside")["read"]["ok"], 5);
    let own = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/providers/kv_provider.py"
    );
    assert!(
        probe(&mut s, own, "own")["read"]["ok"]
            .as_u64()
            .unwrap_or(0)
            > 0
    );
    // `.gaffer/` is covered even for a provider.
    let store = env
        .root()
        .join(".gaffer/providers.yaml")
        .display()
        .to_string();
    assert!(
        probe(&mut s, &store, "store")["read"].get("ok").is_none(),
        "the provider read the store"
    );
}

/// A provider whose declaration does not say `workspace:` cannot open anything in the
/// workspace: whatever its command names (a path however spelled, a module found through
/// the working directory), nothing the agent writes there can become its code.
#[test]
fn a_provider_reaches_the_workspace_only_when_its_declaration_says_so() {
    let env = Env::untrusted(Some(POLICY));
    let yaml = common::gate::kv_providers_yaml().replace("    workspace: write\n", "");
    assert!(!yaml.contains("workspace:"), "{yaml}");
    std::fs::write(env.root().join(".gaffer/providers.yaml"), yaml).expect("providers");
    let (code, out, err) = env.trust_reviewed();
    assert_eq!(code, 0, "{out} {err}");
    std::fs::write(env.root().join("evil.py"), "print('agent code')\n").expect("planted");
    let mut s = env.agent("agent");
    let planted = env.root().join("evil.py").display().to_string();
    let got = probe(&mut s, &planted, "planted");
    assert_eq!(got["read"]["error"], "PermissionError", "{got}");
    // The sandbox's own view of itself does not lead there either.
    let via_proc = format!("/proc/self/task/2/root{planted}");
    let got = probe(&mut s, &via_proc, "via-proc");
    assert!(got["read"].get("ok").is_none(), "{got}");
}
