// Operator login and an approval decided from Node: the private key is read from the JWK that
// `gaffer operator init` wrote and used with node:crypto, as an editor extension would, so the
// challenge and payload bytes, the Ed25519 signature and its base64url form are checked against
// a signer that is not gaffer's own.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import crypto from 'node:crypto';
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import {
  ResponseError,
} from 'vscode-jsonrpc/node.js';

import { gafferBin, makeWorkspace, removeWorkspace } from './gaffer-bin.mjs';
import { startLspServer } from './lsp-server.mjs';

const TEST_TIMEOUT = 30_000;

/** Environment for every gaffer process of this suite: a throwaway HOME and config dir. */
function gafferEnv(home) {
  const env = { ...process.env, HOME: home, XDG_CONFIG_HOME: join(home, '.config') };
  delete env.GAFFER_OPERATOR_KEY_FILE;
  delete env.GAFFER_OPERATOR_PUBLIC_KEY_FILE;
  delete env.GAFFER_CLIENT_TOKEN;
  delete env.GAFFER_LOG;
  return env;
}

function cli(workspace, env, args) {
  return execFileSync(gafferBin(), ['--workspace', workspace, ...args], {
    env,
    encoding: 'utf8',
  });
}


async function stop(server) {
  if (!server) return;
  if (server.child.exitCode === null && server.child.signalCode === null) {
    server.child.kill('SIGKILL');
    await server.exited;
  }
  server.conn.dispose();
}

function initParams(workspace, name, initializationOptions) {
  return {
    processId: process.pid,
    clientInfo: { name, version: '0' },
    rootUri: pathToFileURL(workspace).href,
    capabilities: {},
    initializationOptions,
  };
}

/** Ed25519 over exactly the UTF-8 bytes of `text`, base64url without padding. */
function sign(key, text) {
  return crypto.sign(null, Buffer.from(text, 'utf8'), key).toString('base64url');
}

/** Rejects with a ResponseError whose `data.code` is `machineCode`; returns the error. */
async function rejectsWithMachineCode(promise, machineCode) {
  let caught;
  await assert.rejects(promise, (e) => {
    caught = e;
    return true;
  });
  assert.ok(caught instanceof ResponseError, `expected a ResponseError, got ${caught}`);
  assert.equal(caught.data?.code, machineCode, `error: ${caught.message} ${JSON.stringify(caught.data)}`);
  return caught;
}

/** Resolves with the params of the first `method` notification for which `pred` holds. */
function nextNotification(conn, method, pred, timeoutMs) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      sub.dispose();
      reject(new Error(`no ${method} within ${timeoutMs} ms`));
    }, timeoutMs);
    const sub = conn.onNotification(method, (params) => {
      if (!pred(params)) return;
      clearTimeout(timer);
      sub.dispose();
      resolve(params);
    });
  });
}

