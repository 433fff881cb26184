// The extension inside a real VS Code (code-server) driven through Debian's chromium with
// playwright-core. An agent in another process submits file writes; the human approves one
// and denies the other with a typed reason, all by clicking in the workbench.
//
// Env (editors/test.sh sets them): GAFFER_BIN, NODE24, CS_ENTRY (code-server out/node/entry.js),
// PW (playwright-core dir), VSIX, OUT (screenshots, events, logs), CHROMIUM, PORT.
// Run with Node 24. Exits non-zero on the first failed expectation.

import { spawn, spawnSync } from "node:child_process";
import * as fs from "node:fs";
import * as path from "node:path";
import { createRequire } from "node:module";
import * as readline from "node:readline";

const env = (k, d) => process.env[k] ?? d ?? (() => { throw new Error(`${k} is not set`); })();
const GAFFER = env("GAFFER_BIN"), NODE24 = env("NODE24"), CS = env("CS_ENTRY"), VSIX = env("VSIX");
const OUT = env("OUT"), CHROMIUM = env("CHROMIUM", "/usr/lib/chromium/chromium"), PORT = env("PORT", "18180");
const { chromium } = createRequire(import.meta.url)(env("PW"));

const T0 = Date.now();
const say = (...a) => console.log(`[vscode e2e +${((Date.now() - T0) / 1000).toFixed(1)}s]`, ...a);
let failures = 0;
function expect(cond, what) {
  if (!cond) throw new Error(`expectation failed: ${what}`);
  say(`ok - ${what}`);
}

// --- a private world: workspace, operator key, HOME/XDG/TMPDIR for code-server ---------------
fs.rmSync(OUT, { recursive: true, force: true });
const R = path.join(OUT, "run");
const dirs = { home: `${R}/home`, ws: `${R}/workspace`, keys: `${R}/operator`, udd: `${R}/udd`, exts: `${R}/exts` };
for (const d of [...Object.values(dirs), `${R}/home/rt`, `${R}/home/tmp`, `${R}/udd/User`, `${R}/ws-shots`]) fs.mkdirSync(d, { recursive: true });
// One anchor for every gaffer of this run (the operator's inside code-server and the agent's),
// as on a machine with one user; kept inside the run, so a rerun at this same workspace path
// is a new machine's first sight of a new store, not the old store replaced.
process.env.GAFFER_STATE_DIR = `${R}/state`;
fs.mkdirSync(process.env.GAFFER_STATE_DIR, { recursive: true, mode: 0o700 });
const shots = OUT;
const KEY = `${dirs.keys}/operator.key`;
const EVENTS = `${OUT}/events.jsonl`;
fs.mkdirSync(`${dirs.ws}/notes`, { recursive: true });
const BEFORE = "# todo\n- write the parser\n- add tests\n- ship it\n";
const AFTER = "# todo\n- write the parser\n- add tests for the parser\n- document the flags\n- ship it\n";
fs.writeFileSync(`${dirs.ws}/notes/todo.txt`, BEFORE);
fs.writeFileSync(`${dirs.ws}/README.md`, "scratch workspace for the gaffer VS Code test\n");
// The agent writes the workspace's settings: a gaffer of its own and a key it made. Both
// settings are machine-scoped, so the editor never takes them from the workspace.
const AGENT_RAN = `${R}/agent-gaffer-ran`;
fs.mkdirSync(`${dirs.ws}/.vscode`, { recursive: true });
fs.writeFileSync(`${dirs.ws}/agent-gaffer`, `#!/bin/sh\ntouch '${AGENT_RAN}'\nexit 1\n`, { mode: 0o755 });
fs.writeFileSync(`${dirs.ws}/.vscode/settings.json`, JSON.stringify({ "gaffer.path": `${dirs.ws}/agent-gaffer`, "gaffer.operator.keyFile": `${dirs.ws}/agent.key` }));
const keyInit = spawnSync(GAFFER, ["--workspace", dirs.ws, "operator", "init"], { env: { ...process.env, GAFFER_OPERATOR_KEY_FILE: KEY }, encoding: "utf8" });
expect(keyInit.status === 0 && fs.existsSync(KEY), `gaffer operator init made a key (${keyInit.stderr.trim()})`);

