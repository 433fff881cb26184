// Pure parts of the extension: view models, diff sides, narrowing choices, rendering. No
// `vscode` import here, so node:test covers all of it.

export interface NarrowingChoices {
  mode: "execution" | "window";
  max_duration_seconds: number;
  max_uses: number;
  duration_narrowable: boolean;
  uses_narrowable: boolean;
  covers: string;
}

export interface FileChange {
  path: string;
  change: "create" | "modify" | "delete";
  current_matches_plan: boolean;
  diff?: string;
  diff_truncated: boolean;
  lines_added: number;
  lines_removed: number;
  summary: string;
}

export interface CommandShown {
  argv: string[];
  cwd: string;
  env_names: string[];
  inherited_env: string[];
  timeout_ms: number;
}

export interface ApprovalDetail {
  plan: string;
  plan_truncated: boolean;
  plan_expires_at: string;
  expires_in_seconds: number;
  narrowing: NarrowingChoices;
  file_change?: FileChange;
  command?: CommandShown;
}

export interface Approval {
  approval_id: string;
  operation_id: string;
  client_id: string;
  operation: string;
  status: string;
  revision: number;
  plan_digest: string;
  mode: string;
  pending_expires_at: string;
  requested_duration_seconds: number;
  requested_max_uses: number;
  reason?: string;
  title?: string;
  summary?: string;
  target?: unknown;
  arguments?: unknown;
  plan_problem?: string;
  detail?: ApprovalDetail;
}

export interface Operation {
  id: string;
  client_id: string;
  operation: string;
  state: string;
  target: unknown;
  presentation: { title: string; summary: string };
  updated_at: string;
  error?: { code: string; message: string };
}

export interface Worker {
  id: string;
  display_name?: string | null;
  status: string;
  profile?: unknown;
}

/** "4m 05s" until `iso`, "expired" once past. */
export function timeLeft(iso: string, nowMs: number): string {
  const ms = Date.parse(iso) - nowMs;
  if (!Number.isFinite(ms) || ms <= 0) return "expired";
  const s = Math.floor(ms / 1000);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const sec = s % 60;
  if (h > 0) return `${h}h ${String(m).padStart(2, "0")}m`;
  if (m > 0) return `${m}m ${String(sec).padStart(2, "0")}s`;
  return `${sec}s`;
}

export interface Item {
  label: string;
  description: string;
  tooltip: string;
}

/** An Approvals view item; the agent's text in it spelled out (visible): the row has an inline
 * Approve button. */
export function approvalItem(a: Approval, nowMs: number): Item {
  const label = visible(a.title ?? `${a.operation} (plan does not verify)`);
  return {
    label,
    description: `${visible(a.client_id)} · ${timeLeft(a.pending_expires_at, nowMs)} left`,
    tooltip: [
      visible(a.plan_problem ? `this plan cannot run: ${a.plan_problem}` : (a.summary ?? "")),
      a.reason ? `agent's reason: ${visible(a.reason)}` : "",
      `${a.mode} · requested ${a.requested_duration_seconds}s, ${a.requested_max_uses} use(s)`,
    ]
      .filter((l) => l !== "")
      .join("\n"),
  };
}

/** States an operation never leaves. */
export const TERMINAL = new Set(["succeeded", "failed", "denied", "canceled", "expired"]);

/** The order operations are grouped in: what needs attention first. */
export const STATE_ORDER = [
  "pending",
  "approved",
  "running",
  "unknown",
  "succeeded",
  "failed",
  "denied",
  "canceled",
  "expired",
];

export interface Group<T> {
  state: string;
  items: T[];
}

/** Operations grouped by state (known states in STATE_ORDER, others after), newest first. */
export function groupOperations(ops: Operation[]): Group<Operation>[] {
  const by = new Map<string, Operation[]>();
  for (const op of ops) {
    const list = by.get(op.state) ?? [];
    list.push(op);
    by.set(op.state, list);
  }
  const rank = (s: string) => {
    const i = STATE_ORDER.indexOf(s);
    return i < 0 ? STATE_ORDER.length : i;
  };
  return [...by.entries()]
    .sort(([a], [b]) => rank(a) - rank(b) || a.localeCompare(b))
    .map(([state, items]) => ({
      state,
      items: items.sort((x, y) => y.updated_at.localeCompare(x.updated_at)),
    }));
}

export function operationItem(op: Operation): Item {
  return {
    label: visible(op.presentation?.title || op.operation),
    description: `${op.state} · ${visible(op.client_id)}`,
    tooltip: [visible(op.presentation?.summary ?? ""), op.error ? visible(`${op.error.code}: ${op.error.message}`) : ""]
      .filter((l) => l !== "")
      .join("\n"),
  };
}

