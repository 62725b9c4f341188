// The default randomness is the platform CSPRNG, the PRR is memoised, and bad params
// are refused with a message naming the value.
import assert from "node:assert/strict";
import { test } from "node:test";
import * as sdk from "../dist/node.js";

test("encoders draw from crypto.getRandomValues by default", () => {
  const real = crypto.getRandomValues.bind(crypto);
  let calls = 0;
  crypto.getRandomValues = (a) => {
    calls++;
    return real(a);
  };
  try {
    const secret = new Uint8Array(32).fill(1);
    new sdk.RapporEncoder(new sdk.RapporParams({ k: 16, h: 2, m: 4, f: 0.5, p: 0.5, q: 0.75 }), "m", secret).encode("x");
    const after = calls;
    assert.ok(after >= 2, "IRR and report id");
    new sdk.BasicEncoder(new sdk.BasicParams({ mechanism: "oue", epsilon: 1, domainSize: 5 }), "m").encode(2);
    new sdk.HistogramEncoder(new sdk.HistogramParams({ domainSize: 5, fakeSlots: 2, fakeProbability: 0.5 }), "m").encode(1);
    assert.ok(calls > after);
    const before = calls;
    new sdk.RoundEncoder(new sdk.PrefixRound(new sdk.SymbolMap("ab", 3), 0, 2, 1, 4), "m", 1n).encode("ab");
    assert.ok(calls >= before + 3, "seed, keep coin and report id");
  } finally {
    crypto.getRandomValues = real;
  }
});

test("the PRR is a function of (secret, metric, Bloom) only", () => {
  const params = new sdk.RapporParams({ k: 64, h: 2, m: 4, f: 0.5, p: 0.5, q: 0.75 });
  const secret = crypto.getRandomValues(new Uint8Array(32));
  const a = new sdk.RapporEncoder(params, "m", secret, { cohort: 1 });
  const b = new sdk.RapporEncoder(params, "m", secret, { cohort: 1 });
  const bloom = a.bloom("v");
  assert.deepEqual(a.permanentResponse(bloom), b.permanentResponse(bloom));
  const other = new sdk.RapporEncoder(params, "n", secret, { cohort: 1 });
  assert.notDeepEqual(a.permanentResponse(bloom), other.permanentResponse(bloom));
});

test("report ids are 16 fresh bytes, never all zero", () => {
  const enc = new sdk.BasicEncoder(new sdk.BasicParams({ mechanism: "krr", epsilon: 1, domainSize: 3 }), "m");
  const ids = new Set(Array.from({ length: 100 }, () => sdk.toHex(enc.encode(0).reportId)));
  assert.equal(ids.size, 100);
  let first = true;
  const zeroFirst = (n) => {
    const out = first ? new Uint8Array(n) : new Uint8Array(n).fill(9);
    first = false;
    return out;
  };
  const e2 = new sdk.BasicEncoder(new sdk.BasicParams({ mechanism: "krr", epsilon: 1, domainSize: 3 }), "m", { randomBytes: zeroFirst });
  assert.notEqual(sdk.toHex(e2.encode(0).reportId), "00".repeat(16));
});

test("invalid params name the bad value", () => {
  assert.throws(() => new sdk.RapporParams({ k: 16, h: 2, m: 4, f: 1, p: 0.5, q: 0.75 }), /f must be below 1/);
  assert.throws(() => new sdk.RapporParams({ k: 16, h: 2, m: 4, f: 0.5, p: 0.8, q: 0.75 }), /p must be below q/);
  assert.throws(() => new sdk.BasicParams({ mechanism: "nope", epsilon: 1, domainSize: 3 }), /mechanism must be one of/);
  assert.throws(() => new sdk.HistogramParams({ domainSize: 1, fakeSlots: 0, fakeProbability: 0 }), /domain_size/);
  assert.throws(() => new sdk.RapporEncoder(new sdk.RapporParams({ k: 16, h: 2, m: 4, f: 0.5, p: 0.5, q: 0.75 }), "m", new Uint8Array(8)), /at least 16 bytes/);
});
