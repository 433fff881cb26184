// Starts `gaffer --workspace DIR serve --lsp` with a vscode-jsonrpc connection to it.
import { spawn } from 'node:child_process';
import {
  StreamMessageReader,
  StreamMessageWriter,
  createMessageConnection,
} from 'vscode-jsonrpc/node.js';

import { gafferBin } from './gaffer-bin.mjs';

/** `env` defaults to this process's environment. */
export function startLspServer(workspace, env = process.env) {
  const child = spawn(gafferBin(), ['--workspace', workspace, 'serve', '--lsp'], {
    stdio: ['pipe', 'pipe', 'pipe'],
    env,
  });
  let stderr = '';
  child.stderr.setEncoding('utf8');
  child.stderr.on('data', (chunk) => {
    stderr += chunk;
  });
  const exited = new Promise((resolve) => {
    child.on('exit', (code, signal) => resolve({ code, signal }));
  });
  const conn = createMessageConnection(
    new StreamMessageReader(child.stdout),
    new StreamMessageWriter(child.stdin),
  );
  // Writes after the server has gone (e.g. racing `exit`) must not crash the test process.
  child.stdin.on('error', () => {});
  conn.listen();
  return { child, conn, exited, stderr: () => stderr };
}