export interface Narrowing {
  label: string;
  detail: string;
  duration_seconds?: number;
  max_uses?: number;
}

function human(seconds: number): string {
  if (seconds % 3600 === 0) return `${seconds / 3600} h`;
  if (seconds % 60 === 0) return `${seconds / 60} min`;
  return `${seconds} s`;
}

/**
 * What "Approve narrower…" offers: shorter durations (1 min, 5 min, 15 min, half) strictly
 * below the requested one, and fewer uses (1, half) when the grant is a window. Every choice
 * is inside what the server accepts (1..=max); the first is the request as asked.
 */
export function narrowingChoices(n: NarrowingChoices): Narrowing[] {
  const out: Narrowing[] = [
    {
      label: `As requested: ${human(n.max_duration_seconds)}, ${n.max_uses} use(s)`,
      detail: n.covers,
    },
  ];
  if (n.duration_narrowable) {
    const ds = new Set<number>();
    for (const d of [60, 300, 900, Math.floor(n.max_duration_seconds / 2)]) {
      if (d >= 1 && d < n.max_duration_seconds) ds.add(d);
    }
    for (const d of [...ds].sort((a, b) => a - b)) {
      out.push({ label: `For ${human(d)} only`, detail: n.covers, duration_seconds: d });
    }
  }
  if (n.uses_narrowable) {
    const us = new Set<number>();
    for (const u of [1, Math.floor(n.max_uses / 2)]) {
      if (u >= 1 && u < n.max_uses) us.add(u);
    }
    for (const u of [...us].sort((a, b) => a - b)) {
      out.push({
        label: `${u} use${u === 1 ? "" : "s"} only`,
        detail: `up to ${u} matching operation(s) until the approval expires`,
        max_uses: u,
      });
    }
  }
  return out;
}

/** The right side of a file change's diff editor: the proposed content ("" for a delete). */
export function proposedContent(a: Approval): string {
  const args = a.arguments as { content?: unknown } | undefined;
  if (a.operation === "file.delete") return "";
  return typeof args?.content === "string" ? args.content : "";
}

/** Whether "Show" opens a diff editor (a file change whose plan verified). */
export function isFileChange(a: Approval): boolean {
  return (a.operation === "file.write" || a.operation === "file.delete") && a.detail?.file_change !== undefined;
}

function fence(text: string, lang = ""): string {
  const ticks = text.includes("```") ? "````" : "```";
  return `${ticks}${lang}\n${text}\n${ticks}`;
}

/** The read-only plan document "Show" opens for an approval (markdown). */
export function planMarkdown(a: Approval, nowMs: number): string {
  const d = a.detail;
  const lines: string[] = [`# ${a.title ?? a.operation}`, ""];
  if (a.summary) lines.push(a.summary, "");
  if (a.plan_problem) lines.push(`**This plan cannot run:** ${a.plan_problem}`, "");
  lines.push(
    `- operation: \`${a.operation}\` requested by \`${a.client_id}\``,
    `- approval \`${a.approval_id}\`, revision ${a.revision}, plan digest \`${a.plan_digest}\``,
    `- request expires in ${timeLeft(a.pending_expires_at, nowMs)}`,
  );
  if (a.reason) lines.push(`- the agent says: ${a.reason}`);
  if (d) {
    lines.push(
      `- mode: ${d.narrowing.mode} (${d.narrowing.covers}); at most ${d.narrowing.max_duration_seconds}s and ${d.narrowing.max_uses} use(s)`,
    );
    if (d.file_change) {
      lines.push("", `## ${d.file_change.summary}`, "");
      if (d.file_change.diff !== undefined) lines.push(fence(d.file_change.diff, "diff"));
      if (d.file_change.diff_truncated) lines.push("", "_(diff cut at its size bound)_");
    }
    if (d.command) {
      lines.push(
        "",
        "## Command",
        "",
        fence(d.command.argv.map(shellQuote).join(" "), "sh"),
        "",
        `- cwd: \`${d.command.cwd || "."}\``,
        `- sets: ${d.command.env_names.length ? d.command.env_names.map((e) => `\`${e}\``).join(", ") : "nothing"}`,
        `- inherits: ${d.command.inherited_env.join(", ")}`,
        `- killed after ${d.command.timeout_ms} ms`,
      );
    }
    lines.push("", "## Plan (the signed digest is over this text)", "", fence(pretty(d.plan), "json"));
    if (d.plan_truncated) lines.push("", "_(plan text cut at its size bound)_");
  }
  return lines.join("\n") + "\n";
}

function pretty(text: string): string {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}

export function shellQuote(s: string): string {
  return /^[A-Za-z0-9_./:=@%+-]+$/.test(s) ? s : `'${s.replace(/'/g, `'\\''`)}'`;
}

