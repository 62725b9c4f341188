// The TypeScript SDK's footprint in a browser bundle and its seal time in Node.
//
//   (cd sdk/typescript && npm ci && npm run build) && node bench/typescript_sdk.mjs [--n=3000] [--anchors=DIR] [--against=SDK]
//
// - Bundles as an app makes them: an entry that imports `openReporter` from the built
//   package (dist/, through its package.json exports) and uses it, bundled by esbuild
//   (minify, tree-shaking, browser, ESM), gzip -9. The reporter opened carries the
//   IndexedDB outbox, HPKE sealing and the Connect transport: `@crowdmix/client/rappor`
//   (an app of RAPPOR metrics), `@crowdmix/client` (every encoding) and
//   `@crowdmix/client/heavy-hitters`; "prebuilt rappor" is dist/crowdmix.rappor.browser.js
//   (every export of `/rappor`, minified by terser), "prebuilt rappor, esbuild-minified"
//   the same bundle minified by esbuild. "seal": `sealReport` alone (the SDK's HPKE on WebCrypto,
//   src/hpke.ts); "hpke": the same X25519/HKDF-SHA256/AES-128-GCM seal of @hpke/core (a
//   devDependency, what the SDK sealed with before).
//   --anchors=DIR: DIR/node_modules holds @mozilla/glean and @divviup/dap, bundled the
//   same way (`import Glean from "@mozilla/glean/web"`, `import Task from "@divviup/dap"`).
// - Seal: median time of one sealReport (HPKE X25519 + AES-128-GCM on WebCrypto) over
//   --n reports after a warm-up; RAPPOR k=128 encode too.
// - --against=SDK: SDK is another build's sdk/typescript directory (e.g. a `git worktree`
//   of an older commit, `npm ci && npm run build` run in it): CPU time (process.cpuUsage)
//   per seal and per encode of both builds, alternating in this process, 5 rounds of
//   1000 seals and 3000 encodes each, the median round printed.
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { gzipSync } from "node:zlib";

const SDK = new URL("../sdk/typescript/", import.meta.url);
const esbuild = createRequire(SDK)("esbuild");
const sdk = await import(new URL("dist/node.js", SDK));
const arg = (name, d) => process.argv.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3) ?? d;
const n = Number(arg("n", 3000));
const anchors = arg("anchors", null);
const against = arg("against", null);

// an app directory whose node_modules/@crowdmix/client is this package
const app = mkdtempSync(join(tmpdir(), "crowdmix-bundle-"));
mkdirSync(join(app, "node_modules", "@crowdmix"), { recursive: true });
symlinkSync(SDK.pathname, join(app, "node_modules", "@crowdmix", "client"));

async function gzipped(source, dir = app) {
  const entry = join(dir, `entry-${Math.random().toString(36).slice(2)}.mjs`);
  writeFileSync(entry, source);
  try {
    const r = await esbuild.build({ entryPoints: [entry], bundle: true, minify: true, format: "esm", platform: "browser", write: false, logLevel: "error" });
    const bytes = r.outputFiles[0].contents;
    return { min: bytes.length, gz: gzipSync(bytes, { level: 9 }).length };
  } finally {
    rmSync(entry);
  }
}
const HPKE_SEAL = `import { Aes128Gcm, CipherSuite, DhkemX25519HkdfSha256, HkdfSha256 } from "@hpke/core";
     const s = new CipherSuite({ kem: new DhkemX25519HkdfSha256(), kdf: new HkdfSha256(), aead: new Aes128Gcm() });
     globalThis.x = (pk, info, pt) => s.seal({ recipientPublicKey: pk, info }, pt);`;
