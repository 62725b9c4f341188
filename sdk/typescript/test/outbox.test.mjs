// The Node outbox (a file): one report per (metric, window) by the time windows cover,
// rows and counters durable across a reopen, a removal counted once, the bounds, and a
// reporter that never throws into the app (here: no shuffler at the address).
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import * as sdk from "../dist/node.js";

const dir = () => mkdtempSync(join(tmpdir(), "crowdmix-outbox-"));
const row = (id, metric = "m", window = 10) => ({ id, metric, window, windowSeconds: 3600, cohort: 0, bits: "00", fp: "1" });
const open = async (d, max = 1000) => {
  const o = new sdk.Outbox(new sdk.FileBackend(join(d, "outbox.json"), d), max, 1 << 20);
  await o.load();
  return o;
};

test("one claim per (metric, window); a clock going back or a shorter window reopens nothing", async () => {
  const d = dir();
  const o = await open(d);
  assert.equal(await o.claim("m", 10, 3600, [row("a")]), "claimed");
  assert.equal(await o.claim("m", 10, 3600, [row("b")]), "taken");
  assert.equal(await o.claim("m", 9, 3600, [row("b")]), "taken");
  assert.equal(await o.claim("m", 20, 1800, [row("b")]), "taken"); // 20·1800 = 10·3600: inside the claimed hour
  assert.equal(await o.claim("n", 10, 3600, [row("c", "n")]), "claimed");
  assert.equal(await o.claim("m", 11, 3600, [row("d", "m", 11)]), "claimed");
  const again = await open(d);
  assert.deepEqual(again.snapshot.rows.map((r) => r.id), ["a", "c", "d"]);
  assert.equal(await again.claim("m", 11, 3600, [row("e", "m", 11)]), "taken");
});

test("a histogram's rows are claimed together, and a full outbox claims nothing", async () => {
  const o = await open(dir(), 3);
  assert.equal(await o.claim("h", 1, 3600, [row("a", "h", 1), row("b", "h", 1)]), "claimed");
  assert.equal(await o.claim("h2", 1, 3600, [row("c", "h2", 1), row("d", "h2", 1)]), "full");
  assert.equal(o.snapshot.claims.h2, undefined);
  assert.equal(o.snapshot.rows.length, 2);
});

test("removal counts the rows it deleted, once", async () => {
  const d = dir();
  const o = await open(d);
  await o.claim("m", 1, 3600, [row("a", "m", 1)]);
  await o.claim("n", 1, 3600, [row("b", "n", 1)]);
  assert.equal(await o.remove(["a", "zz"], "delivered"), 1);
  assert.equal(await o.remove(["a"], "delivered"), 0);
  assert.equal(await o.remove(["b"], "window_closed"), 1);
  assert.deepEqual((await open(d)).snapshot.counters, { delivered: 1, window_closed: 1 });
});

test("an outbox file that is not one is refused, not started afresh", async () => {
  const d = dir();
  writeFileSync(join(d, "outbox.json"), "{not json");
  await assert.rejects(open(d), /not a crowdmix outbox/);
});

test("the reporter never throws into the app: no shuffler, bad metric, bad value, closed", async () => {
  const d = dir();
  const r = await sdk.openReporter(d, { url: "http://127.0.0.1:9", background: false, timeoutMs: 500 });
  assert.equal(await r.report("m", "v"), false);
  assert.equal(r.lastStatus, "no_config");
  assert.match(r.lastError, /GetConfig: (unavailable|deadline_exceeded)/);
  assert.equal(await r.report(undefined, {}), false);
  assert.equal(await r.flush(300), 0);
  r.networkAvailable();
  await r.close();
  assert.equal(await r.report("m", "v"), false);
  assert.equal(await r.flush(10), 0);
  assert.equal(readFileSync(join(d, "secret")).length, 32);
});

test("constructor errors name the problem", async () => {
  await assert.rejects(sdk.openReporter(dir(), { url: "" }), /url/);
  await assert.rejects(sdk.openReporter(dir(), { url: "http://x", sealing: "maybe" }), /sealing/);
  await assert.rejects(sdk.openReporter(dir(), { url: "http://x", maxEpsilon: -1 }), /maxEpsilon/);
});

