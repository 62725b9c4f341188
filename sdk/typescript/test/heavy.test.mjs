// Heavy hitters in the reporter: a report is encoded against the round served for its
// window, by the devices of that round only, once per window; without a round nothing is
// made and the config is fetched again (never a guessed round); a round above the
// ceiling makes nothing; reports leave clear (sealing off) keeping their ids on retry.
// The shuffler is a fetch function here (its answers built by test/config-bytes.mjs).
import assert from "node:assert/strict";
import { test } from "node:test";
import * as sdk from "../dist/node.js";
import { WORDS, encodeHeavyConfigForTest } from "./config-bytes.mjs";

const W = 500_000; // the discovery's first window (hourly windows)
const FP = new sdk.HeavyHittersParams(WORDS).fingerprint();
const ROUNDS = [
  { round: 0, window: W, opened: W, epsilon: 9.5, start: 0, stop: 3, seeds: 16 },
  { round: 1, window: W + 1, opened: W, epsilon: 9.5, start: 3, stop: 7, seeds: 16 },
  { round: 2, window: W + 2, opened: W, epsilon: 9.5, candidates: ["apple", "banana"] },
];

/** A secret whose device reports in round `r` of the discovery opened in W. */
async function secretIn(r) {
  for (let i = 1; ; i++) {
    const s = new Uint8Array(32).fill(i);
    if ((await sdk.deviceRound(s, "words", FP, W, WORDS.weights)) === r) return s;
  }
}

/** A shuffler serving `state.rounds` (a fetch function), counting calls, keeping Submit bodies. */
function shuffler(state) {
  return async (url, init) => {
    if (url.endsWith("/GetConfig")) {
      state.fetches++;
      return new Response(encodeHeavyConfigForTest(state.t, state.rounds), { status: 200 });
    }
    state.bodies.push(new Uint8Array(init.body));
    if (state.down) return new Response(JSON.stringify({ code: "unavailable", message: "busy" }), { status: 503 });
    if (state.refuse) return new Response(JSON.stringify(state.refuse), { status: 400 });
    return new Response(new Uint8Array(0), { status: 200 });
  };
}

function device(secret, state, options = {}) {
  return new sdk.Reporter(
    new sdk.Outbox(new sdk.MemoryBackend(), 100, 1 << 20),
    secret,
    { url: "http://shuffler.test", background: false, sealing: "off", fetch: shuffler(state), clock: () => state.t, monotonic: () => state.t, timeoutMs: 300, ...options },
    sdk.ALL_ENCODINGS,
  );
}

const newState = (window = W) => ({ t: window * 3600 + 600, rounds: ROUNDS, fetches: 0, bodies: [], down: false, refuse: null });
/** A round as the wire serves it (absent fields: proto3's defaults). */
const wire = (r) => ({ start: 0, stop: 0, seeds: 0, buckets: 0, candidates: [], ...r });

test("a report is encoded against its window's round, once a window, by that round's devices only", async () => {
  const state = newState();
  const [in0, in1] = [device(await secretIn(0), state), device(await secretIn(1), state)];
  assert.equal(await in0.report("words", 7), false); // checked after the round: a string only
  assert.equal(in0.lastStatus, "invalid_value");
  assert.equal(await in0.report("words", "apple"), true, in0.lastError);
  const [row] = in0._outbox.snapshot.rows;
  // 4 bytes: every round's length; under the round's fingerprint, not the metric's
  assert.deepEqual([row.window, row.bits.length, row.fp], [W, 8, sdk.roundFingerprint(FP, wire(ROUNDS[0])).toString()]);
  const index = new DataView(sdk.fromHex(row.bits).buffer).getUint32(0, true);
  assert.ok(index < 16 * 13367, `${index}: s·g + y of round 0`);
  assert.equal(await in0.report("words", "apple"), false);
  assert.equal(in0.lastStatus, "already_reported_this_window");
  assert.equal(await in1.report("words", "apple"), false);
  assert.equal(in1.lastStatus, "not_this_round");
  assert.match(in1.lastError, /reports in round 1 of the discovery, not in round 0/);
  state.t += 3600; // round 1's window
  assert.equal(await in1.report("words", "apple"), true, in1.lastError);
  assert.equal(await in0.report("words", "apple"), false);
  assert.equal(in0.lastStatus, "not_this_round");
  state.t += 3600; // the value round: in its group, "banana" is candidate 1 (of 2, and none)
  const in2 = device(await secretIn(2), state);
  assert.equal(await in2.report("words", "banana"), true, in2.lastError);
  assert.ok(sdk.fromHex(in2._outbox.snapshot.rows[0].bits)[0] < 3);
  assert.deepEqual([in0.counters().not_this_round, in1.counters().not_this_round, in0.counters().invalid_value], [1, 1, 1]);
});

