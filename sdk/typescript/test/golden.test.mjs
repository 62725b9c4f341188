// The golden vectors (tests/golden/vectors.json, written by the Python SDK): this SDK
// must compute the same Bloom bits, PRR bits, cohorts, fingerprints, privacy figures,
// HPKE info and plaintext; a report Python sealed must open here under the same info (in
// @hpke/core, an implementation independent of the SDK's); and the reports sealed here
// are written for the Python suite to open.
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

const SEALS_PER_CASE = 20; // each with its own ephemeral key

test("sealed here, for the Python aggregator to open (tests/golden/sealed_by_typescript.json)", { skip: !S }, async () => {
  const sk = await suite.kem.importKey("raw", bytes(S.private_key).buffer, false);
  const key = { keyId: S.key_id, suite: S.suite, publicKey: bytes(S.public_key), notBefore: 0, notAfter: null };
  const cases = [];
  for (const c of S.cases) {
    const report = { metric: c.metric, cohort: c.cohort, bits: bytes(c.bits), fingerprint: BigInt(c.fingerprint), reportId: bytes(c.report_id) };
    for (let i = 0; i < SEALS_PER_CASE; i++) {
      const sealed = await sdk.sealReport(key, c.window, report);
      assert.equal(sealed.length, 32 + c.plaintext.length / 2 + 16);
      const pt = await suite.open({ recipientKey: sk, enc: sealed.slice(0, 32).buffer, info: bytes(c.info) }, sealed.slice(32));
      assert.equal(hex(new Uint8Array(pt)), c.plaintext);
      cases.push({ metric: c.metric, window: c.window, plaintext: c.plaintext, sealed: hex(sealed) });
    }
  }
  if (process.env.CROWDMIX_WRITE_GOLDEN) writeFileSync(new URL("sealed_by_typescript.json", GOLDEN), `${JSON.stringify({ key_id: S.key_id, cases }, null, 1)}\n`);
});

