// The TypeScript SDK's footprint in Node 20 and in a browser bundle.
//
//   (cd sdk/typescript && npm ci && npm run build) && node bench/typescript_sdk.mjs
//
// - The browser bundle of report + sealing + outbox: esbuild (minify, tree-shaking) of an
//   entry that opens a reporter (IndexedDB outbox, every encoder, HPKE sealing, the
//   Connect transport), gzip -9; with @hpke/core alone for scale.
// - Seal: median time of one sealReport (HPKE X25519 + AES-128-GCM on WebCrypto) over
//   --n reports after a warm-up; RAPPOR encode and the whole send path's proto encoding too.
import { writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { gzipSync } from "node:zlib";
import { createRequire } from "node:module";

const SDK = new URL("../sdk/typescript/", import.meta.url);
const require = createRequire(SDK);
const esbuild = require("esbuild");
const sdk = await import(new URL("dist/node.js", SDK));
const n = Number(process.argv.find((a) => a.startsWith("--n="))?.slice(4) ?? 3000);

async function gzipped(source) {
  const entry = join(tmpdir(), `crowdmix-bench-${process.pid}-${Math.random().toString(36).slice(2)}.ts`);
  writeFileSync(entry, source);
  const r = await esbuild.build({ entryPoints: [entry], bundle: true, minify: true, format: "esm", platform: "browser", write: false, nodePaths: [new URL("node_modules", SDK).pathname] });
  const bytes = r.outputFiles[0].contents;
  return [bytes.length, gzipSync(bytes, { level: 9 }).length];
}
const src = new URL("src/", SDK).pathname;
const [fullRaw, fullGz] = await gzipped(`import { openReporter } from "${src}index.ts"; (globalThis as any).x = openReporter;`);
const [hpkeRaw, hpkeGz] = await gzipped(`import { sealReport } from "${src}sealed.ts"; (globalThis as any).x = sealReport;`);
console.log(`browser bundle (report + sealing + outbox): ${(fullGz / 1024).toFixed(1)} KiB gzipped (${(fullRaw / 1024).toFixed(1)} KiB minified); of it the HPKE seal with @hpke/core ${(hpkeGz / 1024).toFixed(1)} KiB gzipped`);

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
console.log(JSON.stringify({ bundle_gzip: fullGz, bundle_min: fullRaw, hpke_gzip: hpkeGz, seal_median_ms: median(seal), encode_median_ms: median(encode) }));
