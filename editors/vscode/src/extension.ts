// gaffer for VS Code: one `gaffer serve --lsp` per workspace folder, logged in as the operator
// by challenge-response when the operator key is readable; approvals as notifications and a
// tree, file changes as diff editors, operations and workers live.

import * as crypto from "node:crypto";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import * as vscode from "vscode";
import {
  LanguageClient,
  LanguageClientOptions,
  ServerOptions,
  State,
  WorkDoneProgress,
  CloseAction,
  ErrorAction,
} from "vscode-languageclient/node";
import * as m from "./model";
import { OperatorKey } from "./sign";

const MIN_GAFFER = "0.1.0";
const t0 = performance.now();

/** Test and diagnostics events (JSON lines) when GAFFER_VSCODE_EVENTS names a file. */
function event(ev: string, data: Record<string, unknown> = {}): void {
  const file = process.env.GAFFER_VSCODE_EVENTS;
  if (!file) return;
  try {
    fs.appendFileSync(file, JSON.stringify({ ev, t: Date.now(), ...data }) + "\n");
  } catch {
    // diagnostics only
  }
}

let log: vscode.LogOutputChannel;

class Gaffer {
  client: LanguageClient | undefined;
  operator = false;
  key: OperatorKey | undefined;
  approvals: m.Approval[] = [];
  operations: m.Operation[] = [];
  workers: m.Worker[] = [];
  /** Per opened worker: its output channel, the last seq shown, and (while its transcript loads)
   *  the live chunks that arrived meanwhile, so none is shown twice or lost. */
  private workerChannels = new Map<string, WorkerChannel>();
  private refreshTimer: NodeJS.Timeout | undefined;
  private stopping = false;

  constructor(
    readonly folder: vscode.WorkspaceFolder,
    private readonly ui: Ui,
  ) {}

  get name(): string {
    return this.folder.name;
  }

  async start(): Promise<void> {
    const cfg = vscode.workspace.getConfiguration("gaffer", this.folder.uri);
    const bin = cfg.get<string>("path", "").trim() || "gaffer";
    event("config", { bin, inspect: cfg.inspect("path") });
    const keySetting = cfg.get<string>("operator.keyFile", "");
    const keyPath = m.operatorKeyPath(keySetting, process.env, os.homedir());
    const publicKey =
      keySetting.trim() === "" && process.env.GAFFER_OPERATOR_PUBLIC_KEY_FILE
        ? process.env.GAFFER_OPERATOR_PUBLIC_KEY_FILE
        : m.publicKeyPath(keyPath);
    this.key = undefined;
    let keyProblem: string | undefined;
    if (fs.existsSync(keyPath)) {
      try {
        this.key = OperatorKey.load(keyPath);
      } catch (e) {
        keyProblem = String((e as Error).message);
      }
    } else {
      keyProblem = `no operator key at ${keyPath}: run \`gaffer operator init\` or set gaffer.operator.keyFile`;
    }
    const server: ServerOptions = {
      command: bin,
      args: ["serve", "--lsp"],
      // Only the public key's path goes to the server; it never reads the private key.
      options: {
        cwd: this.folder.uri.fsPath,
        env: { ...process.env, GAFFER_OPERATOR_PUBLIC_KEY_FILE: publicKey },
      },
    };
    const options: LanguageClientOptions = {
      documentSelector: [],
      workspaceFolder: this.folder,
      outputChannel: log,
      initializationOptions: this.key ? { role: "operator" } : {},
      initializationFailedHandler: (e) => {
        log.appendLine(`gaffer failed to initialize: ${String(e)}`);
        return false;
      },
      errorHandler: {
        error: () => ({ action: ErrorAction.Continue }),
        closed: () => {
          if (!this.stopping) void this.ui.crashed(this);
          return { action: CloseAction.DoNotRestart, handled: true };
        },
      },
    };
    const client = new LanguageClient(`gaffer-${this.folder.index}`, `gaffer (${this.name})`, server, options);
    this.client = client;
    client.onNotification("approvals/requested", (p: { approval_id: string; title?: string }) => {
      event("requested", { approval_id: p.approval_id, title: p.title });
      void this.onRequested(p.approval_id);
    });
    client.onNotification("operations/changed", () => this.scheduleRefresh());
    client.onNotification("workers/changed", () => this.scheduleRefresh());
    client.onNotification("workers/output", (p: OutputChunk & { worker_id: string }) => {
      const w = this.workerChannels.get(p.worker_id);
      if (!w) return;
      if (w.loading) w.loading.push(p);
      else showChunk(w, p);
    });
    try {
      await client.start();
    } catch (e) {
      this.client = undefined;
      await this.ui.startFailed(this, bin, e instanceof Error ? e : new Error(JSON.stringify(e)));
      return;
    }
    const status = await client.sendRequest<{ version?: string }>("gaffer/status", {});
    const tooOld = m.versionProblem(status.version, MIN_GAFFER);
    if (tooOld) {
      void this.ui.tooOld(this, tooOld);
    }
    if (this.key) {
      const init = client.initializeResult as unknown as { operatorChallenge?: string };
      if (typeof init.operatorChallenge === "string") {
        try {
          await client.sendRequest("operator/login", { signature: this.key.sign(init.operatorChallenge) });
          this.operator = true;
        } catch (e) {
          keyProblem = `operator login refused: ${(e as Error).message}`;
        }
      } else {
        keyProblem = "this gaffer offered no operator challenge";
      }
    }
    if (keyProblem) {
      log.appendLine(`[${this.name}] ${keyProblem}`);
      void vscode.window.showWarningMessage(`gaffer (${this.name}): ${keyProblem}. Approvals are read-only here.`);
    }
    await this.refresh();
    event("ready", { folder: this.name, operator: this.operator, activation_ms: Math.round(performance.now() - t0) });
    // Requests that arrived before this window opened.
    for (const a of this.approvals) void this.onRequested(a.approval_id);
  }

