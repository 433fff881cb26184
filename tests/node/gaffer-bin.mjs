// Shared setup for the end-to-end suites: where the gaffer binary is and a throwaway workspace.
import { existsSync, mkdtempSync, realpathSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

/**
 * The binary under test: `$GAFFER_BIN` when set, else the debug build of this repository.
 * Throws a message that says how to get one, so a missing build is not mistaken for a bug.
 */
export function gafferBin() {
  const fromEnv = process.env.GAFFER_BIN;
  const bin = fromEnv && fromEnv.length > 0
    ? fromEnv
    : fileURLToPath(new URL('../../target/debug/gaffer', import.meta.url));
  if (!existsSync(bin)) {
    throw new Error(
      `gaffer binary not found at ${bin}; build it with \`cargo build\` in the repository root ` +
        'or point GAFFER_BIN at an existing binary',
    );
  }
  return bin;
}

/** A fresh empty workspace directory (symlinks resolved, as the server reports real paths). */
export function makeWorkspace(label) {
  return realpathSync(mkdtempSync(join(tmpdir(), `gaffer-node-${label}-`)));
}

export function removeWorkspace(dir) {
  if (dir) rmSync(dir, { recursive: true, force: true });
}
