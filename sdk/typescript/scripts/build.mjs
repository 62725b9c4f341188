// Build: esbuild bundles the ES modules (dist/index.js for browsers, dist/node.js for
// Node; @hpke/core stays an import), tsc checks the types and writes the .d.ts files,
// and dist/crowdmix.browser.js is the self-contained minified bundle the example page loads.
import { execFileSync } from "node:child_process";
import { build } from "esbuild";

const common = { bundle: true, format: "esm", target: "es2022", sourcemap: false, logLevel: "warning" };
await build({ ...common, entryPoints: ["src/index.ts"], outfile: "dist/index.js", platform: "browser", external: ["@hpke/core"] });
await build({ ...common, entryPoints: ["src/node.ts"], outfile: "dist/node.js", platform: "node", external: ["@hpke/core"] });
await build({ ...common, entryPoints: ["src/index.ts"], outfile: "dist/crowdmix.browser.js", platform: "browser", minify: true });
execFileSync(process.execPath, ["node_modules/typescript/bin/tsc", "-p", "."], { stdio: "inherit" });
