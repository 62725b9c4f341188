// The hand-written HPKE seal (src/hpke.ts) against RFC 9180's test vector A.1.1 (base mode,
// DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, AES-128-GCM; its first encryption, sequence
// number 0, is what a single-shot seal makes), and against an independent implementation,
// @hpke/core (a devDependency for this cross-check only), opening what it seals.
import assert from "node:assert/strict";
import { test } from "node:test";
import { Aes128Gcm, CipherSuite, DhkemX25519HkdfSha256, HkdfSha256 } from "@hpke/core";
import * as sdk from "../dist/node.js";

const hex = sdk.toHex;
const bytes = sdk.fromHex;

// RFC 9180, Appendix A.1.1 (mode 0, kem_id 32, kdf_id 1, aead_id 1)
const A11 = {
  info: "4f6465206f6e2061204772656369616e2055726e",
  pkEm: "37fda3567bdbd628e88668c3c8d7e97d1d1253b6d4ea6d44c150f741f1bf4431",
  skEm: "52c4a758a802cd8b936eceea314432798d5baf2d7e9235dc084ab1b9cfa2f736",
  pkRm: "3948cfe0ad1ddb695d780e59077195da6c56506b027329794ab02bca80815c4d",
  skRm: "4612c550263fc8ad58375df3f557aac531d26850903e55a9f23f21d8534e8ac8",
  enc: "37fda3567bdbd628e88668c3c8d7e97d1d1253b6d4ea6d44c150f741f1bf4431",
  pt: "4265617574792069732074727574682c20747275746820626561757479",
  aad: "436f756e742d30",
  ct: "f938558b5d72f1a23810b4be2ab4f84331acc02fc97babc53a52ae8218a355a96d8770ac83d07bea87e13c512a",
};

// PKCS #8 of an X25519 private key: this DER prefix, then the 32 raw bytes (RFC 8410)
const PKCS8_X25519 = bytes("302e020100300506032b656e04220420");
const X = { name: "X25519" };

/** The vector's ephemeral key pair, as WebCrypto keys. */
async function vectorEphemeral() {
  const privateKey = await crypto.subtle.importKey("pkcs8", new Uint8Array([...PKCS8_X25519, ...bytes(A11.skEm)]), X, true, ["deriveBits"]);
  const publicKey = await crypto.subtle.importKey("raw", bytes(A11.pkEm), X, true, []);
  return { privateKey, publicKey };
}

const suite = new CipherSuite({ kem: new DhkemX25519HkdfSha256(), kdf: new HkdfSha256(), aead: new Aes128Gcm() });

test("RFC 9180 A.1.1: the seal with the vector's ephemeral key is the vector's enc ‖ ct", async () => {
  const sealed = await sdk.hpkeSeal(bytes(A11.pkRm), bytes(A11.info), bytes(A11.aad), bytes(A11.pt), vectorEphemeral);
  assert.equal(hex(sealed), A11.enc + A11.ct);
});

test("RFC 9180 A.1.1: a seal with a fresh ephemeral key opens with the vector's skRm in @hpke/core, under the same info and aad only", async () => {
  const sk = await suite.kem.importKey("raw", bytes(A11.skRm).buffer, false);
  const open = (sealed, info, aad) => suite.open({ recipientKey: sk, enc: sealed.slice(0, 32).buffer, info }, sealed.slice(32), aad);
  const a = await sdk.hpkeSeal(bytes(A11.pkRm), bytes(A11.info), bytes(A11.aad), bytes(A11.pt));
  const b = await sdk.hpkeSeal(bytes(A11.pkRm), bytes(A11.info), bytes(A11.aad), bytes(A11.pt));
  assert.notEqual(hex(a.slice(0, 32)), hex(b.slice(0, 32)), "a fresh ephemeral key each seal");
  assert.equal(a.length, 32 + A11.pt.length / 2 + 16);
  assert.equal(hex(new Uint8Array(await open(a, bytes(A11.info), bytes(A11.aad)))), A11.pt);
  await assert.rejects(open(a, bytes(A11.info + "00"), bytes(A11.aad)));
  await assert.rejects(open(a, bytes(A11.info), new Uint8Array(0)));
});

test("seals of 0 to 299 bytes (every 13th length), with and without info, open in @hpke/core", async () => {
  const kp = await suite.kem.generateKeyPair();
  const pk = new Uint8Array(await suite.kem.serializePublicKey(kp.publicKey));
  for (let n = 0; n <= 300; n += 13) {
    const pt = crypto.getRandomValues(new Uint8Array(n));
    const info = n % 2 ? new Uint8Array(0) : bytes(A11.info);
    const sealed = await sdk.hpkeSeal(pk, info, new Uint8Array(0), pt);
    const got = await suite.open({ recipientKey: kp.privateKey, enc: sealed.slice(0, 32).buffer, info }, sealed.slice(32));
    assert.equal(hex(new Uint8Array(got)), hex(pt), `${n} bytes`);
  }
});

test("a public key that is not 32 bytes is refused (the promise rejects)", async () => {
  await assert.rejects(sdk.hpkeSeal(new Uint8Array(31), new Uint8Array(0), new Uint8Array(0), new Uint8Array(1)));
});

// RFC 9180 §7.1.4: X25519 must refuse an all-zero shared secret. A low-order public key
// (here 0 and 1, both of order dividing 8) makes one for every ephemeral key; the
// platform's X25519 (WebCrypto: "if secret is the all-zero value, throw") refuses it, so
// such a key served as the aggregator's seals nothing, rather than sealing readably.
test("a low-order public key is refused: no seal under an all-zero shared secret", async () => {
  for (const first of [0, 1]) {
    const pk = new Uint8Array(32);
    pk[0] = first;
    await assert.rejects(sdk.hpkeSeal(pk, new Uint8Array(0), new Uint8Array(0), new Uint8Array(1)));
  }
});
