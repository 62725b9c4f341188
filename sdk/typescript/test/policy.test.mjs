// The delivery policy as a table of cases: decide(rows, config, now, state) and the
// classification of the shuffler's refusals. No network, no storage, no clock read.
import assert from "node:assert/strict";
import { test } from "node:test";
import * as sdk from "../dist/node.js";

const WS = 86400;
const NOW = 1_800_000_000; // device clock
const OFFSET = 100; // server is 100 s ahead
const CUR = Math.floor((NOW + OFFSET) / WS);
// the device's clocks when its wall clock reads `wall`, after the wall clock was set
// `setBy` seconds forward (the monotonic clock counts from boot, a day ago)
const at = (wall, setBy = 0) => ({ wall, mono: wall - setBy - NOW + 86400 });
const rappor = new sdk.RapporParams({ k: 16, h: 2, m: 4, f: 0.5, p: 0.5, q: 0.75 });
const hist = new sdk.HistogramParams({ domainSize: 4, fakeSlots: 1, fakeProbability: 0.5, localEpsilon: 1 });
const heavy = new sdk.HeavyHittersParams({ alphabet: "ab", maxLength: 2, spans: [3], keep: 1, candidates: 1, seeds: 1, weights: [0.5, 0.5], epsilon: 1, delta: 1e-6, devices: 2 });
const ROUND = { window: Math.floor((NOW + OFFSET) / WS), fingerprint: 77n }; // the served round's fields the policy reads
const key = { keyId: 3, suite: "x25519-hkdf-sha256-aes128gcm", publicKey: new Uint8Array(32).fill(9), notBefore: 0, notAfter: null };
const metric = (name, params, extra = {}) => ({ name, encoding: "x", fingerprint: params.fingerprint(), reportBytes: 2, disposalSeconds: 0, domain: null, ...extra });
const config = (o = {}) => ({
  config: {
    version: "v",
    cacheSeconds: 3600,
    windowSeconds: WS,
    windowTolerance: o.tolerance ?? 1,
    serverTime: NOW + OFFSET,
    metrics: new Map([
      ["m", metric("m", rappor, { rappor })],
      ["h", metric("h", hist, { histogram: hist, sealedOnly: "a shuffled histogram" })],
      ["b", metric("b", rappor)], // of an encoding this build leaves out: no params
      ["w", metric("w", heavy, { heavyHitters: heavy, rounds: o.rounds ?? [] })],
    ]),
    keys: o.keys ?? [key],
  },
  serverTime: (o.fetchedAt ?? NOW - 10) + OFFSET,
  at: at(o.fetchedAt ?? NOW - 10),
  age: 0,
});
const row = (o = {}) => ({ id: o.id ?? "01", metric: o.metric ?? "m", window: o.window ?? CUR, windowSeconds: o.windowSeconds ?? WS, cohort: 0, bits: "0000", fp: String(o.fp ?? (o.metric === "h" ? hist : rappor).fingerprint()) });
const state = (o = {}) => ({ sealing: "required", ceiling: () => null, refetched: false, fetchFailure: null, answer: null, ...o });
const kind = (d) => (d.kind === "drop" ? `drop:${d.reason}` : d.kind);

