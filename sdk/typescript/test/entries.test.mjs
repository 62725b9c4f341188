// The per-encoding entry points: a reporter carries only the encodings its entry names
// (a metric of another is refused as unknown_metric, naming the encoding), and an app
// bundle of `@crowdmix/client/rappor` holds no other encoder and stays within the 12 KB
// target (BENCHMARKS.md has its size).
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import { gzipSync } from "node:zlib";
import { build } from "esbuild";
import * as sdk from "../dist/node.js";
import { encodeConfigForTest } from "./config-bytes.mjs";

const reporter = (encodings) =>
  new sdk.Reporter(
    new sdk.Outbox(new sdk.MemoryBackend(), 10, 1 << 20),
    new Uint8Array(32).fill(1),
    { url: "http://127.0.0.1:9", background: false, timeoutMs: 300, bundledConfig: encodeConfigForTest() },
    encodings,
  );

test("a metric of an encoding the reporter does not carry is unknown_metric, naming it", async () => {
  const r = reporter([sdk.rapporEncoding]);
  assert.equal(await r.report("theme", "dark"), false);
  assert.equal(r.lastStatus, "unknown_metric");
  assert.match(r.lastError, /encoding krr is not in this build/);
  assert.equal(r.counters().unknown_metric, 1);
  const b = reporter([sdk.basicEncoding]);
  assert.equal(await b.report("theme", "dark"), true, b.lastError);
  assert.equal(b.queued, 1);
});

test("readConfig checks the fingerprints of the encodings it carries, keeps the others bare", () => {
  const answer = encodeConfigForTest();
  assert.ok(sdk.readConfig(answer, [sdk.basicEncoding]).metrics.get("theme").basic);
  const bare = sdk.readConfig(answer, [sdk.rapporEncoding]).metrics.get("theme");
  assert.equal(bare.basic, undefined);
  assert.equal(bare.encoding, "krr");
  assert.deepEqual(sdk.parseConfig(answer).metrics.get("theme").domain, ["light", "dark", "sepia"]);
});

test("a config answer without window_tolerance reads as the shuffler's default, 0 as 0", () => {
  const read = (t) => sdk.readConfig(encodeConfigForTest(1_800_000_000, t), [sdk.basicEncoding]).windowTolerance;
  assert.equal(read(null), 1); // absent: not proto3's 0, which would drop the previous window unasked
  assert.equal(read(0), 0);
  assert.equal(read(2), 2);
});

const dist = (f) => new URL(`../dist/${f}`, import.meta.url).pathname;

async function appBundle(file) {
  const r = await build({
    stdin: { contents: `import { openReporter } from ${JSON.stringify(dist(file))}; globalThis.x = openReporter;`, resolveDir: dist(".") },
    bundle: true,
    minify: true,
    format: "esm",
    platform: "browser",
    write: false,
    logLevel: "error",
  });
  return r.outputFiles[0].text;
}

test("a RAPPOR app's bundle holds no other encoder, and is smaller than with every encoding", async () => {
  const js = await appBundle("browser-rappor.js");
  for (const other of ["mechanism must be one of", "fake_slots", "olh", "alphabet", "discovery-group", "crowdmix/discovery"])
    assert.ok(!js.includes(other), `${other} in the RAPPOR bundle`);
  const gz = gzipSync(js, { level: 9 }).length;
  // the 12 KB target (12288 bytes gzip -9) as an app's esbuild makes it; BENCHMARKS.md has today's figure
  assert.ok(gz <= 12288, `${gz} bytes gzipped: above the 12 KB target`);
  const all = await appBundle("index.js");
  assert.ok(all.includes("mechanism must be one of") && all.includes("fake_slots") && all.includes("discovery-group"));
  assert.ok(gzipSync(all, { level: 9 }).length > gz + 1000);
});

test("the prebuilt RAPPOR bundle is within the 12 KB target", () => {
  // 12288 bytes gzip -9 (minified by terser; BENCHMARKS.md has today's figure and esbuild's)
  const gz = gzipSync(readFileSync(dist("crowdmix.rappor.browser.js")), { level: 9 }).length;
  assert.ok(gz <= 12288, `${gz} bytes gzipped: above the 12 KB target`);
});

test("the one-encoding browser entries leave the SDK's internals to the entries with every encoding", async () => {
  const rappor = await import("../dist/crowdmix.rappor.browser.js");
  for (const name of ["openReporter", "IdbBackend", "Reporter", "RapporParams", "RapporEncoder", "sealReport", "CrowdmixError", "ParamsError", "epsilonOne"])
    assert.ok(name in rappor, `${name} exported by /rappor`);
  for (const name of ["decide", "MemoryBackend", "applyOp", "readConfig", "hpkeSeal"]) {
    assert.ok(!(name in rappor), `${name} exported by /rappor`);
    assert.ok(name in sdk, `${name} exported by node`);
  }
});

test("the package exports one browser entry per encoding", () => {
  const pkg = JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8"));
  for (const kind of ["rappor", "basic", "histogram", "heavy-hitters"]) assert.equal(pkg.exports[`./${kind}`].default, `./dist/browser-${kind}.js`);
});