const use = (mod, name = "openReporter") => `import { ${name} } from "${mod}"; globalThis.x = ${name};`;
const sizes = {
  rappor: await gzipped(use("@crowdmix/client/rappor")),
  all: await gzipped(use("@crowdmix/client")),
  "heavy-hitters": await gzipped(use("@crowdmix/client/heavy-hitters")),
  seal: await gzipped(use("@crowdmix/client/rappor", "sealReport")),
  hpke: await gzipped(HPKE_SEAL, new URL("node_modules/", SDK).pathname),
};
const prebuilt = readFileSync(new URL("dist/crowdmix.rappor.browser.js", SDK));
sizes["prebuilt rappor"] = { min: prebuilt.length, gz: gzipSync(prebuilt, { level: 9 }).length };
// the same bundle as scripts/build.mjs makes it, but minified by esbuild instead of terser
const esbuilt = await esbuild.build({
  entryPoints: [new URL("src/browser-rappor.ts", SDK).pathname],
  bundle: true, format: "esm", target: "es2022", platform: "browser", minify: true, mangleProps: /^_/, write: false, logLevel: "error",
});
const esbuiltBytes = esbuilt.outputFiles[0].contents;
sizes["prebuilt rappor, esbuild-minified"] = { min: esbuiltBytes.length, gz: gzipSync(esbuiltBytes, { level: 9 }).length };
if (anchors) {
  sizes.glean = await gzipped(`import Glean from "@mozilla/glean/web"; globalThis.x = Glean;`, anchors);
  sizes.divviup = await gzipped(`import Task from "@divviup/dap"; globalThis.x = Task;`, anchors);
}
rmSync(app, { recursive: true });
const kib = (b) => `${(b / 1024).toFixed(1)} KiB`;
for (const [what, s] of Object.entries(sizes)) console.log(`bundle ${what}: ${s.gz} B gzipped (${kib(s.gz)}), ${kib(s.min)} minified`);

function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}
const key = { keyId: 1, suite: "x25519-hkdf-sha256-aes128gcm", publicKey: null, notBefore: 0, notAfter: null };
const kp = await crypto.subtle.generateKey({ name: "X25519" }, true, ["deriveBits"]);
key.publicKey = new Uint8Array(await crypto.subtle.exportKey("raw", kp.publicKey));
const params = new sdk.RapporParams({ k: 128, h: 2, m: 64, f: 0.5, p: 0.5, q: 0.75 });
const enc = new sdk.RapporEncoder(params, "home_page", crypto.getRandomValues(new Uint8Array(32)));
const report = enc.encode("example.com");
for (let i = 0; i < 200; i++) await sdk.sealReport(key, 20000, report); // warm-up
const seal = [];
for (let i = 0; i < n; i++) {
  const t0 = performance.now();
  await sdk.sealReport(key, 20000, report);
  seal.push(performance.now() - t0);
}
const encode = [];
for (let i = 0; i < n; i++) {
  const t0 = performance.now();
  enc.encode(`value ${i % 50}`);
  encode.push(performance.now() - t0);
}
console.log(`Node ${process.version}: seal median ${(median(seal) * 1000).toFixed(0)} us (p90 ${(seal.sort((a, b) => a - b)[Math.floor(n * 0.9)] * 1000).toFixed(0)} us) over ${n}; RAPPOR k=128 encode median ${(median(encode) * 1000).toFixed(0)} us`);
const out = { sizes, seal_median_ms: median(seal), encode_median_ms: median(encode) };

if (against) {
  const other = await import(new URL("dist/node.js", `file://${against.replace(/\/?$/, "/")}`));
  const builds = { this: sdk, against: other };
  const cpuPer = async (n, f) => {
    const c0 = process.cpuUsage();
    for (let i = 0; i < n; i++) await f(i);
    const c = process.cpuUsage(c0);
    return (c.user + c.system) / n; // µs
  };
  const encoders = Object.fromEntries(Object.entries(builds).map(([k, b]) => [k, new b.RapporEncoder(new b.RapporParams(params), "home_page", new Uint8Array(32).fill(7))]));
  const rounds = { seal: { this: [], against: [] }, encode: { this: [], against: [] } };
  for (let r = 0; r < 6; r++)
    for (const k of ["against", "this"]) {
      const seal = await cpuPer(1000, () => builds[k].sealReport(key, 20000, report));
      const encode = await cpuPer(3000, (i) => encoders[k].encode(`value ${i % 50}`));
      if (r > 0) rounds.seal[k].push(seal), rounds.encode[k].push(encode); // round 0: warm-up
    }
  const mid = (xs) => median(xs).toFixed(1);
  console.log(`CPU per call, median of 5 rounds: seal ${mid(rounds.seal.this)} us (against ${mid(rounds.seal.against)} us); RAPPOR k=128 encode ${mid(rounds.encode.this)} us (against ${mid(rounds.encode.against)} us)`);
  out.against = { seal_cpu_us: median(rounds.seal.this), seal_cpu_us_against: median(rounds.seal.against), encode_cpu_us: median(rounds.encode.this), encode_cpu_us_against: median(rounds.encode.against) };
}
console.log(JSON.stringify(out));
