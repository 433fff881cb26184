// Operator signing in the extension host: the private JWK is read from the key file, imported
// with node:crypto, and used to sign challenge and decision texts. The key never leaves this
// process: not into settings, not onto the wire (only signatures do).

import * as crypto from "node:crypto";
import * as fs from "node:fs";

export class OperatorKey {
  private constructor(
    private readonly key: crypto.KeyObject,
    readonly path: string,
  ) {}

  /** Loads an Ed25519 private JWK (what `gaffer operator init` writes). */
  static load(path: string): OperatorKey {
    const jwk = JSON.parse(fs.readFileSync(path, "utf8")) as crypto.JsonWebKey;
    if (jwk.kty !== "OKP" || jwk.crv !== "Ed25519" || typeof jwk.d !== "string") {
      throw new Error(`${path} is not an Ed25519 private JWK (run \`gaffer operator init\`)`);
    }
    const key = crypto.createPrivateKey({ key: jwk, format: "jwk" });
    return new OperatorKey(key, path);
  }

  /** base64url (no padding) Ed25519 signature over the UTF-8 bytes of `text`. */
  sign(text: string): string {
    return crypto.sign(null, Buffer.from(text, "utf8"), this.key).toString("base64url");
  }
}