  async stop(): Promise<void> {
    this.stopping = true;
    const c = this.client;
    this.client = undefined;
    this.operator = false;
    if (c && c.state === State.Running) await c.stop().catch(() => undefined);
    else if (c) await c.dispose().catch(() => undefined);
    this.stopping = false;
  }

  private scheduleRefresh(): void {
    if (this.refreshTimer) return;
    this.refreshTimer = setTimeout(() => {
      this.refreshTimer = undefined;
      void this.refresh();
    }, 50);
  }

  async refresh(): Promise<void> {
    const c = this.client;
    if (!c) return;
    try {
      const [ops, workers] = await Promise.all([
        c.sendRequest<{ operations: m.Operation[] }>("operations/list", { limit: 200 }),
        c.sendRequest<{ workers: m.Worker[] }>("workers/list", {}),
      ]);
      this.operations = ops.operations;
      this.workers = workers.workers;
      this.approvals = this.operator
        ? (await c.sendRequest<{ approvals: m.Approval[] }>("approvals/list", {})).approvals
        : [];
    } catch (e) {
      log.appendLine(`[${this.name}] refresh failed: ${(e as Error).message}`);
    }
    this.ui.changed();
  }

  private shown = new Set<string>();

  async onRequested(approvalId: string): Promise<void> {
    this.scheduleRefresh();
    if (!this.operator || this.shown.has(approvalId)) return;
    this.shown.add(approvalId);
    const a = await this.get(approvalId).catch(() => undefined);
    // Nothing to show, nothing to approve: the list and the tree still hold the request.
    if (!a) return;
    // What Approve grants is in the same message as the button, ahead of the agent's text.
    await this.ui.offer(this, a, m.approvalMessage(a), true);
  }

  async get(id: string): Promise<m.Approval> {
    if (!this.client) throw new Error("gaffer is not running");
    return this.client.sendRequest<m.Approval>("approvals/get", { id });
  }

  /**
   * prepare → sign here → decide; the signature is the only thing that leaves. `a` is the
   * approval as the operator was shown it: the decision binds its revision and plan digest,
   * so a plan swapped behind the same ids since is refused (`plan_changed`), never signed.
   */
  async decide(
    a: m.Approval,
    decision: "approve" | "deny",
    opts: { constraints?: { duration_seconds?: number; max_uses?: number }; reason?: string } = {},
  ): Promise<m.Approval> {
    const c = this.client;
    if (!c || !this.key || !this.operator) throw new Error("not logged in as the operator");
    const prep = await c.sendRequest<{ payload: string }>("approvals/prepare", {
      id: a.approval_id,
      decision,
      expected_revision: a.revision,
      expected_plan_digest: a.plan_digest,
      constraints: opts.constraints,
      reason: opts.reason,
    });
    // What is signed must decide the approval as it was shown, whatever the server says.
    const problem = m.payloadProblem(prep.payload, a);
    if (problem) throw new Error(`nothing was signed: the payload is not the approval you were shown (${problem})`);
    const out = await withServerProgress(c, `gaffer: ${decision === "approve" ? "approving" : "denying"} ${m.visible(a.title ?? a.operation)}`, "approvals/decide", {
      payload: prep.payload,
      signature: this.key.sign(prep.payload),
      idempotency_key: crypto.randomUUID(),
    });
    event("decided", { approval_id: a.approval_id, decision });
    await this.refresh();
    return out as m.Approval;
  }