const csEnv = {
  ...process.env,
  HOME: dirs.home,
  XDG_CONFIG_HOME: `${dirs.home}/.config`,
  XDG_DATA_HOME: `${dirs.home}/.local/share`,
  XDG_RUNTIME_DIR: `${dirs.home}/rt`,
  TMPDIR: `${dirs.home}/tmp`,
  PATH: `${path.dirname(NODE24)}:${process.env.PATH}`,
  GAFFER_VSCODE_EVENTS: EVENTS,
  GAFFER_LOG: "warn",
  // The marketplace pointed at a closed loopback port: no lookups leave the host.
  EXTENSIONS_GALLERY: JSON.stringify({ serviceUrl: "http://127.0.0.1:9/gallery", itemUrl: "http://127.0.0.1:9/item" }),
};
delete csEnv.GAFFER_OPERATOR_KEY_FILE;
delete csEnv.GAFFER_OPERATOR_PUBLIC_KEY_FILE;
fs.writeFileSync(`${R}/config.yaml`, `bind-addr: 127.0.0.1:${PORT}\nauth: none\ncert: false\n`);
fs.writeFileSync(
  `${dirs.udd}/User/settings.json`,
  JSON.stringify(
    {
      "telemetry.telemetryLevel": "off",
      "workbench.startupEditor": "none",
      "chat.disableAIFeatures": true,
      "extensions.autoUpdate": false,
      "extensions.autoCheckUpdates": false,
      "extensions.ignoreRecommendations": true,
      "workbench.enableExperiments": false,
      "update.mode": "none",
      "workbench.tips.enabled": false,
      "workbench.secondarySideBar.defaultVisibility": "hidden",
      "security.workspace.trust.enabled": false,
      "git.enabled": false,
      "git.openRepositoryInParentFolders": "never",
    },
    null,
    1,
  ),
);
// Machine-scoped settings of a remote window live in the server's Machine settings.
fs.mkdirSync(`${dirs.udd}/Machine`, { recursive: true });
fs.writeFileSync(`${dirs.udd}/Machine/settings.json`, JSON.stringify({ "gaffer.path": GAFFER, "gaffer.operator.keyFile": KEY }, null, 1));
const csArgs = ["--config", `${R}/config.yaml`, "--user-data-dir", dirs.udd, "--extensions-dir", dirs.exts];

const children = [];
function cleanup() {
  for (const c of children) {
    try { process.kill(-c.pid, "SIGTERM"); } catch { try { c.kill("SIGTERM"); } catch {} }
  }
}
process.on("exit", cleanup);

// --- the agent: another gaffer process on the same workspace, NDJSON, anonymous --------------
function agent() {
  const p = spawn(GAFFER, ["--workspace", dirs.ws, "serve", "--jsonl", "--log-file", `${OUT}/agent-gaffer.log`], {
    stdio: ["pipe", "pipe", "inherit"],
    // Like every serving gaffer, the agent's holds the operator's public key (only).
    env: { ...process.env, GAFFER_OPERATOR_KEY_FILE: `${R}/agent-has-no-private-key`, GAFFER_OPERATOR_PUBLIC_KEY_FILE: KEY.replace(/\.key$/, ".pub") },
  });
  children.push(p);
  let next = 1;
  const waiting = new Map();
  readline.createInterface({ input: p.stdout }).on("line", (l) => {
    const msg = JSON.parse(l);
    if (msg.id !== undefined && waiting.has(msg.id)) {
      waiting.get(msg.id)(msg);
      waiting.delete(msg.id);
    }
  });
  const call = (method, params) =>
    new Promise((resolve, reject) => {
      const id = next++;
      waiting.set(id, (m) => (m.error ? reject(new Error(`${method}: ${JSON.stringify(m.error)}`)) : resolve(m.result)));
      p.stdin.write(JSON.stringify({ jsonrpc: "2.0", id, method, params }) + "\n");
    });
  return {
    call,
    async waitFor(id, states, seconds = 60) {
      const deadline = Date.now() + seconds * 1000;
      let rev = 0;
      for (;;) {
        const v = await call("operations/wait", { id, after_revision: rev, wait_seconds: 5 });
        if (states.includes(v.state)) return v;
        rev = v.revision;
        if (Date.now() > deadline) throw new Error(`operation ${id} stuck in ${v.state}`);
      }
    },
    close: () => p.stdin.end(),
  };
}

const events = () =>
  fs.existsSync(EVENTS) ? fs.readFileSync(EVENTS, "utf8").trim().split("\n").filter(Boolean).map((l) => JSON.parse(l)) : [];
