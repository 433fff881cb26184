// Drives the real gaffer binary over LSP framing with vscode-jsonrpc, the library VS Code
// extensions use, so header framing, cancellation and progress are checked against a real client.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { pathToFileURL } from 'node:url';
import {
  CancellationTokenSource,
  ProgressType,
  ResponseError,
} from 'vscode-jsonrpc/node.js';

import { makeWorkspace, removeWorkspace } from './gaffer-bin.mjs';
import { startLspServer } from './lsp-server.mjs';

const TEST_TIMEOUT = 15_000;


function initializeParams(workspace) {
  return {
    processId: process.pid,
    clientInfo: { name: 'node-test-lsp', version: '0' },
    rootUri: pathToFileURL(workspace).href,
    capabilities: { window: { workDoneProgress: true } },
  };
}

/** Asserts that `promise` rejects with a JSON-RPC error of `code`; returns that error. */
async function rejectsWithCode(promise, code) {
  let caught;
  await assert.rejects(promise, (e) => {
    caught = e;
    return true;
  });
  assert.ok(caught instanceof ResponseError, `expected a ResponseError, got ${caught}`);
  assert.equal(caught.code, code, `error code (message: ${caught.message})`);
  return caught;
}

async function stopIfRunning(server) {
  if (!server) return;
  if (server.child.exitCode === null && server.child.signalCode === null) {
    server.child.kill('SIGKILL');
    await server.exited;
  }
  server.conn.dispose();
}

describe('gaffer serve --lsp with vscode-jsonrpc', { timeout: 30_000 }, () => {
  let workspace;
  let server;
  let init;

  before(async () => {
    workspace = makeWorkspace('lsp');
    server = startLspServer(workspace);
    init = await server.conn.sendRequest('initialize', initializeParams(workspace));
    await server.conn.sendNotification('initialized', {});
  });

  after(async () => {
    await stopIfRunning(server);
    removeWorkspace(workspace);
  });

  it('initialize names the server and advertises gaffer/status', { timeout: TEST_TIMEOUT }, () => {
    assert.equal(init.serverInfo?.name, 'gaffer');
    assert.equal(typeof init.serverInfo?.version, 'string');
    const methods = init.capabilities?.experimental?.gaffer?.methods;
    assert.ok(Array.isArray(methods), 'capabilities.experimental.gaffer.methods is an array');
    assert.ok(methods.includes('gaffer/status'), `methods: ${JSON.stringify(methods)}`);
    for (const m of methods) assert.equal(typeof m, 'string');
  });

  it('gaffer/status describes this server, workspace and store', { timeout: TEST_TIMEOUT }, async () => {
    const status = await server.conn.sendRequest('gaffer/status', {});
    assert.equal(status.version, init.serverInfo.version);
    assert.equal(status.workspace, workspace);
    assert.equal(status.profile, 'lsp');
    assert.equal(status.role, 'agent');
    assert.equal(status.pid, server.child.pid);
    assert.equal(typeof status.client, 'string');
    assert.ok(status.client.length > 0, 'client id is not empty');
    assert.equal(typeof status.store, 'object');
    assert.ok(
      status.store.dir.startsWith(workspace),
      `store dir ${status.store.dir} lies inside workspace ${workspace}`,
    );
    assert.equal(typeof status.store.exists, 'boolean');
    assert.ok(Number.isInteger(status.store.seq) && status.store.seq >= 0, 'seq is a u64');
    assert.ok(Array.isArray(status.peers), 'peers is an array');
  });

  it('an unknown method is -32601', { timeout: TEST_TIMEOUT }, async () => {
    await rejectsWithCode(server.conn.sendRequest('gaffer/no-such-method', {}), -32601);
  });

  it('a mistyped parameter is -32602 naming the field', { timeout: TEST_TIMEOUT }, async () => {
    const e = await rejectsWithCode(
      server.conn.sendRequest('gaffer/status', { after_seq: 'x' }),
      -32602,
    );
    assert.equal(e.data?.field, 'after_seq', `error data: ${JSON.stringify(e.data)}`);
  });

  it('cancelling a waiting gaffer/status yields -32800 well before its timeout', { timeout: TEST_TIMEOUT }, async () => {
    const source = new CancellationTokenSource();
    const started = Date.now();
    const pending = server.conn.sendRequest(
      'gaffer/status',
      { after_seq: 1e9, timeout_ms: 30_000 },
      source.token,
    );
    setTimeout(() => source.cancel(), 150);
    // vscode-jsonrpc only settles the promise from the server's reply, so this is the server's
    // own -32800, not a client-side shortcut.
    await rejectsWithCode(pending, -32800);
    const elapsed = Date.now() - started;
    assert.ok(elapsed < 10_000, `cancelled reply came after ${elapsed} ms`);
    source.dispose();

    // The connection is still usable after the cancellation.
    const status = await server.conn.sendRequest('gaffer/status', {});
    assert.equal(status.profile, 'lsp');
  });

  it('a workDoneToken gets $/progress begin and end around the wait', { timeout: TEST_TIMEOUT }, async () => {
    const { store } = await server.conn.sendRequest('gaffer/status', {});
    const token = 'node-test-progress-1';
    const reports = [];
    const subscription = server.conn.onProgress(new ProgressType(), token, (value) => {
      reports.push(value);
    });
    try {
      // Nothing writes to this workspace, so the wait runs until its short timeout.
      const status = await server.conn.sendRequest('gaffer/status', {
        after_seq: store.seq,
        timeout_ms: 300,
        workDoneToken: token,
      });
      assert.equal(status.store.seq, store.seq, 'nothing was written meanwhile');
      assert.deepEqual(
        reports.map((r) => r.kind),
        ['begin', 'end'],
        `progress reports: ${JSON.stringify(reports)}`,
      );
      assert.equal(typeof reports[0].title, 'string');
      assert.ok(reports[0].title.length > 0, 'begin has a title');
    } finally {
      subscription.dispose();
    }
  });

  it('shutdown then exit ends the process with code 0', { timeout: TEST_TIMEOUT }, async () => {
    const reply = await server.conn.sendRequest('shutdown');
    assert.equal(reply, null);
    await server.conn.sendNotification('exit');
    const { code, signal } = await server.exited;
    assert.equal(signal, null, `stderr:\n${server.stderr()}`);
    assert.equal(code, 0, `stderr:\n${server.stderr()}`);
  });
});

describe('gaffer serve --lsp exit without shutdown', { timeout: 30_000 }, () => {
  let workspace;
  let server;

  before(() => {
    workspace = makeWorkspace('lsp-exit');
    server = startLspServer(workspace);
  });

  after(async () => {
    await stopIfRunning(server);
    removeWorkspace(workspace);
  });

  it('exit before shutdown ends the process with code 1', { timeout: TEST_TIMEOUT }, async () => {
    const init = await server.conn.sendRequest('initialize', initializeParams(workspace));
    assert.equal(init.serverInfo?.name, 'gaffer');
    await server.conn.sendNotification('initialized', {});
    await server.conn.sendNotification('exit');
    const { code } = await server.exited;
    assert.equal(code, 1, `stderr:\n${server.stderr()}`);
  });
});
