// Drives the real gaffer binary as an MCP server with the official TypeScript SDK client, the
// way agent hosts start it: a child process speaking newline-delimited JSON on stdio.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';

import { gafferBin, makeWorkspace, removeWorkspace } from './gaffer-bin.mjs';

const TEST_TIMEOUT = 15_000;

describe('gaffer serve --mcp with the MCP SDK client', { timeout: 30_000 }, () => {
  let workspace;
  let transport;
  let client;
  let stderr = '';
  let closed = false;
  let tools = [];

  before(async () => {
    workspace = makeWorkspace('mcp');
    transport = new StdioClientTransport({
      command: gafferBin(),
      args: ['--workspace', workspace, 'serve', '--mcp'],
      stderr: 'pipe',
    });
    transport.stderr?.setEncoding('utf8');
    transport.stderr?.on('data', (chunk) => {
      stderr += chunk;
    });
    client = new Client({ name: 'node-test-mcp', version: '0.0.0' });
    client.onclose = () => {
      closed = true;
    };
    await client.connect(transport);
    ({ tools } = await client.listTools());
  });

  after(async () => {
    if (!closed) await client?.close();
    removeWorkspace(workspace);
  });

  const toolNamed = (name) => tools.find((t) => t.name === name);

  it('initialize reports the gaffer server', { timeout: TEST_TIMEOUT }, () => {
    const info = client.getServerVersion();
    assert.equal(info?.name, 'gaffer', `server info: ${JSON.stringify(info)}`);
    assert.equal(typeof info.version, 'string');
    assert.equal(typeof client.getServerCapabilities(), 'object');
  });

  it('tools/list offers gaffer_status with an object input schema', { timeout: TEST_TIMEOUT }, () => {
    const tool = toolNamed('gaffer_status');
    assert.ok(tool, `tools: ${JSON.stringify(tools.map((t) => t.name))}`);
    assert.equal(tool.inputSchema?.type, 'object');
    assert.equal(typeof tool.inputSchema.properties, 'object');
    assert.ok('after_seq' in tool.inputSchema.properties, 'schema lists after_seq');
    assert.ok('timeout_ms' in tool.inputSchema.properties, 'schema lists timeout_ms');
    assert.equal(typeof tool.description, 'string');
  });

  it('gaffer_status returns structured status for the mcp profile', { timeout: TEST_TIMEOUT }, async () => {
    const result = await client.callTool({ name: 'gaffer_status', arguments: {} });
    assert.equal(result.isError, false, `result: ${JSON.stringify(result)}`);
    const status = result.structuredContent;
    assert.equal(status.profile, 'mcp');
    assert.equal(status.role, 'agent');
    assert.equal(status.workspace, workspace);
    assert.equal(status.pid, transport.pid);
    assert.equal(status.version, client.getServerVersion().version);
    assert.ok(status.store.dir.startsWith(workspace), `store dir ${status.store.dir}`);
    assert.equal(typeof status.store.exists, 'boolean');
    assert.ok(Number.isInteger(status.store.seq) && status.store.seq >= 0, 'seq is a u64');
    assert.ok(Array.isArray(status.peers), 'peers is an array');
    // The text block carries the same result for clients that ignore structured content.
    assert.equal(result.content[0]?.type, 'text');
    assert.deepEqual(JSON.parse(result.content[0].text), status);
  });

  it('a mistyped gaffer_status argument is an isError result naming the field', { timeout: TEST_TIMEOUT }, async () => {
    const result = await client.callTool({
      name: 'gaffer_status',
      arguments: { after_seq: 'x' },
    });
    assert.equal(result.isError, true, `result: ${JSON.stringify(result)}`);
    assert.equal(result.content[0]?.type, 'text');
    assert.ok(result.content[0].text.length > 0, 'the error is explained in text');
    assert.equal(result.structuredContent?.error?.code, -32602);
    assert.equal(result.structuredContent.error.data?.field, 'after_seq');
  });

  it('a progress token gets notifications while gaffer_status waits', { timeout: TEST_TIMEOUT }, async () => {
    const before = await client.callTool({ name: 'gaffer_status', arguments: {} });
    const seq = before.structuredContent.store.seq;
    const reports = [];
    const result = await client.callTool(
      { name: 'gaffer_status', arguments: { after_seq: seq, timeout_ms: 300 } },
      undefined,
      { onprogress: (p) => reports.push(p) },
    );
    assert.equal(result.isError, false, `result: ${JSON.stringify(result)}`);
    assert.equal(result.structuredContent.store.seq, seq, 'nothing was written meanwhile');
    assert.ok(reports.length >= 1, 'at least one progress notification arrived');
    for (const r of reports) assert.equal(typeof r.progress, 'number');
  });

  it('select_worker_pattern picks a pattern kind when offered', { timeout: TEST_TIMEOUT }, async (t) => {
    if (!toolNamed('select_worker_pattern')) {
      t.skip('select_worker_pattern is not offered by this build');
      return;
    }
    assert.equal(toolNamed('select_worker_pattern').inputSchema?.type, 'object');
    const result = await client.callTool({
      name: 'select_worker_pattern',
      arguments: { objective: 'small docs update' },
    });
    assert.equal(result.isError, false, `result: ${JSON.stringify(result)}`);
    assert.equal(typeof result.structuredContent?.kind, 'string');
    assert.ok(result.structuredContent.kind.length > 0, 'kind is not empty');
  });

  it('close ends the session', { timeout: TEST_TIMEOUT }, async () => {
    await client.close();
    assert.equal(closed, true, `stderr:\n${stderr}`);
  });
});
