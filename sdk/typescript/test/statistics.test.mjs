// Seeded statistical tests of the randomized responses. Each statistic is χ² with df
// degrees of freedom under the null; its threshold is the 1 - 1e-7 quantile
// (scipy.stats.chi2.isf(1e-7, df)), so over random seeds each check fails falsely with
// probability 1e-7 and this file's nine with at most 9e-7 (≤ 1e-6). Seeded: no flakes.
// The RAPPOR checks compare the per-bit frequencies with p* and q*, and with the Python
// SDK's own (tests/golden/vectors.json "frequencies": seeded Python clients, same setup).
import assert from "node:assert/strict";
import { test } from "node:test";
import * as sdk from "../dist/node.js";
import { readFileSync } from "node:fs";
import { bitCounts, chiSquare, seededBytes } from "./seeded.mjs";

const PYTHON = JSON.parse(readFileSync(new URL("../../../tests/golden/vectors.json", import.meta.url), "utf8")).frequencies;

const Q = { 1: 28.373987361779154, 2: 32.236191301916634, 6: 43.337757113294245, 13: 58.432423188319135, 16: 64.22741251580294, 17: 66.10240351392044, 19: 69.78153305257183 };

for (const [name, pd] of [
  ["dyadic", { k: 16, h: 2, m: 8, f: 0.5, p: 0.5, q: 0.75 }],
  ["long expansions", { k: 13, h: 3, m: 8, f: 0.3, p: 0.1, q: 0.7 }],
]) {
  test(`RAPPOR (${name}): per-bit frequencies over clients are p* and q*`, () => {
    // one value, one cohort, N clients (secrets): bit i reads 1 w.p. q* if Bloom bit i is
    // 1, p* if 0 (PRR and IRR together), independently across clients and bits
    const params = new sdk.RapporParams(pd);
    const rand = seededBytes(`rappor ${name}`);
    const N = 6000;
    const reports = [];
    let bloom;
    for (let c = 0; c < N; c++) {
      const enc = new sdk.RapporEncoder(params, "m", rand(32), { cohort: 3, randomBytes: rand });
      bloom ??= enc.bloom("example.com");
      reports.push(enc.encode("example.com").bits);
    }
    const { f, p, q } = params;
    const ps = (f * (p + q)) / 2 + (1 - f) * p;
    const qs = (f * (p + q)) / 2 + (1 - f) * q;
    const pi = Array.from({ length: params.k }, (_, i) => ((bloom[i >> 3] >> (i & 7)) & 1 ? qs : ps));
    const counts = bitCounts(reports, params.k);
    const x2 = chiSquare(counts, N, pi);
    assert.ok(x2 < Q[params.k], `χ² = ${x2} (df ${params.k})`);
    // two samples, one law: per bit (a - b)² / (2N p̂(1 - p̂)) with p̂ pooled, summed: χ²(k)
    const py = PYTHON.find((c) => JSON.stringify(c.params) === JSON.stringify(pd));
    assert.ok(py && py.clients === N && py.value === "example.com" && py.cohort === 3);
    let two = 0;
    for (let i = 0; i < params.k; i++) {
      const pooled = (counts[i] + py.ones[i]) / (2 * N);
      two += (counts[i] - py.ones[i]) ** 2 / (2 * N * pooled * (1 - pooled));
    }
    assert.ok(two < Q[params.k], `two-sample χ² against the Python SDK = ${two} (df ${params.k})`);
  });
}

test("IRR over one memoised PRR: bit i reads 1 w.p. q where the PRR is 1, p where 0", () => {
  const params = new sdk.RapporParams({ k: 16, h: 2, m: 8, f: 0.5, p: 0.25, q: 0.75 });
  const rand = seededBytes("irr");
  const enc = new sdk.RapporEncoder(params, "m", rand(32), { cohort: 1, randomBytes: rand });
  const prr = enc.permanentResponse(enc.bloom("v"));
  const N = 10000;
  const reports = Array.from({ length: N }, () => enc.encode("v").bits);
  for (const r of reports.slice(0, 5)) assert.ok(r.length === 2);
  const pi = Array.from({ length: 16 }, (_, i) => ((prr[i >> 3] >> (i & 7)) & 1 ? params.q : params.p));
  const x2 = chiSquare(bitCounts(reports, 16), N, pi);
  assert.ok(x2 < Q[16], `χ² = ${x2}`);
  // and the PRR is memoised: a second encoder with the same secret gives the same one
});

