import { test } from "node:test";
import * as assert from "node:assert/strict";
import * as m from "../../src/model";

const now = Date.parse("2026-12-01T10:00:00.000Z");

function approval(over: Partial<m.Approval> = {}): m.Approval {
  return {
    approval_id: "ap_1",
    operation_id: "op_1",
    client_id: "agent-1",
    operation: "file.write",
    status: "pending",
    revision: 1,
    plan_digest: "abc",
    mode: "execution",
    pending_expires_at: "2026-12-01T10:04:05.000Z",
    requested_duration_seconds: 600,
    requested_max_uses: 1,
    title: "Write notes/todo.txt",
    summary: "Replace notes/todo.txt with 12 bytes",
    arguments: { content: "new text\n" },
    ...over,
  };
}

test("time left is human and says expired once past", () => {
  assert.equal(m.timeLeft("2026-12-01T10:04:05.000Z", now), "4m 05s");
  assert.equal(m.timeLeft("2026-12-01T10:00:09.900Z", now), "9s");
  assert.equal(m.timeLeft("2026-12-01T12:30:00.000Z", now), "2h 30m");
  assert.equal(m.timeLeft("2026-12-01T09:59:59.000Z", now), "expired");
  assert.equal(m.timeLeft("not a date", now), "expired");
});