test("a bundled config makes the first report offline; a bad one is refused at construction", async () => {
  const { encodeConfigForTest } = await import("./config-bytes.mjs");
  const d = dir();
  const r = await sdk.openReporter(d, { url: "http://127.0.0.1:9", background: false, timeoutMs: 300, bundledConfig: encodeConfigForTest() });
  assert.equal(await r.report("theme", "dark"), true, r.lastError);
  assert.equal(await r.report("theme", "dark"), false); // this window's report is made
  assert.equal(r.lastStatus, "already_reported_this_window");
  assert.equal(r.queued, 1);
  assert.equal(await r.report("nope", "dark"), false);
  assert.equal(r.lastStatus, "unknown_metric");
  assert.equal(await r.report("theme", "purple"), false);
  assert.equal(r.lastStatus, "invalid_value");
  assert.match(r.lastError, /not in the metric's domain/);
  await r.flush(10);
  assert.equal(r.counters().unknown_metric, 1);
  assert.equal(r.counters().invalid_value, 1);
  await r.close();
  await assert.rejects(sdk.openReporter(dir(), { url: "http://x", bundledConfig: new Uint8Array([0xff]) }), /ConfigResponse|protocol/);
});

test("one process per app directory: a live holder is refused, a dead one's lock taken over", async () => {
  const d = dir();
  const a = await sdk.openReporter(d, { url: "http://127.0.0.1:9", background: false });
  await assert.rejects(sdk.openReporter(d, { url: "http://127.0.0.1:9" }), /already open in this process/);
  await a.close();
  const b = await sdk.openReporter(d, { url: "http://127.0.0.1:9", background: false }); // released
  await b.close();
  writeFileSync(join(d, "outbox.lock"), "1"); // pid 1 lives (init): another process
  await assert.rejects(sdk.openReporter(d, { url: "http://127.0.0.1:9" }), /in use by process 1/);
  writeFileSync(join(d, "outbox.lock"), "999999999"); // no such process: a killed holder
  const c = await sdk.openReporter(d, { url: "http://127.0.0.1:9", background: false });
  await c.close();
});

test("a wall clock set days forward after the fetch moves no window", async () => {
  const { encodeConfigForTest } = await import("./config-bytes.mjs");
  let t = 1_800_000_000 + 3600; // the true time: the shuffler's clock and the device's monotonic one
  let ahead = 0; // how far the device's wall clock was set forward
  let submits = 0;
  const shuffler = async (url) => {
    if (url.endsWith("/GetConfig")) return new Response(encodeConfigForTest(t), { status: 200 });
    submits++;
    return new Response(new Uint8Array(0), { status: 200 });
  };
  const r = await sdk.openReporter(dir(), { url: "http://shuffler.test", background: false, sealing: "off", fetch: shuffler, clock: () => t + ahead, monotonic: () => t });
  assert.equal(await r.report("theme", "dark"), true, r.lastError);
  const day = Math.floor(t / 86400);
  assert.equal(r.window(), day);
  ahead = 2 * 86400; // the user sets the clock two days forward
  assert.equal(r.window(), day);
  assert.equal(await r.report("theme", "dark"), false); // still the server's day: made already
  assert.equal(r.lastStatus, "already_reported_this_window");
  assert.equal(await r.flush(2000), 0);
  assert.equal(submits, 1);
  ahead = 0; // and back
  t += 86400; // a day later
  assert.equal(r.window(), day + 1);
  assert.equal(await r.report("theme", "light"), true, r.lastError);
  assert.equal(await r.flush(2000), 0);
  assert.deepEqual([submits, r.counters().delivered, r.counters().window_closed], [2, 2, 0]);
  await r.close();
});

test("withdrawing a report named ahead moves the claim back, never below a settled window", async () => {
  const d = dir();
  const o = await open(d);
  assert.equal(await o.claim("m", 10, 3600, [row("a", "m", 10)]), "claimed");
  await o.remove(["a"], "delivered"); // window 10 may have reached a shuffler
  assert.equal(await o.claim("m", 11, 3600, [row("b", "m", 11)]), "claimed"); // waits
  assert.equal(await o.claim("m", 40, 3600, [row("c", "m", 40)]), "claimed"); // a clock set forward
  assert.equal(await o.withdraw(["c"]), 1);
  assert.equal(await o.claim("m", 11, 3600, [row("x", "m", 11)]), "taken"); // still waiting: held
  await o.remove(["b"], "window_closed");
  assert.equal(await o.claim("m", 12, 3600, [row("e", "m", 12)]), "claimed");
  await o.withdraw(["e"]);
  assert.equal(await o.claim("m", 11, 3600, [row("x", "m", 11)]), "taken"); // settled
  assert.equal(await o.claim("m", 12, 3600, [row("f", "m", 12)]), "claimed");
  assert.equal(await o.claim("n", 40, 3600, [row("g", "n", 40)]), "claimed");
  await o.withdraw(["g"]);
  assert.equal((await open(d)).snapshot.claims.n, undefined); // nothing before it: no claim
  assert.equal((await open(d)).snapshot.counters.window_ahead, 3);
  // a document from before settled windows: its claims stand for them
  const old = dir();
  writeFileSync(join(old, "outbox.json"), JSON.stringify({ rows: [row("h", "m", 40)], claims: { m: 41 * 3600 }, counters: {}, config: null }));
  const o2 = await open(old);
  await o2.withdraw(["h"]);
  assert.equal(o2.snapshot.claims.m, 41 * 3600);
});

test("a wall clock set a month forward while the app was down: the report claimed on it is withdrawn", async () => {
  const { encodeConfigForTest } = await import("./config-bytes.mjs");
  const t = 1_800_000_000 + 3600;
  let online = true;
  let submits = 0;
  const shuffler = async (url) => {
    if (!online) throw new TypeError("fetch failed");
    if (url.endsWith("/GetConfig")) return new Response(encodeConfigForTest(t + 600), { status: 200 });
    submits++;
    return new Response(new Uint8Array(0), { status: 200 });
  };
  const d = dir();
  const opts = { url: "http://shuffler.test", background: false, sealing: "off", fetch: shuffler, timeoutMs: 300 };
  const a = await sdk.openReporter(d, { ...opts, clock: () => t, monotonic: () => 0 });
  assert.equal(await a.flush(2000), 0); // the config cached, offset 0
  await a.close();
  online = false; // restarted offline, the wall clock a month ahead
  const month = 30 * 86400;
  const r = await sdk.openReporter(d, { ...opts, clock: () => t + 600 + month, monotonic: () => 5 });
  assert.equal(await r.report("theme", "dark"), true, r.lastError); // claimed on the wall clock
  const day = Math.floor(t / 86400);
  assert.equal(r._outbox.snapshot.rows[0].window, day + 30);
  online = true;
  assert.equal(await r.flush(2000), 0); // the server time learnt: withdrawn, not kept a month
  assert.equal(r.counters().window_ahead, 1);
  assert.equal(await r.report("theme", "dark"), true, r.lastError); // the metric is not held
  assert.equal(r._outbox.snapshot.rows[0].window, day);
  assert.equal(await r.flush(2000), 0);
  assert.deepEqual([submits, r.counters().delivered], [1, 1]);
  await r.close();
});

test("a clock set while running, the fetch failing: the restart names the server's window", async () => {
  const { encodeConfigForTest } = await import("./config-bytes.mjs");
  const t = 1_800_000_000 + 3600;
  let online = true;
  const shuffler = async (url) => {
    if (!online) throw new TypeError("fetch failed");
    return new Response(url.endsWith("/GetConfig") ? encodeConfigForTest(t) : new Uint8Array(0), { status: 200 });
  };
  const d = dir();
  const month = 30 * 86400;
  let ahead = 0;
  const opts = { url: "http://shuffler.test", background: false, sealing: "off", fetch: shuffler, timeoutMs: 300 };
  const a = await sdk.openReporter(d, { ...opts, clock: () => t + ahead, monotonic: () => 0 });
  assert.equal(await a.flush(2000), 0); // the config cached, offset 0
  online = false;
  ahead = month; // set forward while the app runs, offline
  assert.equal(await a.report("theme", "dark"), true, a.lastError);
  await a.close();
  const day = Math.floor(t / 86400);
  const r = await sdk.openReporter(d, { ...opts, clock: () => t + month + 60, monotonic: () => 7 });
  assert.equal(r.window(), day); // on the old offset: day + 30
  assert.equal(await r.report("theme", "dark"), false);
  assert.equal(r.lastStatus, "already_reported_this_window");
  await r.close();
});
