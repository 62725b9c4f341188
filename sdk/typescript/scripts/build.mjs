// Build: esbuild bundles the ES modules (dist/index.js for browsers with every encoding,
// dist/browser-{rappor,basic,histogram,heavy-hitters}.js with one each, dist/node.js for Node;
// no runtime dependency), tsc checks the types and writes the .d.ts files, and
// dist/crowdmix.browser.js and dist/crowdmix.rappor.browser.js are the self-contained
// bundles a page can load as they are: bundled by esbuild, minified by terser (about 3 %
// smaller gzipped than esbuild's minifier; an app that bundles the package itself gets
// esbuild's or its own minifier's figure, BENCHMARKS.md has both).
import { execFileSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { build } from "esbuild";
import { minify } from "terser";

// the private members are named _x and shortened in the browser builds, an app's bundle too
const mangle = { mangleProps: /^_/ };
const common = { bundle: true, format: "esm", target: "es2022", sourcemap: false, logLevel: "warning", outdir: "dist" };
const browser = ["index", "browser-rappor", "browser-basic", "browser-histogram", "browser-heavy-hitters"];
await build({ ...common, entryPoints: browser.map((e) => `src/${e}.ts`), platform: "browser", ...mangle });
await build({ ...common, entryPoints: ["src/node.ts"], platform: "node" });
const pages = await build({
  ...common,
  entryPoints: [
    { in: "src/index.ts", out: "crowdmix.browser" },
    { in: "src/browser-rappor.ts", out: "crowdmix.rappor.browser" },
  ],
  platform: "browser",
  write: false,
  ...mangle,
});
for (const f of pages.outputFiles) {
  const { code } = await minify(f.text, { module: true, ecma: 2020, compress: { passes: 2 } });
  writeFileSync(f.path, code);
}
execFileSync(process.execPath, ["node_modules/typescript/bin/tsc", "-p", "."], { stdio: "inherit" });
