import { test } from "node:test";
import * as assert from "node:assert/strict";
import * as crypto from "node:crypto";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { OperatorKey } from "../../src/sign";

test("signs with an Ed25519 JWK; the public half verifies; other files are refused", () => {
  const { privateKey, publicKey } = crypto.generateKeyPairSync("ed25519");
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gaffer-sign-"));
  const file = path.join(dir, "operator.key");
  fs.writeFileSync(file, JSON.stringify(privateKey.export({ format: "jwk" })), { mode: 0o600 });
  const key = OperatorKey.load(file);
  const sig = key.sign("payload ✓");
  assert.match(sig, /^[A-Za-z0-9_-]{86}$/);
  assert.ok(crypto.verify(null, Buffer.from("payload ✓", "utf8"), publicKey, Buffer.from(sig, "base64url")));
  assert.ok(!crypto.verify(null, Buffer.from("payload", "utf8"), publicKey, Buffer.from(sig, "base64url")));
  fs.writeFileSync(file, JSON.stringify(publicKey.export({ format: "jwk" })));
  assert.throws(() => OperatorKey.load(file), /not an Ed25519 private JWK/);
  fs.rmSync(dir, { recursive: true });
});