test("no round for the window: nothing made, the config fetched again (at most once per 10 s of its age)", async () => {
  const state = { ...newState(), rounds: [] };
  const r = device(await secretIn(0), state);
  assert.equal(await r.report("words", "apple"), false);
  assert.equal(r.lastStatus, "no_round");
  assert.equal(state.fetches, 1);
  state.rounds = ROUNDS; // the round job wrote the round since
  assert.equal(await r.report("words", "apple"), false); // the config is 0 s old: not refetched
  assert.equal(state.fetches, 1);
  state.t += 11;
  assert.equal(await r.report("words", "apple"), false); // 11 s old: marked for a refetch
  assert.equal(r.lastStatus, "no_round");
  assert.equal(await r.report("words", "apple"), true, r.lastError); // fetched, and its round is there
  assert.deepEqual([state.fetches, r.counters().no_round, r.queued], [2, 3, 1]);
});

test("a served round above the device's ceiling makes no report", async () => {
  const state = newState();
  const r = device(await secretIn(0), state, { maxEpsilon: 5 });
  assert.equal(await r.report("words", "apple"), false);
  assert.equal(r.lastStatus, "refused_by_ceiling");
  assert.match(r.lastError, /served round gives ε = 9\.50000, above this device's ceiling maxEpsilon = 5/);
  assert.equal(r.queued, 0);
});

test("a heavy-hitters report leaves clear with sealing off, its id the same on every attempt", async () => {
  const state = newState();
  const r = device(await secretIn(0), state);
  assert.equal(await r.report("words", "apple"), true, r.lastError);
  const id = Buffer.from(r._outbox.snapshot.rows[0].id, "hex");
  state.down = true;
  assert.equal(await r.flush(1000), 1);
  state.down = false;
  assert.equal(await r.flush(1000), 0, r.lastError);
  assert.equal(state.bodies.length, 2);
  for (const body of state.bodies) assert.ok(Buffer.from(body).includes(id));
  assert.equal(r.counters().delivered, 1);
});

test("a report of another shuffler's round: refused round_mismatch, the config fetched once, then dropped as round_changed", async () => {
  const state = newState();
  const r = device(await secretIn(0), state);
  assert.equal(await r.report("words", "apple"), true, r.lastError);
  const fp = r._outbox.snapshot.rows[0].fp;
  // the next shuffler holds another round file: another round 0 in this window
  state.rounds = [{ ...ROUNDS[0], epsilon: 8, buckets: 2999 }, ...ROUNDS.slice(1)];
  state.refuse = { code: "failed_precondition", message: "round_mismatch: metric 'words': the reports of window 500000 name another round" };
  const fetches = state.fetches;
  assert.equal(await r.flush(1000), 0, r.lastError);
  assert.equal(state.bodies.length, 1); // sent once, refused, never sent again
  assert.equal(state.fetches, fetches + 1);
  assert.deepEqual([r.counters().round_changed, r.counters().delivered, r.queued], [1, 0, 0]);
  assert.notEqual(sdk.roundFingerprint(FP, wire(state.rounds[0])).toString(), fp);
  // refused by a shuffler of another round while the config serves the report's own: kept, tried later
  state.rounds = ROUNDS;
  state.t += 3600;
  const r1 = device(await secretIn(1), state);
  assert.equal(await r1.report("words", "apple"), true, r1.lastError);
  assert.equal(await r1.flush(1000), 1);
  assert.equal(r1.counters().round_changed, 0);
  state.refuse = null;
  assert.equal(await r1.flush(1000), 0, r1.lastError);
  assert.equal(r1.counters().delivered, 1);
});

test("a build without heavy hitters says unknown_metric, naming the encoding", async () => {
  const state = newState();
  const r = new sdk.Reporter(
    new sdk.Outbox(new sdk.MemoryBackend(), 100, 1 << 20),
    await secretIn(0),
    { url: "http://shuffler.test", background: false, sealing: "off", fetch: shuffler(state), clock: () => state.t, monotonic: () => state.t },
    [sdk.rapporEncoding],
  );
  assert.equal(await r.report("words", "apple"), false);
  assert.equal(r.lastStatus, "unknown_metric");
  assert.match(r.lastError, /encoding heavy-hitters is not in this build/);
});
