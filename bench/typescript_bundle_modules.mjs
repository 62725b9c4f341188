// Where the prebuilt RAPPOR bundle's bytes go, per module.
//
//   (cd sdk/typescript && npm ci) && node bench/typescript_bundle_modules.mjs [src/browser-rappor.ts]
//
// The entry is bundled as scripts/build.mjs makes dist/crowdmix.rappor.browser.js (browser,
// ESM, es2022, private members shortened) but minified by esbuild and with whitespace kept, so esbuild marks each module with
// a `// path` line; the bundle is split there, each slice minified and gzipped (-9) alone.
// "alone" sums above the whole (each slice pays for its own dictionary); "share" scales
// the slices to the whole bundle's gzip size. A dependency's modules count as one.
import { createRequire } from "node:module";
import { gzipSync } from "node:zlib";

const SDK = new URL("../sdk/typescript/", import.meta.url);
const { build, transform } = createRequire(SDK)("esbuild");
const entry = process.argv[2] ?? "src/browser-rappor.ts";
const base = {
  entryPoints: [new URL(entry, SDK).pathname],
  absWorkingDir: SDK.pathname,
  bundle: true,
  format: "esm",
  target: "es2022",
  platform: "browser",
  mangleProps: /^_/,
  write: false,
  logLevel: "error",
};
const whole = (await build({ ...base, minify: true })).outputFiles[0].contents;
const total = gzipSync(whole, { level: 9 }).length;
const text = (await build({ ...base, minifyIdentifiers: true, minifySyntax: true })).outputFiles[0].text;
const parts = text.split(/^\/\/ (\S+)\n/m);
const groups = {}; // the entry's slice holds the bundle's export list
for (let i = 1; i < parts.length; i += 2) {
  const g = parts[i].replace(/^src\/|^node_modules\/(@[^/]+|[^@][^/]*)\/.*$/g, "$1");
  groups[g] = (groups[g] ?? "") + parts[i + 1];
}
const rows = [];
for (const [g, code] of Object.entries(groups)) {
  const min = (await transform(code, { minifyWhitespace: true, format: "esm", logLevel: "silent" }).catch(() => ({ code }))).code;
  rows.push([g, min.length, gzipSync(min, { level: 9 }).length]);
}
const alone = rows.reduce((a, r) => a + r[2], 0);
console.log(`${entry}: ${whole.length} B minified, ${total} B gzip -9`);
for (const [g, min, gz] of rows.sort((a, b) => b[2] - a[2]))
  console.log(`${g.padEnd(20)} ${String(min).padStart(6)} B min ${String(gz).padStart(6)} B gzip alone ${String(Math.round((gz * total) / alone)).padStart(6)} B share`);