test("k-RR: the true index w.p. e^ε/(e^ε+d-1), each other uniformly", () => {
  const d = 17;
  const params = new sdk.BasicParams({ mechanism: "krr", epsilon: 1.5, domainSize: d });
  const enc = new sdk.BasicEncoder(params, "m", { randomBytes: seededBytes("krr") });
  const N = 30000;
  const counts = new Array(d).fill(0);
  for (let i = 0; i < N; i++) counts[enc.encode(4).bits[0]]++;
  const keep = params.keepProbability;
  const pi = counts.map((_, i) => (i === 4 ? keep : (1 - keep) / (d - 1)));
  // multinomial χ² (Pearson): df = d - 1
  const x2 = counts.reduce((s, c, i) => s + (c - N * pi[i]) ** 2 / (N * pi[i]), 0);
  assert.ok(x2 < Q[16], `χ² = ${x2}`);
});

test("shuffled histogram: 1 + Binomial(m, q) reports, fakes uniform", () => {
  const params = new sdk.HistogramParams({ domainSize: 2, fakeSlots: 2, fakeProbability: 0.5, localEpsilon: null });
  const enc = new sdk.HistogramEncoder(params, "m", { randomBytes: seededBytes("hist") });
  const N = 20000;
  const sizes = [0, 0, 0];
  let zeros = 0;
  let fakes = 0;
  for (let i = 0; i < N; i++) {
    const idx = enc.indexes(1);
    sizes[idx.length - 1]++;
    fakes += idx.length - 1;
    zeros += idx.filter((x) => x === 0).length; // every 0 is a fake (the value is 1)
  }
  const pi = [0.25, 0.5, 0.25];
  const x2 = sizes.reduce((s, c, i) => s + (c - N * pi[i]) ** 2 / (N * pi[i]), 0);
  assert.ok(x2 < Q[2], `χ² sizes = ${x2}`);
  const z = (zeros - fakes / 2) ** 2 / (fakes / 4); // fakes uniform on {0, 1}: χ²(1)
  assert.ok(z < Q[1], `χ² fakes = ${z}`);
});

// Pearson's χ² of index counts over N reports against probabilities pi: df = pi.length - 1
const pearson = (counts, N, pi) => counts.reduce((s, c, i) => s + (c - N * pi[i]) ** 2 / (N * pi[i]), 0);

test("heavy hitters, prefix round: seed uniform, y = the seed's bucket w.p. e^ε/(e^ε+g-1), else uniform", () => {
  // 4 seeds x g = 5 buckets (ε = 1.5: g = next_prime(round(e^ε) + 1) = 5): 20 indexes, df 19
  const sm = new sdk.SymbolMap("abcehlnpry", 6);
  const round = new sdk.PrefixRound(sm, 3, 7, 1.5, 4);
  assert.equal(round.cells, 20);
  const enc = new sdk.RoundEncoder(round, "m", 1n, { randomBytes: seededBytes("heavy prefix") });
  const N = 40000;
  const counts = new Array(20).fill(0);
  for (let i = 0; i < N; i++) counts[new DataView(enc.encode("banana").bits.buffer).getUint32(0, true)]++;
  const [prefix, hi, lo] = round.split(sm.symbols("banana"));
  const key = sdk.prefixKey(3, 7, hi, prefix);
  const keep = round.keepProbability;
  const pi = counts.map((_, i) => {
    const [s, y] = [Math.floor(i / 5), i % 5];
    return (y === sdk.prefixBucket(s, key, lo, 5) ? keep : (1 - keep) / 4) / 4;
  });
  const x2 = pearson(counts, N, pi);
  assert.ok(x2 < Q[19], `χ² = ${x2} (df 19)`);
});

test("heavy hitters, value round: the candidate w.p. e^ε/(e^ε+C), each other index (and none) uniformly", () => {
  const sm = new sdk.SymbolMap("abcehlnpry", 6);
  const round = new sdk.ValueRound(sm, 2.0, ["apple", "banana", "cherry", "pear", "rye", "ale"]);
  const enc = new sdk.RoundEncoder(round, "m", 1n, { randomBytes: seededBytes("heavy value") });
  const N = 30000;
  const counts = new Array(7).fill(0);
  for (let i = 0; i < N; i++) counts[enc.encode("cherry").bits[0]]++;
  const keep = round.keepProbability;
  const x2 = pearson(counts, N, counts.map((_, i) => (i === 2 ? keep : (1 - keep) / 6)));
  assert.ok(x2 < Q[6], `χ² = ${x2} (df 6)`);
});
