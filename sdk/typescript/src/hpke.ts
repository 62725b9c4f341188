/**
 * RFC 9180 HPKE, base mode, single-shot seal (§6.1), for the one suite a device seals to:
 * DHKEM(X25519, HKDF-SHA256) (0x0020), HKDF-SHA256 (0x0001), AES-128-GCM (0x0001); all on
 * WebCrypto (X25519, HMAC-SHA-256, AES-GCM), whose X25519 it needs (Node 20, Chrome 133).
 *
 *     dh = X25519(skE, pkR)                 shared_secret = LabeledExpand(LabeledExtract("",
 *       "eae_prk", dh), "shared_secret", enc ‖ pkR, 32)      (KEM suite "KEM" ‖ 0x0020)
 *     context = 0x00 ‖ LabeledExtract("", "psk_id_hash", "") ‖ LabeledExtract("", "info_hash", info)
 *     secret = LabeledExtract(shared_secret, "secret", "")   (suite "HPKE" ‖ 0020 0001 0001)
 *     key = LabeledExpand(secret, "key", context, 16), nonce = LabeledExpand(…, "base_nonce", …, 12)
 *     sealed = enc ‖ AES-128-GCM(key, nonce, aad, plaintext)
 *
 * Hand-written because a general HPKE library (modes, suites, contexts, exporters) was
 * 4.9 kB of a 12 KB gzipped browser bundle, this seal 1.1 kB; RFC 9180's A.1.1 vector and
 * an independent implementation check it (test/hpke.test.mjs).
 */
import { utf8 } from "./report.js";

const X25519 = { name: "X25519" };
const V1 = /* @__PURE__ */ utf8("HPKE-v1");
const KEM_SUITE = /* @__PURE__ */ Uint8Array.of(75, 69, 77, 0, 32); // "KEM" ‖ kem id
const HPKE_SUITE = /* @__PURE__ */ Uint8Array.of(72, 80, 75, 69, 0, 32, 0, 1, 0, 1); // "HPKE" ‖ kem, kdf, aead ids
const NONE = /* @__PURE__ */ new Uint8Array(0);

type Bytes = Uint8Array<ArrayBuffer>; // what WebCrypto takes (a view of no SharedArrayBuffer)

const cat = (...parts: Uint8Array[]): Bytes => {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) out.set(p, (at += p.length) - p.length);
  return out;
};

/** HMAC-SHA-256; an empty key is HKDF's default salt, 32 zero bytes (the same HMAC). */
async function hmac(key: Bytes, data: Bytes): Promise<Bytes> {
  const k = await crypto.subtle.importKey("raw", key.length ? key : new Uint8Array(32), { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  return new Uint8Array(await crypto.subtle.sign("HMAC", k, data));
}

/** LabeledExtract(salt, label, ikm) = HKDF-Extract(salt, "HPKE-v1" ‖ suite ‖ label ‖ ikm). */
const extract = (suite: Uint8Array, salt: Bytes, label: string, ikm: Uint8Array): Promise<Bytes> => hmac(salt, cat(V1, suite, utf8(label), ikm));

/** LabeledExpand(prk, label, info, L) for L ≤ 32: HKDF-Expand's first block, T(1). */
const expand = async (suite: Uint8Array, prk: Bytes, label: string, info: Uint8Array, L: number): Promise<Bytes> =>
  (await hmac(prk, cat(Uint8Array.of(0, L), V1, suite, utf8(label), info, Uint8Array.of(1)))).slice(0, L);

/** A fresh X25519 key pair from the platform's CSPRNG (HPKE's GenerateKeyPair). */
const freshPair = (): Promise<CryptoKeyPair> => crypto.subtle.generateKey(X25519, true, ["deriveBits"]) as Promise<CryptoKeyPair>;

/**
 * Seal `plaintext` to the X25519 public key `pkR` (32 raw bytes): enc (32 B) ‖ ciphertext
 * ‖ tag (16 B). `ephemeral` is for tests only (a known key pair, as in the RFC's vectors).
 */
export async function hpkeSeal(
  pkR: Uint8Array,
  info: Uint8Array,
  aad: Uint8Array,
  plaintext: Uint8Array,
  ephemeral: () => Promise<CryptoKeyPair> = freshPair,
): Promise<Uint8Array> {
  const e = await ephemeral();
  const pk = await crypto.subtle.importKey("raw", pkR as Bytes, X25519, false, []);
  const dh = new Uint8Array(await crypto.subtle.deriveBits({ name: "X25519", public: pk }, e.privateKey, 256));
  const enc = new Uint8Array(await crypto.subtle.exportKey("raw", e.publicKey));
  const shared = await expand(KEM_SUITE, await extract(KEM_SUITE, NONE, "eae_prk", dh), "shared_secret", cat(enc, pkR), 32);
  const context = cat(Uint8Array.of(0), await extract(HPKE_SUITE, NONE, "psk_id_hash", NONE), await extract(HPKE_SUITE, NONE, "info_hash", info));
  const secret = await extract(HPKE_SUITE, shared, "secret", NONE);
  const key = await crypto.subtle.importKey("raw", await expand(HPKE_SUITE, secret, "key", context, 16), "AES-GCM", false, ["encrypt"]);
  const iv = await expand(HPKE_SUITE, secret, "base_nonce", context, 12);
  return cat(enc, new Uint8Array(await crypto.subtle.encrypt({ name: "AES-GCM", iv, additionalData: aad as Bytes }, key, plaintext as Bytes)));
}