  async openWorker(w: m.Worker): Promise<void> {
    const c = this.client;
    if (!c) return;
    let wc = this.workerChannels.get(w.id);
    if (!wc) {
      const ch = vscode.window.createOutputChannel(`gaffer worker ${m.visible(w.display_name || w.id)}`);
      wc = { ch, shown: 0, loading: [] };
      this.workerChannels.set(w.id, wc);
      try {
        for (;;) {
          const page = await c.sendRequest<{
            entries: OutputChunk[];
            has_more: boolean;
            next_after_seq: number;
          }>("workers/transcript", { worker_id: w.id, after_seq: wc.shown, limit: 500 });
          for (const e of page.entries) showChunk(wc, e);
          wc.shown = Math.max(wc.shown, page.next_after_seq);
          if (!page.has_more) break;
        }
      } finally {
        // Live chunks that arrived while the transcript loaded: only those it did not hold.
        const early = wc.loading ?? [];
        wc.loading = undefined;
        for (const p of early) showChunk(wc, p);
      }
    }
    wc.ch.show(true);
  }

  async stopWorker(w: m.Worker): Promise<void> {
    await this.client?.sendRequest("workers/stop", { worker_id: w.id, reason: "stopped from VS Code" });
    await this.refresh();
  }
}


type OutputChunk = { seq: number; stream: string; text: string };
type WorkerChannel = { ch: vscode.OutputChannel; shown: number; loading?: OutputChunk[] };

/** Appends a chunk once: transcript pages and live notifications share the store's seq. */
function showChunk(w: WorkerChannel, c: OutputChunk): void {
  if (c.seq <= w.shown) return;
  w.ch.append(m.transcriptText(c.stream, c.text));
  w.shown = c.seq;
}

async function withServerProgress(client: LanguageClient, title: string, method: string, params: object): Promise<unknown> {
  const token = crypto.randomUUID();
  return vscode.window.withProgress({ location: vscode.ProgressLocation.Window, title }, async (progress) => {
    const sub = client.onProgress(WorkDoneProgress.type, token, (v) => {
      const message = v.kind === "begin" ? (v.message ?? v.title) : v.message;
      event("progress", { method, kind: v.kind, message });
      if (v.kind !== "end" && message) progress.report({ message });
    });
    try {
      return await client.sendRequest(method, { ...params, workDoneToken: token });
    } finally {
      sub.dispose();
    }
  });
}

// --- views -----------------------------------------------------------------------------------

type Node =
  | { kind: "approval"; g: Gaffer; a: m.Approval }
  | { kind: "group"; g: Gaffer | undefined; state: string; ops: { g: Gaffer; op: m.Operation }[] }
  | { kind: "operation"; g: Gaffer; op: m.Operation }
  | { kind: "worker"; g: Gaffer; w: m.Worker }
  | { kind: "note"; text: string };

