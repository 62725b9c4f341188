// Build: esbuild bundles the ES modules (dist/index.js for browsers with every encoding,
// dist/browser-{rappor,basic,histogram,heavy-hitters}.js with one each, dist/node.js for Node;
// no runtime dependency), tsc checks the types and writes the .d.ts files, and
// dist/crowdmix.browser.js and dist/crowdmix.rappor.browser.js are the self-contained
// minified bundles a page can load as they are.
import { execFileSync } from "node:child_process";
import { build } from "esbuild";

const common = { bundle: true, format: "esm", target: "es2022", sourcemap: false, logLevel: "warning", outdir: "dist" };
// the private members are named _x and shortened in the browser builds, an app's bundle too
const mangle = { mangleProps: /^_/ };
const browser = ["index", "browser-rappor", "browser-basic", "browser-histogram", "browser-heavy-hitters"];
await build({ ...common, entryPoints: browser.map((e) => `src/${e}.ts`), platform: "browser", ...mangle });
await build({ ...common, entryPoints: ["src/node.ts"], platform: "node" });
await build({
  ...common,
  entryPoints: [
    { in: "src/index.ts", out: "crowdmix.browser" },
    { in: "src/browser-rappor.ts", out: "crowdmix.rappor.browser" },
  ],
  platform: "browser",
  minify: true,
  ...mangle,
});
execFileSync(process.execPath, ["node_modules/typescript/bin/tsc", "-p", "."], { stdio: "inherit" });