const CASES = [
  ["no config: fetch one", [row()], null, state(), "refetch"],
  ["no config after a fetch: offline", [row()], null, state({ refetched: true, fetchFailure: "x" }), "offline"],
  ["nothing waits", [], config(), state(), "wait"],
  ["expired config: fetch", [row()], config({ fetchedAt: NOW - 3600 }), state(), "refetch"],
  ["expired config, fetch failed: send with it", [row()], config({ fetchedAt: NOW - 3600 }), state({ refetched: true }), "send"],
  ["current window", [row()], config(), state(), "send"],
  ["previous window: within tolerance", [row({ window: CUR - 1 })], config(), state(), "send"],
  ["two windows back: closed", [row({ window: CUR - 2 })], config(), state(), "drop:window_closed"],
  ["a tolerance of two served: two windows back still sent", [row({ window: CUR - 2 })], config({ tolerance: 2 }), state(), "send"],
  ["a tolerance of zero served: the window before is closed", [row({ window: CUR - 1 })], config({ tolerance: 0 }), state(), "drop:window_closed"],
  ["two windows ahead of a server time learnt here (a clock set forward): withdrawn", [row({ window: CUR + 2 })], config(), state(), "drop:window_ahead"],
  ["one window ahead: the shuffler decides", [row({ window: CUR + 1 })], config(), state(), "send"],
  ["thirty windows ahead on a restored config's wall clock: the shuffler decides", [row({ window: CUR + 30 })], { ...config(), age: 10 }, state(), "send"],
  ["window of another length", [row({ windowSeconds: 3600 })], config(), state(), "drop:window_changed"],
  ["params not served: fetch", [row({ fp: 5 })], config(), state(), "refetch"],
  ["params not served after a fetch", [row({ fp: 5 })], config(), state({ refetched: true }), "drop:params_changed"],
  ["unknown metric after a fetch", [row({ metric: "gone", fp: 5 })], config(), state({ refetched: true }), "drop:params_changed"],
  ["histogram never clear", [row({ metric: "h" })], config(), state({ sealing: "off" }), "drop:refused"],
  ["heavy hitters: clear with sealing off", [row({ metric: "w", fp: heavy.fingerprint() })], config({ keys: [] }), state({ sealing: "off" }), "send"],
  // a heavy-hitters report names its round: held to the round the config serves for its window
  ["heavy hitters: its window's round", [row({ metric: "w", fp: ROUND.fingerprint })], config({ rounds: [ROUND] }), state(), "send"],
  ["heavy hitters: another round of its window: fetch", [row({ metric: "w", fp: 5 })], config({ rounds: [ROUND] }), state(), "refetch"],
  ["heavy hitters: another round after a fetch", [row({ metric: "w", fp: 5 })], config({ rounds: [ROUND] }), state({ refetched: true }), "drop:round_changed"],
  ["heavy hitters: a window the config no longer lists: the shuffler decides", [row({ metric: "w", fp: 5, window: CUR - 1 })], config({ rounds: [ROUND] }), state({ refetched: true }), "send"],
  ["heavy hitters: refused round_mismatch: fetch", [row({ metric: "w", fp: ROUND.fingerprint })], config({ rounds: [ROUND] }), state({ answer: sdk.classify("failed_precondition", "round_mismatch: r") }), "refetch"],
  ["heavy hitters: round_mismatch after a fetch, its round still served: back off", [row({ metric: "w", fp: ROUND.fingerprint })], config({ rounds: [ROUND] }), state({ refetched: true, answer: sdk.classify("failed_precondition", "round_mismatch: r") }), "offline"],
  ["encoding not in this build: sealed", [row({ metric: "b" })], config(), state(), "send"],
  ["encoding not in this build: never clear", [row({ metric: "b" })], config(), state({ sealing: "off" }), "drop:refused"],
  ["above the ceiling", [row()], config(), state({ ceiling: () => "too loose" }), "drop:refused_by_ceiling"],
  ["no key: fetch", [row()], config({ keys: [] }), state(), "refetch"],
  ["no key after a fetch: wait, never clear", [row()], config({ keys: [] }), state({ refetched: true }), "wait"],
  ["sealing off: send clear", [row()], config({ keys: [] }), state({ sealing: "off" }), "send"],
  ["refused window_closed", [row()], config(), state({ answer: sdk.classify("failed_precondition", "window_closed: w") }), "drop:window_closed"],
  ["refused window_ahead: fetch", [row()], config(), state({ answer: sdk.classify("failed_precondition", "window_ahead: w") }), "refetch"],
  ["window_ahead after a fetch: back off", [row()], config(), state({ refetched: true, answer: sdk.classify("failed_precondition", "window_ahead: w") }), "offline"],
  ["stale_key: fetch", [row()], config(), state({ answer: sdk.classify("failed_precondition", "stale_key: k") }), "refetch"],
  ["invalid_argument: fetch", [row()], config(), state({ answer: sdk.classify("invalid_argument", "bad_length: x") }), "refetch"],
  ["invalid_argument after a fetch: refused", [row()], config(), state({ refetched: true, answer: sdk.classify("invalid_argument", "bad_length: x") }), "drop:refused"],
  ["unavailable: back off", [row()], config(), state({ answer: sdk.classify("unavailable", "down") }), "offline"],
  ["unauthenticated: fatal", [row()], config(), state({ answer: sdk.classify("unauthenticated", "bad_token: x") }), "offline"],
];

for (const [name, rows, cfg, st, want] of CASES)
  test(`decide: ${name}`, () => assert.equal(kind(sdk.decide(rows, cfg, at(NOW), st)), want));

test("the wall clock set after the fetch moves no window; the server time is fetched again", () => {
  for (const setBy of [2 * WS, -2 * WS]) {
    const now = at(NOW + setBy, setBy);
    assert.equal(sdk.windowOf(config(), now), CUR);
    assert.equal(kind(sdk.decide([row()], config(), now, state())), "refetch");
    const d = sdk.decide([row()], config(), now, state({ refetched: true }));
    assert.equal(d.kind, "send");
    assert.equal(d.window, CUR);
  }
  // within the slack: no refetch; asleep on a clock that stops in suspend: refetch
  assert.equal(kind(sdk.decide([row()], config(), at(NOW + 30, 30), state())), "send");
  assert.equal(kind(sdk.decide([row()], config(), at(NOW + 8 * 3600, 8 * 3600), state())), "refetch");
});