class Tree implements vscode.TreeDataProvider<Node> {
  private emitter = new vscode.EventEmitter<Node | undefined>();
  readonly onDidChangeTreeData = this.emitter.event;
  constructor(
    private readonly roots: () => Node[],
    private readonly multi: () => boolean,
  ) {}
  fire(): void {
    this.emitter.fire(undefined);
  }
  getChildren(n?: Node): Node[] {
    if (!n) return this.roots();
    if (n.kind === "group") return n.ops.map(({ g, op }) => ({ kind: "operation", g, op }));
    return [];
  }
  getTreeItem(n: Node): vscode.TreeItem {
    const where = (g: Gaffer) => (this.multi() ? ` · ${g.name}` : "");
    switch (n.kind) {
      case "approval": {
        const v = m.approvalItem(n.a, Date.now());
        const t = new vscode.TreeItem(v.label);
        t.id = `approval/${n.g.name}/${n.a.approval_id}`;
        t.description = v.description + where(n.g);
        t.tooltip = v.tooltip;
        t.contextValue = "approval";
        t.iconPath = new vscode.ThemeIcon("shield");
        t.command = { command: "gaffer.show", title: "Show", arguments: [n] };
        return t;
      }
      case "group": {
        const t = new vscode.TreeItem(`${n.state} (${n.ops.length})`, vscode.TreeItemCollapsibleState.Expanded);
        // A stable id, not one derived from the label: the count in the label changes with
        // every refresh, and VS Code then could not resolve a group whose children it was
        // still fetching (the group stayed open and empty until the next refresh).
        t.id = `group/${n.g?.name ?? ""}/${n.state}`;
        t.contextValue = "group";
        return t;
      }
      case "operation": {
        const v = m.operationItem(n.op);
        const t = new vscode.TreeItem(v.label);
        t.id = `op/${n.g.name}/${n.op.id}`;
        t.description = v.description + where(n.g);
        t.tooltip = v.tooltip;
        t.contextValue = "operation";
        return t;
      }
      case "worker": {
        const t = new vscode.TreeItem(m.visible(n.w.display_name || n.w.id));
        t.id = `worker/${n.g.name}/${n.w.id}`;
        t.description = n.w.status + where(n.g);
        t.contextValue = "worker";
        t.iconPath = new vscode.ThemeIcon("server-process");
        t.command = { command: "gaffer.openWorker", title: "Open", arguments: [n] };
        return t;
      }
      case "note":
        return new vscode.TreeItem(n.text);
    }
  }
}

const PROPOSED = "gaffer-proposed";
const CURRENT = "gaffer-current";
const PLAN = "gaffer-plan";

class Ui {
  gaffers = new Map<string, Gaffer>();
  approvalsTree: Tree;
  operationsTree: Tree;
  workersTree: Tree;
  status: vscode.StatusBarItem;
  docs = new Map<string, string>();
  private docEmitter = new vscode.EventEmitter<vscode.Uri>();
  private ticker: NodeJS.Timeout;