describe('operator login and decisions signed with node:crypto', { timeout: 90_000 }, () => {
  let home;
  let workspace;
  let env;
  let privateKey;
  const servers = [];

  before(() => {
    home = makeWorkspace('operator-home');
    workspace = makeWorkspace('operator-ws');
    env = gafferEnv(home);
    const init = JSON.parse(cli(workspace, env, ['operator', 'init']));
    const keyFile = join(home, '.config', 'gaffer', 'operator.key');
    assert.equal(init.private_key, keyFile, JSON.stringify(init));
    assert.ok(existsSync(join(home, '.config', 'gaffer', 'operator.pub')), 'public key beside it');
    const jwk = JSON.parse(readFileSync(keyFile, 'utf8'));
    assert.equal(jwk.kty, 'OKP');
    assert.equal(jwk.crv, 'Ed25519');
    privateKey = crypto.createPrivateKey({ key: jwk, format: 'jwk' });
    // No .gaffer/policy.yaml: every operation waits for a human.
    mkdirSync(join(workspace, '.gaffer'), { recursive: true });
  });

  after(async () => {
    for (const s of servers) await stop(s);
    removeWorkspace(workspace);
    removeWorkspace(home);
  });

  async function operatorConnection() {
    const s = startLspServer(workspace, env);
    servers.push(s);
    const init = await s.conn.sendRequest(
      'initialize',
      initParams(workspace, 'node-operator', { role: 'operator' }),
    );
    assert.equal(typeof init.operatorChallenge, 'string', JSON.stringify(init));
    return { s, init };
  }

  it('a challenge signed in Node logs in, and an approval signed in Node runs the write', { timeout: TEST_TIMEOUT }, async () => {
    const { s: op, init } = await operatorConnection();
    const challenge = JSON.parse(init.operatorChallenge);
    assert.equal(challenge.domain, 'gaffer/login/v1');
    const login = await op.conn.sendRequest('operator/login', {
      signature: sign(privateKey, init.operatorChallenge),
    });
    assert.deepEqual(login, { role: 'operator' });
    await op.conn.sendNotification('initialized', {});

    // The agent: its own gaffer process, with a credential the operator issued.
    const { token } = JSON.parse(cli(workspace, env, ['client', 'add', 'node-agent']));
    assert.equal(typeof token, 'string');
    const agent = startLspServer(workspace, env);
    servers.push(agent);
    const ainit = await agent.conn.sendRequest(
      'initialize',
      initParams(workspace, 'node-agent', { clientToken: token }),
    );
    assert.equal(ainit.role, 'agent');
    await agent.conn.sendNotification('initialized', {});

    const requested = nextNotification(op.conn, 'approvals/requested', () => true, 20_000);
    const sub = await agent.conn.sendRequest('operations/submit', {
      operation: 'file.write',
      target: { path: 'docs/from-node.md' },
      arguments: { content: 'written after a Node-signed approval\n' },
      reason: 'node e2e',
      idempotency_key: 'node-op-1',
    });
    assert.equal(sub.state, 'pending', JSON.stringify(sub));
    const target = join(workspace, 'docs', 'from-node.md');
    assert.ok(!existsSync(target), 'nothing written before the decision');

    const note = await requested;
    assert.equal(note.operation_id, sub.id, JSON.stringify(note));
    const { approvals } = await op.conn.sendRequest('approvals/list', {});
    const ap = approvals.find((a) => a.operation_id === sub.id);
    assert.ok(ap, JSON.stringify(approvals));

    const prep = await op.conn.sendRequest('approvals/prepare', {
      id: ap.approval_id,
      decision: 'approve',
      expected_revision: ap.revision,
      expected_plan_digest: ap.plan_digest,
    });
    assert.equal(typeof prep.payload, 'string');
    assert.equal(JSON.parse(prep.payload).domain, 'gaffer/decision/v1');
    const decided = await op.conn.sendRequest('approvals/decide', {
      payload: prep.payload,
      signature: sign(privateKey, prep.payload),
      idempotency_key: 'node-decide-1',
    });
    assert.equal(decided.approval_id, ap.approval_id, JSON.stringify(decided));

    // The agent waits with after_revision until the operation settles.
    let rev = sub.revision;
    let view;
    const deadline = Date.now() + 20_000;
    for (;;) {
      view = await agent.conn.sendRequest('operations/wait', {
        id: sub.id,
        after_revision: rev,
        wait_seconds: 5,
      });
      if (['succeeded', 'failed', 'denied', 'cancelled'].includes(view.state)) break;
      rev = view.revision;
      assert.ok(Date.now() < deadline, `operation stuck: ${JSON.stringify(view)}`);
    }
    assert.equal(view.state, 'succeeded', JSON.stringify(view));
    assert.equal(readFileSync(target, 'utf8'), 'written after a Node-signed approval\n');
  });

  it('a signature by another Ed25519 key is refused and the connection stays an agent', { timeout: TEST_TIMEOUT }, async () => {
    const { s: op, init } = await operatorConnection();
    const stranger = crypto.generateKeyPairSync('ed25519').privateKey;
    await rejectsWithMachineCode(
      op.conn.sendRequest('operator/login', { signature: sign(stranger, init.operatorChallenge) }),
      'operator_login_failed',
    );
    await rejectsWithMachineCode(op.conn.sendRequest('approvals/list', {}), 'operator_required');
    const status = await op.conn.sendRequest('gaffer/status', {});
    assert.equal(status.role, 'agent');
  });
});
