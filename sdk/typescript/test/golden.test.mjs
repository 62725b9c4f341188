// The golden vectors (tests/golden/vectors.json, written by the Python SDK): this SDK
// must compute the same Bloom bits, PRR bits, cohorts, fingerprints, privacy figures,
// HPKE info and plaintext; a report Python sealed must open here under the same info;
// and the reports sealed here are written for the Python suite to open.
import assert from "node:assert/strict";
import { readFileSync, writeFileSync } from "node:fs";
import { test } from "node:test";
import { Aes128Gcm, CipherSuite, DhkemX25519HkdfSha256, HkdfSha256 } from "@hpke/core";
import * as sdk from "../dist/node.js";

const GOLDEN = new URL("../../../tests/golden/", import.meta.url);
const V = JSON.parse(readFileSync(new URL("vectors.json", GOLDEN), "utf8"));
const hex = sdk.toHex;
const bytes = sdk.fromHex;
const value = (v) => (typeof v === "string" ? v : bytes(v.hex));

test("RAPPOR: Bloom bits, PRR bits, cohort and fingerprint as the Python SDK", () => {
  assert.ok(V.rappor.length >= 50);
  for (const c of V.rappor) {
    const params = new sdk.RapporParams(c.params);
    const secret = bytes(c.secret);
    const enc = new sdk.RapporEncoder(params, c.metric, secret, { cohort: c.cohort });
    const bloom = enc.bloom(value(c.value));
    const what = `${JSON.stringify(c.params)} ${JSON.stringify(c.value)}`;
    assert.equal(hex(bloom), c.bloom, `bloom ${what}`);
    assert.equal(hex(enc.permanentResponse(bloom)), c.prr, `prr ${what}`);
    assert.equal(sdk.cohortForSecret(secret, params.m), c.cohort_for_secret, `cohort ${what}`);
    assert.equal(params.fingerprint().toString(), c.fingerprint, `fingerprint ${what}`);
    const close = (a, b) => a === b || Math.abs(a - b) <= 1e-12 * Math.abs(b);
    assert.ok(close(sdk.epsilonOne(params), c.epsilon_one ?? Infinity), `ε_1 ${what}: ${sdk.epsilonOne(params)} vs ${c.epsilon_one}`);
    assert.ok(close(sdk.epsilonInf(params), c.epsilon_inf ?? Infinity), `ε_∞ ${what}`);
  }
});

test("basic and histogram params: fingerprints and payload lengths", () => {
  for (const c of V.basic) {
    const p = new sdk.BasicParams({ mechanism: c.mechanism, epsilon: c.epsilon, domainSize: c.domain_size });
    assert.equal(p.fingerprint().toString(), c.fingerprint, c.mechanism);
    assert.equal(p.reportBytes, c.report_bytes, c.mechanism);
    assert.ok(Math.abs(p.keepProbability - c.keep_probability) <= 1e-15, c.mechanism);
  }
  for (const c of V.histogram) {
    const p = new sdk.HistogramParams({
      domainSize: c.domain_size,
      fakeSlots: c.fake_slots,
      fakeProbability: c.fake_probability,
      localEpsilon: c.local_epsilon,
    });
    assert.equal(p.fingerprint().toString(), c.fingerprint);
    assert.equal(p.reportBytes, c.report_bytes);
  }
});

test("Python's float repr, which the fingerprints embed", () => {
  for (const [x, r] of V.float_repr) assert.equal(sdk.pyFloatRepr(x), r, String(x));
});

const S = V.sealed;
const suite = new CipherSuite({ kem: new DhkemX25519HkdfSha256(), kdf: new HkdfSha256(), aead: new Aes128Gcm() });

test("sealed reports: info and plaintext as Python; Python's seal opens here", { skip: !S }, async () => {
  const sk = await suite.kem.importKey("raw", bytes(S.private_key).buffer, false);
  for (const c of S.cases) {
    const report = { metric: c.metric, cohort: c.cohort, bits: bytes(c.bits), fingerprint: BigInt(c.fingerprint), reportId: bytes(c.report_id) };
    assert.equal(hex(sdk.reportInfo(c.metric, S.key_id, c.window)), c.info);
    assert.equal(hex(sdk.packPlaintext(report)), c.plaintext);
    const sealed = bytes(c.sealed_by_python);
    const pt = await suite.open({ recipientKey: sk, enc: sealed.slice(0, 32).buffer, info: bytes(c.info) }, sealed.slice(32));
    assert.equal(hex(new Uint8Array(pt)), c.plaintext);
  }
});

test("sealed here, for the Python aggregator to open (tests/golden/sealed_by_typescript.json)", { skip: !S }, async () => {
  const key = { keyId: S.key_id, suite: S.suite, publicKey: bytes(S.public_key), notBefore: 0, notAfter: null };
  const cases = [];
  for (const c of S.cases) {
    const report = { metric: c.metric, cohort: c.cohort, bits: bytes(c.bits), fingerprint: BigInt(c.fingerprint), reportId: bytes(c.report_id) };
    const sealed = await sdk.sealReport(key, c.window, report);
    assert.equal(sealed.length, 32 + c.plaintext.length / 2 + 16);
    cases.push({ metric: c.metric, window: c.window, plaintext: c.plaintext, sealed: hex(sealed) });
  }
  if (process.env.CROWDMIX_WRITE_GOLDEN) writeFileSync(new URL("sealed_by_typescript.json", GOLDEN), `${JSON.stringify({ key_id: S.key_id, cases }, null, 1)}\n`);
});

test("the prebuilt RAPPOR bundle (minified, @hpke rewritten) computes the same bits and seals what @hpke/core opens", { skip: !S }, async () => {
  const b = await import("../dist/crowdmix.rappor.browser.js");
  for (const c of V.rappor) {
    const params = new b.RapporParams(c.params);
    const enc = new b.RapporEncoder(params, c.metric, bytes(c.secret), { cohort: c.cohort });
    const bloom = enc.bloom(value(c.value));
    assert.equal(hex(bloom), c.bloom);
    assert.equal(hex(enc.permanentResponse(bloom)), c.prr);
    assert.equal(b.cohortForSecret(bytes(c.secret), params.m), c.cohort_for_secret);
    assert.equal(params.fingerprint().toString(), c.fingerprint);
  }
  const sk = await suite.kem.importKey("raw", bytes(S.private_key).buffer, false);
  const key = { keyId: S.key_id, suite: S.suite, publicKey: bytes(S.public_key), notBefore: 0, notAfter: null };
  for (const c of S.cases) {
    const report = { metric: c.metric, cohort: c.cohort, bits: bytes(c.bits), fingerprint: BigInt(c.fingerprint), reportId: bytes(c.report_id) };
    const sealed = await b.sealReport(key, c.window, report);
    const pt = await suite.open({ recipientKey: sk, enc: sealed.slice(0, 32).buffer, info: bytes(c.info) }, sealed.slice(32));
    assert.equal(hex(new Uint8Array(pt)), c.plaintext);
  }
});