test("the prebuilt RAPPOR bundle (minified) computes the same bits and seals what @hpke/core opens", { skip: !S }, async () => {
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

const H = V.heavy_hitters;
const wireParams = (p) => ({ ...p, maxLength: p.max_length });
// the round file's form of a round (`crowdmix.core.rounds.ServedRound.to_dict`) as GetConfig serves it
const wireRound = (r) => ({ start: 0, stop: 0, seeds: 0, buckets: 0, candidates: [], ...r });

test("heavy hitters: metric fingerprints (Python's str repr too), symbols, report length", () => {
  assert.ok(H.metrics.length >= 4);
  for (const c of H.metrics) {
    const p = new sdk.HeavyHittersParams(wireParams(c.params));
    assert.equal(p.fingerprint().toString(), c.fingerprint, JSON.stringify(c.params));
    assert.equal(p.reportBytes, c.report_bytes);
    for (const [v, s] of Object.entries(c.symbols)) assert.equal(hex(p.symbols.symbols(v)), s, `${JSON.stringify(v)} over ${JSON.stringify(c.params.alphabet)}`);
  }
});

test("heavy hitters: a device's round of a discovery, from its secret, as the Python SDK", async () => {
  assert.ok(H.devices.length >= 40);
  for (const d of H.devices)
    assert.equal(await sdk.deviceRound(bytes(d.secret), d.metric, BigInt(d.fingerprint), d.opened, d.weights), d.round, JSON.stringify(d));
});

test("heavy hitters: each round's params, prefix keys and buckets, and the index a byte stream gives", () => {
  let prefix = 0;
  let value = 0;
  for (const c of H.rounds) {
    const metric = new sdk.HeavyHittersParams(wireParams(H.metrics[c.metric].params));
    const params = sdk.roundParams(metric, wireRound(c.served));
    assert.equal(params.cells, c.cells);
    assert.equal(params.keepProbability, c.keep_probability, JSON.stringify(c.served));
    assert.equal(sdk.roundFingerprint(metric.fingerprint(), wireRound(c.served)).toString(), c.round_fingerprint, JSON.stringify(c.served));
    if (params instanceof sdk.PrefixRound) {
      prefix++;
      assert.equal(params.buckets, c.buckets);
    } else value++;
    for (const row of c.values) {
      const stream = bytes(row.stream);
      let used = 0;
      const rand = (n) => {
        assert.ok(used + n <= stream.length, "the byte stream ran out");
        used += n;
        return stream.slice(used - n, used);
      };
      const enc = new sdk.RoundEncoder(params, "m", 1n, { randomBytes: rand });
      const what = `${JSON.stringify(row.value)} in ${JSON.stringify(c.served)}`;
      assert.equal(enc.index(row.value), row.index, what);
      assert.equal(used, row.used, `bytes drawn: ${what}`);
      if (params instanceof sdk.PrefixRound) {
        const [pre, hi, lo] = params.split(params.symbols.symbols(row.value));
        assert.deepEqual([hi, lo], [row.hi, row.lo], what);
        const key = sdk.prefixKey(params.start, params.stop, hi, pre);
        assert.equal(key.toString(), row.key, what);
        row.bucket_by_seed.forEach((b, s) => assert.equal(sdk.prefixBucket(s, key, lo, params.buckets), b, what));
      }
    }
  }
  assert.ok(prefix >= 8 && value >= 4);
});

test("heavy hitters: keep probabilities and the integer bound on e^ε below them, bit for bit", () => {
  assert.ok(H.keep.length >= 50);
  for (const c of H.keep) {
    assert.equal(sdk.expLower(c.epsilon).toString(), c.exp_lower, JSON.stringify(c));
    assert.equal(sdk.keepProbabilityOf(c.epsilon, c.n), c.keep, JSON.stringify(c));
  }
});

/** 3·x < 1 exactly, for a float x in (0, 1): x = m·2^-s with m the 53-bit significand. */
function thirdsBelowOne(x) {
  const v = new DataView(new ArrayBuffer(8));
  v.setFloat64(0, x);
  const raw = v.getBigUint64(0);
  const s = 1075n - (raw >> 52n);
  return 3n * ((raw & ((1n << 52n) - 1n)) | (1n << 52n)) < 1n << s;
}

test("heavy hitters: a round's ε is at least 2^-48, where its keep stays at least 1/n; ε and n checked as in Python", () => {
  const sm = new sdk.SymbolMap("ab", 2);
  // below it the keep of n = 3 is the float under 1/3: the other values outweigh the true one
  for (const tiny of [5e-324, 1e-300, 1e-17]) {
    assert.ok(thirdsBelowOne(sdk.keepProbabilityOf(tiny, 3)));
    assert.throws(() => new sdk.ValueRound(sm, tiny, ["a", "b"]), sdk.ParamsError);
    assert.throws(() => new sdk.PrefixRound(sm, 0, 2, tiny, 1, 3), sdk.ParamsError);
  }
  assert.ok(!thirdsBelowOne(new sdk.ValueRound(sm, 2 ** -48, ["a", "b"]).keepProbability));
  // the sign is not dropped, and neither 0, NaN nor ∞ runs the series (∞ never ended)
  for (const bad of [-1, 0, -0, NaN, Infinity, 20.000000000000004]) {
    assert.throws(() => sdk.expLower(bad), sdk.ParamsError, String(bad));
    assert.throws(() => sdk.keepProbabilityOf(bad, 3), sdk.ParamsError, String(bad));
  }
  for (const n of [1, 0, 2.5]) assert.throws(() => sdk.keepProbabilityOf(1, n), sdk.ParamsError, String(n));
});

test("heavy hitters: a GetConfig answer the shuffler serves reads here, rounds and all", () => {
  const c = sdk.parseConfig(bytes(H.config.answer)).metrics.get("words");
  assert.equal(c.fingerprint.toString(), H.config.fingerprint);
  assert.equal(c.reportBytes, 4);
  assert.deepEqual(
    c.rounds.map((r) => ({ round: r.round, window: r.window, opened: r.opened, epsilon: r.epsilon })),
    H.config.rounds.map(({ round, window, opened, epsilon }) => ({ round, window, opened, epsilon })),
  );
  assert.deepEqual(c.rounds.map((r) => [r.params.start, r.params.stop, r.params.seeds]), H.config.rounds.map((r) => [r.start, r.stop, r.seeds]));
  // each served round's fingerprint, which its reports carry
  assert.deepEqual(c.rounds.map((r) => r.fingerprint.toString()), H.config.round_fingerprints);
  // served without buckets: the prime above e^ε + 1, as Python's (H.rounds[0]: the same round)
  assert.deepEqual(c.rounds.map((r) => r.params.buckets), [H.rounds[0].buckets, H.rounds[0].buckets]);
  // a build without heavy hitters keeps the metric bare: its reporter says unknown_metric
  assert.equal(sdk.readConfig(bytes(H.config.answer), [sdk.rapporEncoding]).metrics.get("words").heavyHitters, undefined);
});