async function waitEvent(pred, ms, what) {
  const deadline = Date.now() + ms;
  for (;;) {
    const e = events().find(pred);
    if (e) return e;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}; events: ${JSON.stringify(events())}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function main() {
  // --- install the .vsix and serve the workbench ---------------------------------------------
  let t = Date.now();
  const inst = spawnSync(NODE24, [CS, ...csArgs, "--install-extension", VSIX], { env: csEnv, encoding: "utf8" });
  expect(inst.status === 0 && /successfully installed/i.test(inst.stdout), `code-server --install-extension ${path.basename(VSIX)} (${Date.now() - t} ms)`);
  t = Date.now();
  const cs = spawn(
    NODE24,
    [CS, ...csArgs, "--bind-addr", `127.0.0.1:${PORT}`, "--auth", "none", "--disable-telemetry", "--disable-update-check",
      "--disable-workspace-trust", "--disable-getting-started-override", dirs.ws],
    { env: csEnv, detached: true, stdio: ["ignore", fs.openSync(`${OUT}/code-server.log`, "w"), fs.openSync(`${OUT}/code-server.err.log`, "w")] },
  );
  children.push(cs);
  for (let i = 0; ; i++) {
    const ok = await fetch(`http://127.0.0.1:${PORT}/healthz`).then((r) => r.ok, () => false);
    if (ok) break;
    if (i > 600) throw new Error("code-server never became healthy; see code-server.log");
    await new Promise((r) => setTimeout(r, 100));
  }
  say(`code-server serving after ${Date.now() - t} ms`);

  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
  });
  const page = await (await browser.newContext({ viewport: { width: 1200, height: 760 } })).newPage();
  try {
    const tOpen = Date.now();
    await page.goto(`http://127.0.0.1:${PORT}/?folder=${encodeURIComponent(dirs.ws)}`, { waitUntil: "domcontentloaded", timeout: 60000 });
    await page.waitForSelector(".monaco-workbench", { timeout: 120000 });
    const tWorkbench = Date.now();
    const ready = await waitEvent((e) => e.ev === "ready", 120000, "the extension to log in");
    const activated = events().find((e) => e.ev === "activate");
    expect(ready.operator === true, "the extension logged in as the operator (challenge signed in the extension host)");
    expect(!fs.existsSync(AGENT_RAN), "the gaffer named by the workspace's settings never ran");
    const activation = { workbench_ms: tWorkbench - tOpen, activate_to_ready_ms: ready.activation_ms, workbench_to_activate_ms: activated.t - tWorkbench };
    say(`activation: ${JSON.stringify(activation)}`);
    await page.waitForSelector('.statusbar-item:has-text("gaffer: 0 pending")', { timeout: 30000 });

    // Watch for toasts in the page, stamping when each appears (browser clock = this machine's).
    await page.evaluate(() => {
      window.__toasts = [];
      new MutationObserver(() => {
        for (const el of document.querySelectorAll(".notification-toast")) {
          if (el.__seen) continue;
          el.__seen = true;
          window.__toasts.push({ t: Date.now(), text: el.textContent });
        }
      }).observe(document.body, { childList: true, subtree: true });
    });
    const toastTime = async (needle) => {
      await page.waitForFunction((n) => window.__toasts.some((x) => x.text.includes(n)), needle, { timeout: 30000, polling: 20 });
      return page.evaluate((n) => window.__toasts.find((x) => x.text.includes(n)).t, needle);
    };
    const toast = (needle) => page.locator(".notification-toast", { hasText: needle });
    const button = (needle, name) => toast(needle).locator(".monaco-button", { hasText: new RegExp(`^${name}$`) });

    // --- 1. a write: notification -> Show (diff editor) -> Approve --------------------------------
    const a = agent();
    const tSubmit1 = Date.now();
    const op1 = await a.call("operations/submit", {
      operation: "file.write",
      target: { path: "notes/todo.txt" },
      arguments: { content: AFTER },
      reason: "update the todo list",
      idempotency_key: "todo-1",
    });
    const tReply1 = Date.now();
    expect(op1.state === "pending", `the agent's file.write waits for a human (${op1.id})`);
    const tToast1 = await toastTime("Write notes/todo.txt");
    const recv1 = await waitEvent((e) => e.ev === "requested" && e.approval_id === op1.approval_id, 5000, "approvals/requested");
    const latency1 = { sent_to_toast_ms: tToast1 - tSubmit1, submit_to_toast_ms: tToast1 - tReply1, requested_to_toast_ms: tToast1 - recv1.t, submit_to_requested_ms: recv1.t - tReply1, submit_roundtrip_ms: tReply1 - tSubmit1 };
    say(`notification latency (write 1): ${JSON.stringify(latency1)}`);
    await page.waitForSelector('.statusbar-item:has-text("gaffer: 1 pending")', { timeout: 10000 });
    await page.screenshot({ path: `${shots}/1-notification.png` });
    await button("Write notes/todo.txt", "Show").click();
    await page.waitForSelector(".monaco-diff-editor", { timeout: 20000 });
    await page.waitForSelector('.monaco-diff-editor .view-line:has-text("document the flags")', { timeout: 20000 });
    expect(true, "Show opened a diff editor with the proposed content");
    expect(
      await page.locator(".tab", { hasText: "notes/todo.txt: now ↔ proposed" }).count() > 0,
      "the diff editor's tab names the file and the sides",
    );
    await button("Write notes/todo.txt", "Approve").waitFor({ timeout: 10000 });
    await page.waitForTimeout(600); // the toast's fade-in, for a readable screenshot
    await page.screenshot({ path: `${shots}/2-diff-and-approve.png` });
    expect(fs.readFileSync(`${dirs.ws}/notes/todo.txt`, "utf8") === BEFORE, "nothing is written before the approval");
    await button("Write notes/todo.txt", "Approve").click();
    const done1 = await a.waitFor(op1.id, ["succeeded", "failed", "denied", "canceled", "expired"]);
    expect(done1.state === "succeeded", `clicking Approve ran the write: the agent's wait returned ${done1.state}`);
    expect(fs.readFileSync(`${dirs.ws}/notes/todo.txt`, "utf8") === AFTER, "the file has the proposed content");
    const mtime = fs.statSync(`${dirs.ws}/notes/todo.txt`).mtimeMs;
    await waitEvent((e) => e.ev === "progress" && e.method === "operations/wait" && String(e.message).includes(op1.id), 10000, "$/progress for the approved operation");
    expect(true, "$/progress from operations/wait reached the window's progress UI");
    await waitEvent((e) => e.ev === "outcome" && e.operation_id === op1.id && e.state === "succeeded", 10000, "the outcome");
    await toast("Write notes/todo.txt succeeded").waitFor({ timeout: 10000 });
    expect(true, "the outcome is notified: Write notes/todo.txt succeeded");
    const decided = events().filter((e) => e.ev === "decided" && e.approval_id === op1.approval_id);
    expect(decided.length === 1, "one signed decision was recorded for it");

    // --- 2. a second write: Deny with a reason typed into the UI ---------------------------------
    const tSubmit2 = Date.now();
    const op2 = await a.call("operations/submit", {
      operation: "file.write",
      target: { path: "notes/secrets.txt" },
      arguments: { content: "token=hunter2\n" },
      reason: "cache a token",
      idempotency_key: "secrets-1",
    });
    const tReply2 = Date.now();
    const tToast2 = await toastTime("Write notes/secrets.txt");
    const recv2 = await waitEvent((e) => e.ev === "requested" && e.approval_id === op2.approval_id, 5000, "approvals/requested 2");
    const latency2 = { sent_to_toast_ms: tToast2 - tSubmit2, submit_to_toast_ms: tToast2 - tReply2, requested_to_toast_ms: tToast2 - recv2.t, submit_to_requested_ms: recv2.t - tReply2, submit_roundtrip_ms: tReply2 - tSubmit2 };
    say(`notification latency (write 2): ${JSON.stringify(latency2)}`);
    await button("Write notes/secrets.txt", "Deny").click();
    const input = page.locator(".quick-input-widget input");
    await input.waitFor({ state: "visible", timeout: 10000 });
    const REASON = "no secrets in the repo, use the vault";
    await input.type(REASON, { delay: 10 });
    await page.screenshot({ path: `${shots}/3-deny-reason.png` });
    await page.keyboard.press("Enter");
    const done2 = await a.waitFor(op2.id, ["succeeded", "failed", "denied", "canceled", "expired"]);
    expect(done2.state === "denied", `Deny ended the second write denied (${done2.state})`);
    expect(String(done2.error?.message ?? "").includes(REASON), `the typed reason reached the agent: "${done2.error?.message}"`);
    expect(!fs.existsSync(`${dirs.ws}/notes/secrets.txt`), "the denied file was not written");

    // --- 3. the Operations view lists both ---------------------------------------------------------
    await page.locator('.activitybar .action-item a[aria-label^="gaffer"]').first().click();
    const opsView = page.locator(".pane", { has: page.locator(".pane-header", { hasText: /Operations/i }) });
    await opsView.locator(".monaco-list-row", { hasText: "Write notes/todo.txt" }).waitFor({ timeout: 15000 });
    await opsView.locator(".monaco-list-row", { hasText: "Write notes/secrets.txt" }).waitFor({ timeout: 15000 });
    expect(await opsView.locator(".monaco-list-row", { hasText: "succeeded (1)" }).count() === 1, "Operations view: a 'succeeded (1)' group");
    expect(await opsView.locator(".monaco-list-row", { hasText: "denied (1)" }).count() === 1, "Operations view: a 'denied (1)' group");
    await page.waitForSelector('.statusbar-item:has-text("gaffer: 0 pending")', { timeout: 10000 });
    await page.screenshot({ path: `${shots}/4-operations-view.png` });

    // Written once: still the same file, no second execution, one operation for the key.
    await new Promise((r) => setTimeout(r, 1000));
    const list = await a.call("operations/list", {});
    expect(list.operations.filter((o) => o.idempotency_key === "todo-1").length === 1, "one operation for the write");
    expect(fs.statSync(`${dirs.ws}/notes/todo.txt`).mtimeMs === mtime, "the file was written once (unchanged since)");
    // --- 3b. Workers view: open -> the transcript streams into an output channel -----------------
    const synced = await a.call("bundles/sync", {
      bundle: {
        metadata: { id: "echo-bundle", revision: "r1", created_at: "2026-12-01T00:00:00Z", provenance: { source: "vscode-test" } },
        profiles: [{ selector: { kind: "named", value: "echo" }, label: "echo worker",
          command: ["sh", "-c", 'while read line; do echo "worker heard: $line"; done'], input_mode: "stdin_text" }],
      },
    });
    const w = await a.call("workers/create", {
      profile: { kind: "named", value: "echo" }, config_bundle: synced.reference, display_name: "echo-worker",
      initial_input: "hello from the agent", idempotency_key: "echo-1",
    });
    // Starting a worker is a gated operation: the operator approves its start from the toast.
    expect(w.worker.status === "pending_approval", "the agent's worker waits for its start to be approved");
    await button(`Start worker ${w.worker.id}`, "Approve").waitFor({ timeout: 15000 });
    await button(`Start worker ${w.worker.id}`, "Approve").click();
    expect(true, "clicking Approve on the worker.start toast started the worker");
    const workersView = page.locator(".pane", { has: page.locator(".pane-header", { hasText: /Workers/i }) });
    const row = workersView.locator(".monaco-list-row", { hasText: "echo-worker" });
    await row.waitFor({ timeout: 15000 });
    await row.click();
    const panel = page.locator(".part.panel");
    await panel.locator(".view-line", { hasText: "worker heard: hello from the agent" }).waitFor({ timeout: 15000 });
    const outputText = (await panel.locator(".view-lines").innerText()).replace(/\u00a0/g, " ");
    expect(outputText.includes("> hello from the agent\nworker heard: hello from the agent"), `the input is marked: ${JSON.stringify(outputText)}`);
    expect(true, `Workers view: opening ${w.worker.id} shows its transcript (input marked) in an output channel`);
    await a.call("workers/input", { worker_id: w.worker.id, input: "a later line" });
    await panel.locator(".view-line", { hasText: "worker heard: a later line" }).waitFor({ timeout: 15000 });
    expect(true, "the output channel follows the worker's new output");
    await page.screenshot({ path: `${shots}/4b-worker-transcript.png` });
    a.close();

    // --- 3c. "gaffer: Plan a task…" previews pattern, lanes, mechanism and proofs -----------------
    await page.keyboard.press("F1");
    const qi = page.locator(".quick-input-widget input");
    await qi.waitFor({ state: "visible", timeout: 10000 });
    await qi.type("gaffer: Plan a task", { delay: 10 });
    await page.locator(".quick-input-list .monaco-list-row", { hasText: "Plan a task" }).first().waitFor({ timeout: 10000 });
    await page.keyboard.press("Enter");
    await page.waitForFunction(() => document.querySelector(".quick-input-widget input")?.value === "", null, { timeout: 10000 });
    await qi.type("Add rate limiting to the router and billing, with tests", { delay: 5 });
    await page.keyboard.press("Enter");
    await page.locator(".quick-input-title", { hasText: "Scopes" }).waitFor({ timeout: 10000 });
    await qi.type("router, billing", { delay: 5 });
    await page.keyboard.press("Enter");
    await page.locator(".tab", { hasText: /Preview plan-\d+\.md/ }).waitFor({ timeout: 20000 });
    const frame = page.frameLocator("iframe.webview.ready").frameLocator("iframe");
    await frame.locator("text=Proof expectations").waitFor({ timeout: 20000 });
    const previewText = await frame.locator("body").innerText();
    expect(/pattern: module-swarm/.test(previewText) && /mechanism: ephemeral_workers/.test(previewText), "Plan a task… previews the pattern and mechanism");
    expect(previewText.includes("router") && previewText.includes("billing"), "…with lanes for both scopes");
    await page.screenshot({ path: `${shots}/4c-plan-a-task.png` });

    // --- 4. gaffer crashes: a clear message and a restart that works ----------------------------
    const same = fs.readdirSync("/proc").filter((d) => /^\d+$/.test(d)).filter((pid) => {
      try {
        const argv = fs.readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0");
        return argv[0] === GAFFER && argv.includes("--lsp") && fs.readlinkSync(`/proc/${pid}/cwd`) === dirs.ws;
      } catch {
        return false;
      }
    });
    // A sandboxed worker's keeper is a fork of that gaffer (same command line): count only
    // the process whose parent is not one of them.
    const ppid = (pid) => fs.readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1].split(" ")[1];
    const lsp = same.filter((pid) => { try { return !same.includes(ppid(pid)); } catch { return false; } });
    expect(lsp.length === 1, `the extension runs one gaffer serve --lsp for the folder (pid ${lsp[0]})`);
    process.kill(Number(lsp[0]), "SIGKILL");
    await button("stopped unexpectedly", "Restart").click({ timeout: 15000 });
    await waitEvent((e) => e.ev === "ready" && e.t > tReply2, 20000, "ready after the restart");
    await page.waitForSelector('.statusbar-item:has-text("gaffer: 0 pending")', { timeout: 10000 });
    expect(true, "after a crash the notification offers Restart, and Restart brings gaffer back");

    // --- 5. gaffer missing: the message names the setting to fix -------------------------------------
    const machine = `${dirs.udd}/Machine/settings.json`;
    const good = fs.readFileSync(machine, "utf8");
    fs.writeFileSync(machine, JSON.stringify({ "gaffer.path": `${R}/no-such-gaffer`, "gaffer.operator.keyFile": KEY }));
    await toast("gaffer.path").locator(".monaco-button", { hasText: "Open Settings" }).waitFor({ timeout: 20000 });
    expect((await toast("gaffer.path").textContent()).includes("no-such-gaffer"), "a missing gaffer says which path failed and to set gaffer.path");
    await page.waitForSelector('.statusbar-item:has-text("gaffer: not running")', { timeout: 10000 });
    await page.screenshot({ path: `${shots}/5-gaffer-missing.png` });
    const tFix = Date.now();
    fs.writeFileSync(machine, good);
    await waitEvent((e) => e.ev === "ready" && e.t > tFix, 20000, "ready after fixing gaffer.path");
    expect(true, "fixing the setting restarts gaffer");

    const measures = { activation, latency: [latency1, latency2], total_s: (Date.now() - T0) / 1000 };
    fs.writeFileSync(`${OUT}/measures.json`, JSON.stringify(measures, null, 1) + "\n");
    say(`MEASURES ${JSON.stringify(measures)}`);
    say(`screenshots in ${OUT}`);
  } catch (e) {
    await page.screenshot({ path: `${shots}/FAILED.png` }).catch(() => {});
    throw e;
  } finally {
    await browser.close();
  }
}

main().then(
  () => {
    say(failures === 0 ? "PASS" : "FAIL");
    cleanup();
    process.exit(failures === 0 ? 0 : 1);
  },
  (e) => {
    console.error(`[vscode e2e] FAIL: ${e.stack ?? e}`);
    console.error(`events: ${fs.existsSync(EVENTS) ? fs.readFileSync(EVENTS, "utf8") : "(none)"}`);
    cleanup();
    process.exit(1);
  },
);
