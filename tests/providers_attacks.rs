//! End-to-end, as the agent would play it: an external provider's code must never be the
//! agent's to write, and a provider that fails or hangs must never keep the operator from
//! acting. The agent can write the workspace; the operator trusted `providers.yaml`.

mod common;

use common::gate::*;

use std::path::{Path, PathBuf};

use serde_json::json;

/// The tests' provider, as an operator would install it outside the workspace.
fn kv_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/providers")
}

/// What the agent's version of a provider does when gaffer starts it: leaves a mark in the
/// workspace (the provider could as well use its token, read paths and ports).
const EVIL: &str = "import os\nopen(os.path.join(os.environ.get('GAFFER_WORKSPACE', '.'), 'AGENT-CODE-RAN'), 'w').write('x')\n";

/// Signs `text` as the trusted providers.yaml with the operator's own key, as a `gaffer trust`
/// from before gaffer refused such files would have, and writes it in place.
fn trusted_before(env: &Env, text: &str) {
    let gaffer_dir = env.root().join(".gaffer");
    std::fs::write(gaffer_dir.join("providers.yaml"), text).unwrap();
    let id = workspace_id(env.root());
    let signer = gaffer::operator::OperatorSigner::load_from(&env.key_file).unwrap();
    let hex = gaffer::util::sha256_hex(text.as_bytes());
    let blob = gaffer_dir.join("blobs/sha256").join(&hex[..2]);
    std::fs::create_dir_all(&blob).unwrap();
    std::fs::write(blob.join(&hex), text).unwrap();
    let record = trust_record(&signer, &id, "providers.yaml", text.as_bytes(), 7);
    append_as_agent(env.root(), vec![("trust.signed", record)]);
}

fn failed_providers(c: &serde_json::Value) -> String {
    c["external_providers_failed"].to_string()
}

#[test]
fn a_provider_whose_code_lies_in_the_workspace_is_never_signed_nor_started() {
    let env = Env::untrusted(Some(ALLOW_DOCS));
    // The operator's provider script, copied into the workspace (`tools/`), where the agent
    // then rewrites it.
    let tools = env.root().join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    std::fs::copy(
        kv_dir().join("kv_provider.py"),
        tools.join("kv_provider.py"),
    )
    .unwrap();
    let inside = format!(
        "providers:\n  - name: kv\n    command: [python3, {:?}]\n",
        tools.join("kv_provider.py").display().to_string()
    );
    std::fs::write(env.root().join(".gaffer/providers.yaml"), &inside).unwrap();
    let (code, out, err) = env.cli(&["trust", "--expect", &pin(&env, "providers.yaml")]);
    assert_ne!(
        code, 0,
        "signed a provider whose code the agent can write: {out}"
    );
    assert!(err.contains("names the workspace"), "{err}");
    // Relative programs were taken from the workspace: refused too.
    let relative = "providers:\n  - name: kv\n    command: [tools/kv_provider.py]\n";
    std::fs::write(env.root().join(".gaffer/providers.yaml"), relative).unwrap();
    let (code, _, err) = env.cli(&["trust", "--expect", &pin(&env, "providers.yaml")]);
    assert_ne!(code, 0);
    assert!(err.contains("relative path"), "{err}");

    // However it is spelled (a second reader's): the variable gaffer sets, doubled
    // separators inside a longer argument, a value in a list.
    let root = env.root().display().to_string();
    for spelled in [
        "command: [sh, -c, 'exec python3 \"$GAFFER_WORKSPACE/tools/kv_provider.py\"']".to_string(),
        format!(
            "command: [python3, -c, \"import runpy; runpy.run_path('{}/tools/kv_provider.py')\"]",
            root.replace('/', "//")
        ),
        format!("command: [ruby, /opt/p.rb]\n    env: {{RUBYLIB: \"/opt/lib:{root}/./tools\"}}"),
    ] {
        let yaml = format!("providers:\n  - name: kv\n    {spelled}\n");
        std::fs::write(env.root().join(".gaffer/providers.yaml"), &yaml).unwrap();
        let (code, _, err) = env.cli(&["trust", "--expect", &pin(&env, "providers.yaml")]);
        assert_ne!(code, 0, "signed: {yaml}");
        assert!(err.contains("names the workspace"), "{yaml}: {err}");
    }
    // A file trusted before gaffer refused these: the agent rewrites the script.
    trusted_before(&env, &inside);
    let (code, out, err) = env.cli(&["trust", "--expect", &pin(&env, "policy.yaml")]);
    assert_eq!(code, 0, "{out} {err}");
    std::fs::write(tools.join("kv_provider.py"), EVIL).unwrap();
    let mut a = env.agent("agent-1");
    let c = catalog(&mut a);
    assert_eq!(c["trust"]["providers"], "trusted", "{c}");
    assert!(
        catalog_names(&c).iter().all(|n| !n.starts_with("kv.")),
        "{c}"
    );
    assert!(failed_providers(&c).contains("names the workspace"), "{c}");
    assert!(!env.root().join("AGENT-CODE-RAN").exists());
    // The built-in operations go on.
    a_builtin_write_succeeds(&mut a, "docs/a.md");
    assert!(!env.root().join("AGENT-CODE-RAN").exists());
}