test("an approval item shows title, requester and time left; a broken plan says so", () => {
  const it = m.approvalItem(approval({ reason: "needed" }), now);
  assert.equal(it.label, "Write notes/todo.txt");
  assert.equal(it.description, "agent-1 · 4m 05s left");
  assert.match(it.tooltip, /agent's reason: needed/);
  const broken = m.approvalItem(approval({ title: undefined, plan_problem: "digest mismatch" }), now);
  assert.equal(broken.label, "file.write (plan does not verify)");
  assert.match(broken.tooltip, /digest mismatch/);
});

test("operations group by state, attention first, newest first inside", () => {
  const op = (id: string, state: string, at: string): m.Operation => ({
    id,
    client_id: "a",
    operation: "file.write",
    state,
    target: {},
    presentation: { title: id, summary: "" },
    updated_at: at,
  });
  const g = m.groupOperations([
    op("a", "succeeded", "2026-01-01T00:00:01Z"),
    op("b", "pending", "2026-01-01T00:00:02Z"),
    op("c", "succeeded", "2026-01-01T00:00:03Z"),
    op("d", "weird", "2026-01-01T00:00:04Z"),
    op("e", "denied", "2026-01-01T00:00:05Z"),
  ]);
  assert.deepEqual(
    g.map((x) => [x.state, x.items.map((i) => i.id)]),
    [
      ["pending", ["b"]],
      ["succeeded", ["c", "a"]],
      ["denied", ["e"]],
      ["weird", ["d"]],
    ],
  );
});

test("narrowing choices stay inside what the server accepts", () => {
  const exec = m.narrowingChoices({
    mode: "execution",
    max_duration_seconds: 600,
    max_uses: 1,
    duration_narrowable: true,
    uses_narrowable: false,
    covers: "exactly this one execution",
  });
  assert.deepEqual(
    exec.map((c) => [c.label, c.duration_seconds, c.max_uses]),
    [
      ["As requested: 10 min, 1 use(s)", undefined, undefined],
      ["For 1 min only", 60, undefined],
      ["For 5 min only", 300, undefined],
    ],
  );
  const win = m.narrowingChoices({
    mode: "window",
    max_duration_seconds: 3600,
    max_uses: 10,
    duration_narrowable: true,
    uses_narrowable: true,
    covers: "up to 10",
  });
  for (const c of win) {
    if (c.duration_seconds !== undefined) assert.ok(c.duration_seconds >= 1 && c.duration_seconds < 3600);
    if (c.max_uses !== undefined) assert.ok(c.max_uses >= 1 && c.max_uses < 10);
  }
  assert.deepEqual(win.filter((c) => c.max_uses).map((c) => c.max_uses), [1, 5]);
  assert.deepEqual(win.filter((c) => c.duration_seconds).map((c) => c.duration_seconds), [60, 300, 900, 1800]);
  const tiny = m.narrowingChoices({
    mode: "execution",
    max_duration_seconds: 1,
    max_uses: 1,
    duration_narrowable: false,
    uses_narrowable: false,
    covers: "",
  });
  assert.equal(tiny.length, 1);
});

test("diff sides: proposed content for a write, empty for a delete; only verified file changes diff", () => {
  assert.equal(m.proposedContent(approval()), "new text\n");
  assert.equal(m.proposedContent(approval({ operation: "file.delete", arguments: {} })), "");
  assert.equal(m.isFileChange(approval()), false);
  const fc: m.FileChange = {
    path: "notes/todo.txt",
    change: "modify",
    current_matches_plan: true,
    diff: "--- a\n+++ b\n",
    diff_truncated: false,
    lines_added: 1,
    lines_removed: 1,
    summary: "modify notes/todo.txt: +1 -1 lines",
  };
  const d: m.ApprovalDetail = {
    plan: '{"operation":"file.write"}',
    plan_truncated: false,
    plan_expires_at: "2026-12-01T11:00:00.000Z",
    expires_in_seconds: 245,
    narrowing: { mode: "execution", max_duration_seconds: 600, max_uses: 1, duration_narrowable: true, uses_narrowable: false, covers: "exactly this one execution" },
    file_change: fc,
  };
  assert.equal(m.isFileChange(approval({ detail: d })), true);
  const md = m.planMarkdown(approval({ detail: d }), now);
  assert.match(md, /^# Write notes\/todo.txt/);
  assert.match(md, /## modify notes\/todo.txt: \+1 -1 lines\n\n```diff\n--- a\n\+\+\+ b\n\n```/);
  assert.match(md, /"operation": "file.write"/);
});

test("a command's plan shows a quoted argv, env names and limits", () => {
  const md = m.planMarkdown(
    approval({
      operation: "command.run",
      title: "Run cargo",
      detail: {
        plan: "{}",
        plan_truncated: false,
        plan_expires_at: "",
        expires_in_seconds: 1,
        narrowing: { mode: "execution", max_duration_seconds: 600, max_uses: 1, duration_narrowable: true, uses_narrowable: false, covers: "x" },
        command: { argv: ["sh", "-c", "echo 'hi' there"], cwd: "", env_names: ["CI"], inherited_env: ["PATH"], timeout_ms: 5000 },
      },
    }),
    now,
  );
  assert.match(md, /sh -c 'echo '\\''hi'\\'' there'/);
  assert.match(md, /- sets: `CI`/);
  assert.match(md, /killed after 5000 ms/);
});

test("versions: too old and unreadable are problems, equal or newer is fine", () => {
  assert.equal(m.versionProblem("0.1.0", "0.1.0"), undefined);
  assert.equal(m.versionProblem("gaffer 1.0.0", "0.1.0"), undefined);
  assert.match(m.versionProblem("0.0.9", "0.1.0")!, /too old/);
  assert.match(m.versionProblem(undefined, "0.1.0")!, /did not report/);
});

test("the operator key path follows the setting, then the env, then the CLI default", () => {
  assert.equal(m.operatorKeyPath("~/k.jwk", {}, "/home/u"), "/home/u/k.jwk");
  assert.equal(m.operatorKeyPath("", { GAFFER_OPERATOR_KEY_FILE: "/x/op.key" }, "/home/u"), "/x/op.key");
  assert.equal(m.operatorKeyPath("", { XDG_CONFIG_HOME: "/cfg" }, "/home/u"), "/cfg/gaffer/operator.key");
  assert.equal(m.operatorKeyPath(" ", {}, "/home/u"), "/home/u/.config/gaffer/operator.key");
  assert.equal(m.publicKeyPath("/k/operator.key"), "/k/operator.pub");
  assert.equal(m.publicKeyPath("/k.d/operator"), "/k.d/operator.pub");
  assert.equal(m.publicKeyPath("/k/.hidden"), "/k/.hidden.pub");
});

test("the plan-a-task preview lists pattern, mechanism, lanes and proofs", () => {
  const md = m.selectionMarkdown("rate limits", {
    plan: {
      selection: { selected_pattern: "module-swarm", overlays: ["twin-inspection"], reason: "separable" },
      runtime_mapping: { primary_mechanism: "ephemeral_workers", fallback_mechanisms: ["continuation"] },
      lanes: [{ role: "builder", scope: ["router"], purpose: "Build | router", selected_profile: "fast" }],
      proof_expectations: ["Tests ran."],
    },
  });
  assert.match(md, /pattern: \*\*module-swarm\*\* \+ twin-inspection/);
  assert.match(md, /mechanism: \*\*ephemeral_workers\*\* \(fallback: continuation\)/);
  assert.match(md, /\| builder \| router \| fast \| Build \\\| router \|/);
  assert.match(md, /- \[ \] Tests ran\./);
});

test("transcript entries: input and gaffer's notes as whole prefixed lines, stderr marked", () => {
  assert.equal(m.transcriptText("input", "hello"), "> hello\n");
  assert.equal(m.transcriptText("input", "a\nb\n"), "> a\n> b\n");
  assert.equal(m.transcriptText("system", "exited 0"), "[gaffer] exited 0\n");
  assert.equal(m.transcriptText("stderr", "oops\nagain\n"), "! oops\n! again\n");
  assert.equal(m.transcriptText("stdout", "partial"), "partial");
});

test("agent text in a notification cannot become a command link", () => {
  const path = 'docs/[README.md](command:workbench.action.terminal.sendSequence?%7B%7D "Open README.md")';
  const shown = m.inert(`Write ${path}`);
  assert.ok(!/\]\(/.test(shown), shown);
  assert.ok(shown.includes("README.md"), shown);
  assert.equal(m.inert("plain text (with parens) [and brackets]"), "plain text (with parens) [and brackets]");
});

test("a payload is signed only when it decides the approval as it was shown", () => {
  const a = approval();
  const payload = (over: Record<string, unknown> = {}) =>
    JSON.stringify({
      approval_id: "ap_1",
      operation_id: "op_1",
      client: "agent-1",
      operation: "file.write",
      plan_digest: "abc",
      mode: "execution",
      max_uses: 1,
      decided_at_ms: 1000,
      expires_at_ms: 601000,
      ...over,
    });
  assert.equal(m.payloadProblem(payload(), a), undefined);
  assert.equal(m.payloadProblem(payload({ max_uses: 1, expires_at_ms: 61000 }), a), undefined, "narrowed");
  for (const [over, field] of [
    [{ plan_digest: "def" }, "plan_digest"],
    [{ approval_id: "ap_2" }, "approval_id"],
    [{ operation: "command.run" }, "operation"],
    [{ client: "other" }, "client"],
    [{ mode: "window" }, "mode"],
    [{ max_uses: 50 }, "uses"],
    [{ expires_at_ms: 86_401_000 }, "lasts"],
  ] as [Record<string, unknown>, string][]) {
    const why = m.payloadProblem(payload(over), a);
    assert.ok(why && why.includes(field), `${JSON.stringify(over)}: ${why}`);
  }
  assert.ok(m.payloadProblem("not json", a));
});

test("the notification that offers Approve says what approving grants", () => {
  assert.match(m.scopeWords(approval()), /^one execution of this plan/);
  const w = m.scopeWords(approval({ mode: "window", requested_max_uses: 20, requested_duration_seconds: 3600 }));
  assert.match(w, /^WINDOW: up to 20 operations .* for 60 min, not only this plan$/);
});

// VS Code shows a notification's first 1000 UTF-16 code units and "..."; an astral character
// counts twice there but once in gaffer's bounds.
const vscodeShows = (msg: string) => (msg.length > 1000 ? msg.slice(0, 1000) + "..." : msg);

test("the notification that offers Approve names the grant first, whatever the agent's text holds", () => {
  const tags = "\u{E0020}".repeat(600);
  const a = approval({
    mode: "window",
    requested_max_uses: 20,
    requested_duration_seconds: 3600,
    title: `Write notes/${tags}todo.txt`,
    summary: `Replace notes/${tags}todo.txt with 12 bytes`,
  });
  const msg = m.approvalMessage(a);
  assert.ok(msg.startsWith(`gaffer: ${m.scopeWords(a)} — Write notes/`), msg.slice(0, 200));
  assert.ok(vscodeShows(msg).includes("WINDOW: up to 20 operations"), "the scope words are in view");
  assert.ok(msg.length <= m.NOTIFICATION_MAX, `${msg.length} code units`);
  assert.ok(msg.endsWith(" … (see Show)"), "a cut says so");
  assert.ok(msg.includes("\\u{e0020}"), "the padding is spelled out, not invisible");
  assert.equal(m.approvalMessage(approval()), "gaffer: one execution of this plan, within 10 min — Write notes/todo.txt — Replace notes/todo.txt with 12 bytes");
});

test("agent text in the notification shows its hidden characters and is cut between characters", () => {
  const msg = m.approvalMessage(approval({ title: "Write notes/\u202Etxt.exe\n\nApprove: safe\u200B\u2028\u{FEFF}\u0085\u0000" }));
  assert.ok(!/[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]/u.test(msg), JSON.stringify(msg));
  for (const e of ["\\u{202e}", "\\u{a}\\u{a}Approve", "\\u{200b}", "\\u{2028}", "\\u{feff}", "\\u{85}", "\\u{0}"]) {
    assert.ok(msg.includes(e), `${e} in ${msg}`);
  }
  // A cut never leaves half a surrogate pair or half an escape, and never forms a link.
  for (const pad of ["😀", "\u202E", "[x](command:y)"]) {
    const cut = m.approvalMessage(approval({ title: "x".repeat(7) + pad.repeat(900) }));
    assert.ok(cut.length <= m.NOTIFICATION_MAX, `${pad}: ${cut.length}`);
    assert.ok(!/\p{Cs}/u.test(cut), `${pad}: a lone surrogate`);
    assert.ok(!/\\u\{[0-9a-f]*$/.test(cut.slice(0, -" … (see Show)".length)), `${pad}: half an escape`);
    assert.ok(!/\]\(/.test(cut), `${pad}: a link`);
  }
});

test("the Approvals and Operations views spell out what the agent's text holds", () => {
  const title = "Write notes/\u202Etxt.exe\r\nok";
  const it = m.approvalItem(approval({ title, summary: "a\u200Bb", reason: "fine\u2028really" }), now);
  assert.equal(it.label, "Write notes/\\u{202e}txt.exe\\u{d}\\u{a}ok");
  assert.deepEqual(it.tooltip.split("\n").slice(0, 2), ["a\\u{200b}b", "agent's reason: fine\\u{2028}really"]);
  const op = m.operationItem({
    id: "op",
    client_id: "a",
    operation: "file.write",
    state: "failed",
    target: {},
    presentation: { title, summary: "" },
    updated_at: "",
    error: { code: "x", message: "no\u202Ething" },
  });
  assert.equal(op.label, "Write notes/\\u{202e}txt.exe\\u{d}\\u{a}ok");
  assert.equal(op.tooltip, "x: no\\u{202e}thing");
});