test("a config restored by a new process runs on the wall clock and its stored offset", () => {
  const c = sdk.restored(config().config, NOW - 600, OFFSET, at(NOW));
  assert.equal(sdk.serverNow(c, at(NOW)), NOW + OFFSET);
  assert.equal(sdk.expired(c, at(NOW)), false);
  assert.equal(sdk.expired(c, at(NOW + 3000)), true);
  assert.equal(sdk.expired(sdk.restored(config().config, NOW + 600, OFFSET, at(NOW)), at(NOW)), true); // set back since
});

test("a restored or bundled config on a clock set forward drops nothing unasked", () => {
  const later = at(NOW + 2 * WS, 2 * WS); // set two days forward while the app was down
  const c = sdk.restored(config().config, NOW - 600, OFFSET, later);
  assert.equal(sdk.windowOf(c, later), CUR + 2);
  assert.equal(kind(sdk.decide([row()], c, later, state({ refetched: true }))), "send");
  const bundled = { ...config(), age: Infinity };
  assert.equal(kind(sdk.decide([row({ window: CUR - 2 })], bundled, at(NOW), state({ refetched: true }))), "send");
  // fetched by this process: the monotonic clock is believed even once expired
  assert.equal(kind(sdk.decide([row({ window: CUR - 2 })], config(), at(NOW + 2 * WS), state({ refetched: true }))), "drop:window_closed");
});

test("send carries the group's window and the newest usable key", () => {
  const d = sdk.decide([row({ window: CUR - 1 })], config(), at(NOW), state());
  assert.equal(d.kind, "send");
  assert.equal(d.window, CUR - 1);
  assert.equal(d.key.keyId, 3);
  assert.equal(sdk.decide([row()], config(), at(NOW), state({ sealing: "off" })).key, null);
});

test("classify: the same table as the Python SDK", () => {
  const t = (code, msg) => {
    const a = sdk.classify(code, msg);
    return `${a.action}/${a.reason}/${a.afterRefetch}`;
  };
  assert.equal(t("failed_precondition", "window_closed: x"), "drop/window_closed/retry");
  assert.equal(t("failed_precondition", "window_ahead: x"), "refetch/window_ahead/retry");
  assert.equal(t("invalid_argument", "protocol_unsupported: x"), "fatal/protocol_unsupported/retry");
  assert.equal(t("invalid_argument", "unknown_metric: x"), "refetch/unknown_metric/drop");
  assert.equal(t("unauthenticated", "no_token: x"), "fatal/unauthenticated/retry");
  assert.equal(t("unavailable", "x"), "retry/unavailable/retry");
  assert.equal(t("deadline_exceeded", ""), "retry/deadline_exceeded/retry");
});

test("nextGroup: the oldest row's metric and window, all of its rows", () => {
  const rows = [row({ id: "a", metric: "h" }), row({ id: "b" }), row({ id: "c", metric: "h" }), row({ id: "d", metric: "h", window: CUR - 1 })];
  assert.deepEqual(sdk.nextGroup(rows).map((r) => r.id), ["a", "c"]);
});

test("the privacy ceiling: ε_1, ε_∞, a basic ε, a histogram's ε_L or its absence", () => {
  const o = { maxEpsilon: 10, maxEpsilonInf: 20, allowUnrandomizedHistograms: false };
  const of = (params, kind) => ({ ...metric("x", params), [kind]: params });
  const ceiling = (m, mc, ceilings) => sdk.ceilingProblem(m, mc, ceilings, sdk.ALL_ENCODINGS);
  assert.equal(ceiling("x", of(rappor, "rappor"), o), null);
  const clear = new sdk.RapporParams({ k: 16, h: 2, m: 4, f: 0, p: 0, q: 1 }); // the Bloom filter in the clear
  assert.match(ceiling("x", of(clear, "rappor"), o), /ε_1 = Infinity/);
  const loose = new sdk.RapporParams({ k: 16, h: 4, m: 4, f: 0.01, p: 0.5, q: 0.75 });
  assert.match(ceiling("x", of(loose, "rappor"), o), /ε_∞ .* maxEpsilonInf = 20/);
  const basic = new sdk.BasicParams({ mechanism: "krr", epsilon: 12, domainSize: 4 });
  assert.match(ceiling("x", of(basic, "basic"), o), /ε = 12.*maxEpsilon = 10/);
  assert.equal(ceiling("x", of(basic, "basic"), { ...o, maxEpsilon: Infinity }), null);
  const bare = new sdk.HistogramParams({ domainSize: 4, fakeSlots: 1, fakeProbability: 0.5 });
  assert.match(ceiling("x", of(bare, "histogram"), o), /without local randomization/);
  assert.equal(ceiling("x", of(bare, "histogram"), { ...o, allowUnrandomizedHistograms: true }), null);
  assert.equal(ceiling("x", of(hist, "histogram"), o), null);
});