#[test]
fn a_provider_starts_outside_the_workspace_so_nothing_there_is_taken_for_its_code() {
    let env = Env::untrusted(Some(ALLOW_DOCS));
    // Installed outside the workspace, started the way `python -c`/`-m` providers are: Python
    // looks for modules in the working directory first.
    let script = kv_dir().join("kv_provider.py").display().to_string();
    let yaml = format!(
        "providers:\n  - name: kv\n    command: [python3, -c, {:?}]\n    read: [{:?}]\n    workspace: write\n",
        format!("import runpy; runpy.run_path({script:?}, run_name='__main__')"),
        kv_dir().display().to_string()
    );
    std::fs::write(env.root().join(".gaffer/providers.yaml"), yaml).unwrap();
    let (code, out, err) = env.trust_reviewed();
    assert_eq!(code, 0, "{out} {err}");
    // The agent plants `json.py` (a module the provider imports) where the working directory
    // would be the workspace.
    std::fs::write(env.root().join("json.py"), EVIL).unwrap();
    let mut a = env.agent("agent-1");
    let c = catalog(&mut a);
    assert!(
        catalog_names(&c).iter().any(|n| n == "kv.set"),
        "{c}\n{}",
        env.logs()
    );
    // A submit has the provider decode and present it (it is started again for that).
    let p = ok(&submit(
        &mut a,
        "kv.set",
        json!({"key": "k"}),
        json!({"value": 1}),
        "kv",
    ))
    .clone();
    assert_eq!(p["presentation"]["title"], "Set k", "{p}");
    assert!(
        !env.root().join("AGENT-CODE-RAN").exists(),
        "the provider imported the agent's module from the workspace"
    );
}

#[test]
fn a_provider_that_fails_or_hangs_keeps_nothing_else_from_working() {
    let env = Env::untrusted(Some(ALLOW_DOCS));
    // One provider hangs at start (and says so in the workspace), one exits at once.
    let yaml = format!(
        "providers:\n  - name: stuck\n    command: [python3, {:?}, stuck-started, hang]\n    read: [{:?}]\n    workspace: write\n  - name: gone\n    command: [sh, -c, 'exit 3']\n",
        kv_dir().join("announce.py").display().to_string(),
        kv_dir().display().to_string()
    );
    std::fs::write(env.root().join(".gaffer/providers.yaml"), &yaml).unwrap();
    let (code, out, err) = env.trust_reviewed();
    assert_eq!(code, 0, "{out} {err}");
    // The operator's commands that need no provider never start one.
    let (code, out, err) = env.cli(&["client", "add", "ci-agent"]);
    assert_eq!(code, 0, "{out} {err}");
    let (code, out, err) = env.cli(&["trust", "--show"]);
    assert_eq!(code, 0, "{out} {err}");
    let (code, out, err) = env.cli(&["client", "revoke", "ci-agent"]);
    assert_eq!(code, 0, "{out} {err}");
    assert!(!env.root().join("stuck-started").exists());
    // A serving gaffer leaves the failed one out and goes on with the rest.
    std::fs::write(
        env.root().join(".gaffer/providers.yaml"),
        "providers:\n  - name: gone\n    command: [sh, -c, 'exit 3']\n",
    )
    .unwrap();
    let (code, out, err) = env.trust_reviewed();
    assert_eq!(code, 0, "{out} {err}");
    let mut a = env.agent("agent-1");
    let c = catalog(&mut a);
    let failed = failed_providers(&c);
    assert!(failed.contains("\"gone\""), "{c}");
    assert!(catalog_names(&c).iter().any(|n| n == "file.write"), "{c}");
    a_builtin_write_succeeds(&mut a, "docs/b.md");
}

/// A `file.write` to `path` (which the trusted policy allows) runs to success.
fn a_builtin_write_succeeds(a: &mut common::Server, path: &str) {
    let r = submit(
        a,
        "file.write",
        json!({ "path": path }),
        json!({"content": "x"}),
        path,
    );
    let id = ok(&r)["id"].as_str().unwrap().to_string();
    let v = wait_state(a, &id, &["succeeded", "failed"]);
    assert_eq!(v["state"], "succeeded", "{v}");
}

/// `FILE=SHA256` of `file` as it is on disk now: what the operator reviewed.
fn pin(env: &Env, file: &str) -> String {
    let bytes = std::fs::read(env.root().join(".gaffer").join(file)).unwrap();
    format!("{file}={}", gaffer::util::sha256_hex(&bytes))
}