interface Lane {
  role?: string;
  scope?: string[];
  purpose?: string;
  selected_profile?: string;
  count?: number;
}

/** "gaffer: Plan a task…": the selection result as markdown. */
export function selectionMarkdown(objective: string, result: unknown): string {
  const plan = (result as { plan?: Record<string, unknown> }).plan ?? {};
  const sel = (plan.selection ?? {}) as { selected_pattern?: string; overlays?: string[]; reason?: string };
  const rt = (plan.runtime_mapping ?? {}) as { primary_mechanism?: string; fallback_mechanisms?: string[] };
  const lanes = (plan.lanes ?? []) as Lane[];
  const proofs = (plan.proof_expectations ?? []) as string[];
  const safety = (plan.safety_notes ?? []) as string[];
  const out = [
    `# Plan: ${objective}`,
    "",
    `- pattern: **${sel.selected_pattern ?? "?"}**${sel.overlays?.length ? ` + ${sel.overlays.join(", ")}` : ""}`,
    `- why: ${sel.reason ?? ""}`,
    `- mechanism: **${rt.primary_mechanism ?? "?"}**${rt.fallback_mechanisms?.length ? ` (fallback: ${rt.fallback_mechanisms.join(", ")})` : ""}`,
    "",
    "## Lanes",
    "",
    "| role | scope | profile | purpose |",
    "|---|---|---|---|",
    ...lanes.map(
      (l) =>
        `| ${l.role ?? ""}${l.count && l.count > 1 ? ` ×${l.count}` : ""} | ${(l.scope ?? []).join(", ")} | ${l.selected_profile ?? ""} | ${(l.purpose ?? "").replace(/\|/g, "\\|")} |`,
    ),
    "",
    "## Proof expectations",
    "",
    ...proofs.map((p) => `- [ ] ${p}`),
  ];
  if (safety.length) out.push("", "## Safety notes", "", ...safety.map((s) => `- ${String(s)}`));
  return out.join("\n") + "\n";
}

/** Versions as [major, minor, patch]; `undefined` when not a version. */
export function parseVersion(v: string): [number, number, number] | undefined {
  const m = /^(\d+)\.(\d+)\.(\d+)/.exec(v.trim().replace(/^gaffer\s+/, ""));
  return m ? [Number(m[1]), Number(m[2]), Number(m[3])] : undefined;
}

/** A message when `found` is older than `min` (or unreadable), else undefined. */
export function versionProblem(found: string | undefined, min: string): string | undefined {
  const f = found === undefined ? undefined : parseVersion(found);
  const m = parseVersion(min)!;
  if (!f) return `gaffer did not report a version (need ${min} or newer)`;
  for (let i = 0; i < 3; i++) {
    if (f[i] > m[i]) return undefined;
    if (f[i] < m[i]) return `gaffer ${f.join(".")} is too old: this extension needs ${min} or newer`;
  }
  return undefined;
}

/** Where the operator key is: the setting, else $GAFFER_OPERATOR_KEY_FILE, else the CLI's default. */
export function operatorKeyPath(setting: string, env: NodeJS.ProcessEnv, home: string): string {
  if (setting.trim() !== "") return setting.replace(/^~(?=\/|$)/, home);
  if (env.GAFFER_OPERATOR_KEY_FILE) return env.GAFFER_OPERATOR_KEY_FILE;
  const base = env.XDG_CONFIG_HOME && env.XDG_CONFIG_HOME !== "" ? env.XDG_CONFIG_HOME : `${home}/.config`;
  return `${base}/gaffer/operator.key`;
}

/** Where gaffer looks for the public key beside a private one (`operator.key` → `operator.pub`). */
export function publicKeyPath(keyPath: string): string {
  const slash = keyPath.lastIndexOf("/");
  const dot = keyPath.lastIndexOf(".");
  return (dot > slash + 1 ? keyPath.slice(0, dot) : keyPath) + ".pub";
}

/** One transcript entry as a worker's output channel shows it: input as `> …`, stderr as `! …`,
 * gaffer's own notes as `[gaffer] …`; whole lines except for the program's own output. */
export function transcriptText(stream: string, text: string): string {
  const line = (p: string) => text.replace(/\n$/, "").split("\n").map((l) => p + l).join("\n") + "\n";
  if (stream === "input") return line("> ");
  if (stream === "system") return line("[gaffer] ");
  if (stream === "stderr") return text.replace(/^(?=.)/gm, "! ");
  return text;
}