  constructor(ctx: vscode.ExtensionContext) {
    const all = () => [...this.gaffers.values()];
    const multi = () => this.gaffers.size > 1;
    this.approvalsTree = new Tree(() => {
      const nodes: Node[] = all().flatMap((g) => g.approvals.map((a) => ({ kind: "approval" as const, g, a })));
      if (nodes.length === 0) {
        const why = all().some((g) => g.client && !g.operator) ? "not logged in as the operator" : "nothing is waiting";
        return [{ kind: "note", text: why }];
      }
      return nodes;
    }, multi);
    this.operationsTree = new Tree(() => {
      const pairs = all().flatMap((g) => g.operations.map((op) => ({ g, op })));
      const groups = m.groupOperations(pairs.map((p) => p.op));
      return groups.map((gr) => ({
        kind: "group" as const,
        g: undefined,
        state: gr.state,
        ops: gr.items.map((op) => pairs.find((p) => p.op === op)!),
      }));
    }, multi);
    this.workersTree = new Tree(() => all().flatMap((g) => g.workers.map((w) => ({ kind: "worker" as const, g, w }))), multi);
    ctx.subscriptions.push(
      vscode.window.createTreeView("gaffer.approvals", { treeDataProvider: this.approvalsTree }),
      vscode.window.createTreeView("gaffer.operations", { treeDataProvider: this.operationsTree }),
      vscode.window.createTreeView("gaffer.workers", { treeDataProvider: this.workersTree }),
    );
    this.status = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Left, 50);
    this.status.command = "gaffer.approvals.focus";
    this.status.name = "gaffer approvals";
    ctx.subscriptions.push(this.status);
    const provider: vscode.TextDocumentContentProvider = {
      onDidChange: this.docEmitter.event,
      provideTextDocumentContent: (uri) => this.docs.get(uri.toString()) ?? "",
    };
    for (const scheme of [PROPOSED, CURRENT, PLAN]) {
      ctx.subscriptions.push(vscode.workspace.registerTextDocumentContentProvider(scheme, provider));
    }
    // Time left in the Approvals view.
    this.ticker = setInterval(() => {
      if (all().some((g) => g.approvals.length > 0)) this.approvalsTree.fire();
    }, 5000);
    ctx.subscriptions.push({ dispose: () => clearInterval(this.ticker) });
    this.changed();
  }

  changed(): void {
    const n = [...this.gaffers.values()].reduce((s, g) => s + g.approvals.length, 0);
    const up = [...this.gaffers.values()].some((g) => g.client);
    this.status.text = up ? `$(shield) gaffer: ${n} pending` : "$(shield) gaffer: not running";
    this.status.tooltip = up ? "Approvals waiting for you" : "gaffer is not running: see the gaffer output";
    this.status.show();
    this.approvalsTree.fire();
    this.operationsTree.fire();
    this.workersTree.fire();
  }

  /** The notification for an approval: Approve / Deny / Show (and, after Show, narrower). */
  async offer(g: Gaffer, a: m.Approval, text: string, first: boolean): Promise<void> {
    const actions = first ? ["Approve", "Deny", "Show"] : ["Approve", "Approve narrower…", "Deny"];
    if (first) event("notify", { approval_id: a.approval_id });
    const pick = await vscode.window.showInformationMessage(text, ...actions);
    try {
      if (pick === "Approve") await this.approve(g, a);
      else if (pick === "Deny") await this.deny(g, a);
      else if (pick === "Approve narrower…") await this.approveNarrower(g, a);
      else if (pick === "Show") {
        await this.show(g, a);
        await this.offer(g, a, text, false);
      }
    } catch (e) {
      void vscode.window.showErrorMessage(m.inert(`gaffer: ${(e as Error).message}`));
    }
  }

  async approve(g: Gaffer, a: m.Approval): Promise<void> {
    const r = await g.decide(a, "approve");
    void vscode.window.showInformationMessage(m.inert(`gaffer: approved ${m.visible(r.title ?? r.operation)}`));
    void this.follow(g, r.operation_id, m.visible(r.title ?? r.operation));
  }

  /** After an approval: the operation's progress in the window, then its outcome. */
  async follow(g: Gaffer, opId: string, title: string): Promise<void> {
    const c = g.client;
    if (!c) return;
    try {
      let rev = 0;
      let op: m.Operation & { revision: number };
      let i = 0;
      do {
        op = (await withServerProgress(c, `gaffer: ${title}`, "operations/wait", {
          id: opId,
          after_revision: rev,
          wait_seconds: 30,
        })) as m.Operation & { revision: number };
        rev = op.revision;
      } while (!m.TERMINAL.has(op.state) && ++i < 20);
      event("outcome", { operation_id: opId, state: op.state });
      const text = m.inert(`gaffer: ${title} ${op.state}${op.error ? `: ${m.visible(op.error.message)}` : ""}`);
      if (op.state === "succeeded") void vscode.window.showInformationMessage(text);
      else if (m.TERMINAL.has(op.state)) void vscode.window.showWarningMessage(text);
    } catch (e) {
      log.appendLine(`[${g.name}] following ${opId}: ${(e as Error).message}`);
    }
  }

  async approveNarrower(g: Gaffer, a: m.Approval): Promise<void> {
    if (!a.detail) throw new Error(a.plan_problem ?? "this plan cannot be approved");
    const choices = m.narrowingChoices(a.detail.narrowing);
    const pick = await vscode.window.showQuickPick(
      choices.map((c) => ({ label: c.label, detail: c.detail, c })),
      { title: `Approve ${m.visible(a.title ?? a.operation)}`, placeHolder: "How much to allow" },
    );
    if (!pick) return;
    await g.decide(a, "approve", {
      constraints: { duration_seconds: pick.c.duration_seconds, max_uses: pick.c.max_uses },
    });
    void vscode.window.showInformationMessage(m.inert(`gaffer: approved ${m.visible(a.title ?? a.operation)} (${pick.label})`));
    void this.follow(g, a.operation_id, m.visible(a.title ?? a.operation));
  }

  async deny(g: Gaffer, a: m.Approval): Promise<void> {
    const reason = await vscode.window.showInputBox({
      title: "Deny",
      prompt: "Why? The agent receives these words in the operation's error.",
      placeHolder: "reason (optional)",
      ignoreFocusOut: true,
    });
    if (reason === undefined) return;
    await g.decide(a, "deny", { reason: reason.trim() === "" ? undefined : reason });
    void vscode.window.showInformationMessage("gaffer: denied");
  }

  /** A file change as a diff editor (current file ↔ proposed, both read-only), else the plan:
   * the approval as it will be decided (`a`, whose plan digest the decision binds). */
  async show(g: Gaffer, a: m.Approval): Promise<void> {
    if (m.isFileChange(a)) {
      const fc = a.detail!.file_change!;
      const current = path.join(g.folder.uri.fsPath, fc.path);
      let currentText = "";
      try {
        currentText = fs.readFileSync(current, "utf8");
      } catch {
        currentText = "";
      }
      const q = `approval=${encodeURIComponent(a.approval_id)}&rev=${a.revision}`;
      const left = vscode.Uri.from({ scheme: CURRENT, path: "/" + fc.path, query: q });
      const right = vscode.Uri.from({ scheme: PROPOSED, path: "/" + fc.path, query: q });
      this.docs.set(left.toString(), currentText);
      this.docs.set(right.toString(), m.proposedContent(a));
      await vscode.commands.executeCommand("vscode.diff", left, right, `${fc.path}: now ↔ proposed (${a.approval_id})`, {
        preview: true,
      });
      event("shown-diff", { approval_id: a.approval_id });
      return;
    }
    const uri = vscode.Uri.from({ scheme: PLAN, path: `/${a.approval_id}.md` });
    this.docs.set(uri.toString(), m.planMarkdown(a, Date.now()));
    this.docEmitter.fire(uri);
    const doc = await vscode.workspace.openTextDocument(uri);
    await vscode.window.showTextDocument(doc, { preview: true });
  }

  async planTask(g: Gaffer): Promise<void> {
    const objective = await vscode.window.showInputBox({ title: "gaffer: Plan a task", prompt: "What should the agents do?" });
    if (!objective || !g.client) return;
    const scopes = await vscode.window.showInputBox({ title: "Scopes (comma-separated, optional)", prompt: "e.g. router, billing" });
    const result = await withServerProgress(g.client, "gaffer: planning", "patterns/select", {
      objective,
      scopes: (scopes ?? "")
        .split(",")
        .map((s) => s.trim())
        .filter((s) => s !== ""),
      output: "select",
    });
    const uri = vscode.Uri.from({ scheme: PLAN, path: `/plan-${Date.now()}.md` });
    this.docs.set(uri.toString(), m.selectionMarkdown(objective, result));
    await vscode.commands.executeCommand("markdown.showPreview", uri).then(undefined, async () => {
      await vscode.window.showTextDocument(await vscode.workspace.openTextDocument(uri));
    });
  }

  async startFailed(g: Gaffer, bin: string, e: Error): Promise<void> {
    const missing = /ENOENT|not found|spawn/i.test(String(e.message));
    const msg = missing
      ? `gaffer: cannot start "${bin}" for ${g.name} (${e.message}). Install it (cargo install --path .) or set gaffer.path.`
      : `gaffer: "${bin}" failed to start for ${g.name}: ${e.message}`;
    event("start-failed", { message: msg });
    this.changed();
    const pick = await vscode.window.showErrorMessage(msg, "Open Settings", "Restart");
    if (pick === "Open Settings") await vscode.commands.executeCommand("workbench.action.openSettings", "gaffer.path");
    else if (pick === "Restart") await restart();
  }

  async tooOld(_g: Gaffer, msg: string): Promise<void> {
    const pick = await vscode.window.showErrorMessage(`${msg}. Update it or point gaffer.path at a newer build.`, "Open Settings");
    if (pick) await vscode.commands.executeCommand("workbench.action.openSettings", "gaffer.path");
  }

  async crashed(g: Gaffer): Promise<void> {
    const dead = g.client;
    g.client = undefined;
    setTimeout(() => void dead?.dispose().catch(() => undefined), 0);
    g.operator = false;
    this.changed();
    event("crashed", { folder: g.name });
    const pick = await vscode.window.showErrorMessage(`gaffer for ${g.name} stopped unexpectedly.`, "Restart", "Show Log");
    if (pick === "Restart") await restart();
    else if (pick === "Show Log") log.show();
  }

  /** The gaffer an action applies to: the node's, the only one, or the user's pick. */
  async pick(n?: Node): Promise<Gaffer | undefined> {
    if (n && "g" in n && n.g) return n.g;
    const all = [...this.gaffers.values()].filter((g) => g.client);
    if (all.length <= 1) return all[0];
    const p = await vscode.window.showQuickPick(all.map((g) => ({ label: g.name, g })));
    return p?.g;
  }

  /**
   * The approval a tree node or the picker shows, in full (the list holds no `detail`): read
   * again, and refused if it is no longer the request that was listed.
   */
  async pickApproval(n?: Node): Promise<[Gaffer, m.Approval] | undefined> {
    let picked: [Gaffer, m.Approval] | undefined;
    if (n && n.kind === "approval") picked = [n.g, n.a];
    else {
      const items = [...this.gaffers.values()].flatMap((g) =>
        g.approvals.map((a) => ({ label: m.approvalItem(a, Date.now()).label, description: g.name, g, a })),
      );
      const p = await vscode.window.showQuickPick(items, { placeHolder: "Which approval?" });
      picked = p ? [p.g, p.a] : undefined;
    }
    if (!picked) return undefined;
    const [g, listed] = picked;
    const full = await g.get(listed.approval_id);
    if (full.plan_digest !== listed.plan_digest || full.revision !== listed.revision || full.mode !== listed.mode) {
      await g.refresh();
      throw new Error("this request changed since it was listed; look at it again");
    }
    return [g, full];
  }
}