/**
 * Text the agent chose, safe to put in a notification: VS Code turns `[label](command:…)` in a
 * message into a link that runs the command (or opens a file or URL) when clicked, with a
 * label and hover text the agent picks. Breaking `](` keeps the text readable and inert.
 */
export function inert(s: string): string {
  return s.replace(/\]\s*\(/g, "] (");
}

/**
 * Characters that show nothing, or break or reorder what is around them: controls (C0, DEL,
 * C1), line and paragraph separators, format characters (bidi overrides and isolates,
 * zero-width, BOM, tags), lone surrogates and the rest of Unicode's default-ignorables
 * (variation selectors, Hangul fillers). An agent could hide or reorder text with them, or pad
 * a message with nothing visible.
 */
const HIDDEN = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\p{Cs}\p{Default_Ignorable_Code_Point}]/u;

/** One character as shown: itself, or `\u{…}` (as `gaffer approve` prints it) when hidden. */
function shownChar(c: string): string {
  return HIDDEN.test(c) ? `\\u{${c.codePointAt(0)!.toString(16)}}` : c;
}

/** Text the agent chose with every hidden character spelled out (see HIDDEN). */
export function visible(s: string): string {
  let out = "";
  for (const c of s) out += shownChar(c);
  return out;
}

/** VS Code cuts a notification over 1000 UTF-16 code units, silently but for "...": stay below. */
export const NOTIFICATION_MAX = 900;
const CUT = " … (see Show)";

/**
 * `s` spelled out (visible) and made inert, in at most `max` UTF-16 code units: cut between
 * characters (never inside a surrogate pair or an escape) and marked when cut.
 */
export function shownAtMost(s: string, max: number): string {
  const whole = inert(visible(s));
  if (whole.length <= max) return whole;
  let out = "";
  for (const c of s) {
    const next = inert(out + shownChar(c));
    if (next.length > max - CUT.length) break;
    out = next;
  }
  return out + CUT;
}

/**
 * The notification that offers Approve: what approving grants first (mode, uses, time: the
 * agent's text cannot push it out of view), then the agent's title and summary, bounded.
 */
export function approvalMessage(a: Approval): string {
  const head = `gaffer: ${scopeWords(a)} — `;
  const told = `${a.title ?? "an operation"}${a.summary ? ` — ${a.summary}` : ""}`;
  return head + shownAtMost(told, NOTIFICATION_MAX - head.length);
}

/** The fields of a decision payload the extension checks before signing it. */
interface DecisionPayloadFields {
  approval_id?: string;
  operation_id?: string;
  client?: string;
  operation?: string;
  plan_digest?: string;
  mode?: string;
  max_uses?: number;
  decided_at_ms?: number;
  expires_at_ms?: number | null;
}

/**
 * Why the payload to sign is not a decision on the approval as it was shown (`a`), or
 * undefined when it is: the same request, plan, client and operation, the same mode, and no
 * more uses or time than the request showed (narrowing only lowers them).
 */
export function payloadProblem(payload: string, a: Approval): string | undefined {
  let p: DecisionPayloadFields;
  try {
    p = JSON.parse(payload) as DecisionPayloadFields;
  } catch {
    return "the payload is not JSON";
  }
  const same: [keyof DecisionPayloadFields, string][] = [
    ["approval_id", a.approval_id],
    ["operation_id", a.operation_id],
    ["client", a.client_id],
    ["operation", a.operation],
    ["plan_digest", a.plan_digest],
    ["mode", a.mode],
  ];
  for (const [k, want] of same) {
    if (p[k] !== want) return `its ${k} is ${String(p[k])}, not ${want} as shown`;
  }
  if (typeof p.max_uses === "number" && p.max_uses > a.requested_max_uses) {
    return `it grants ${p.max_uses} uses, more than the ${a.requested_max_uses} shown`;
  }
  if (typeof p.expires_at_ms === "number" && typeof p.decided_at_ms === "number") {
    const seconds = (p.expires_at_ms - p.decided_at_ms) / 1000;
    if (seconds > a.requested_duration_seconds) {
      return `it lasts ${seconds}s, longer than the ${a.requested_duration_seconds}s shown`;
    }
  }
  return undefined;
}

/** What approving `a` grants, in words, for the notification that offers Approve. */
export function scopeWords(a: Approval): string {
  if (a.mode === "window") {
    const minutes = Math.ceil(a.requested_duration_seconds / 60);
    return `WINDOW: up to ${a.requested_max_uses} operations of this client with this classification for ${minutes} min, not only this plan`;
  }
  return `one execution of this plan, within ${Math.ceil(a.requested_duration_seconds / 60)} min`;
}