let ui: Ui | undefined;

async function syncFolders(): Promise<void> {
  if (!ui) return;
  const want = new Map((vscode.workspace.workspaceFolders ?? []).filter((f) => f.uri.scheme === "file").map((f) => [f.uri.toString(), f]));
  for (const [k, g] of ui.gaffers) {
    if (!want.has(k)) {
      ui.gaffers.delete(k);
      await g.stop();
    }
  }
  const starts: Promise<void>[] = [];
  for (const [k, f] of want) {
    if (!ui.gaffers.has(k)) {
      const g = new Gaffer(f, ui);
      ui.gaffers.set(k, g);
      starts.push(g.start());
    }
  }
  await Promise.all(starts);
  ui.changed();
}

async function restart(): Promise<void> {
  if (!ui) return;
  const old = [...ui.gaffers.values()];
  ui.gaffers.clear();
  await Promise.all(old.map((g) => g.stop()));
  await syncFolders();
}

export async function activate(ctx: vscode.ExtensionContext): Promise<void> {
  event("activate");
  log = vscode.window.createOutputChannel("gaffer", { log: true });
  ctx.subscriptions.push(log);
  const u = new Ui(ctx);
  ui = u;
  const guard =
    <A extends unknown[]>(f: (...a: A) => Promise<void>) =>
    async (...a: A) => {
      try {
        await f(...a);
      } catch (e) {
        void vscode.window.showErrorMessage(m.inert(`gaffer: ${(e as Error).message}`));
      }
    };
  const onApproval = (f: (g: Gaffer, a: m.Approval) => Promise<void>) =>
    guard(async (n?: Node) => {
      const p = await u.pickApproval(n);
      if (p) await f(p[0], p[1]);
    });
  ctx.subscriptions.push(
    vscode.commands.registerCommand("gaffer.approve", onApproval((g, a) => u.approve(g, a))),
    vscode.commands.registerCommand("gaffer.approveNarrower", onApproval((g, a) => u.approveNarrower(g, a))),
    vscode.commands.registerCommand("gaffer.deny", onApproval((g, a) => u.deny(g, a))),
    vscode.commands.registerCommand("gaffer.show", onApproval((g, a) => u.show(g, a))),
    vscode.commands.registerCommand(
      "gaffer.refresh",
      guard(async () => {
        await Promise.all([...u.gaffers.values()].map((g) => g.refresh()));
      }),
    ),
    vscode.commands.registerCommand("gaffer.restart", guard(restart)),
    vscode.commands.registerCommand(
      "gaffer.planTask",
      guard(async () => {
        const g = await u.pick();
        if (!g) throw new Error("gaffer is not running for any folder");
        await u.planTask(g);
      }),
    ),
    vscode.commands.registerCommand(
      "gaffer.openWorker",
      guard(async (n?: Node) => {
        if (n?.kind === "worker") await n.g.openWorker(n.w);
      }),
    ),
    vscode.commands.registerCommand(
      "gaffer.stopWorker",
      guard(async (n?: Node) => {
        if (n?.kind === "worker") await n.g.stopWorker(n.w);
      }),
    ),
    vscode.workspace.onDidChangeWorkspaceFolders(() => void syncFolders()),
    vscode.workspace.onDidChangeConfiguration((e) => {
      if (e.affectsConfiguration("gaffer")) void restart();
    }),
  );
  await syncFolders();
  event("activated", { activation_ms: Math.round(performance.now() - t0) });
}

export async function deactivate(): Promise<void> {
  if (!ui) return;
  await Promise.all([...ui.gaffers.values()].map((g) => g.stop()));
}
