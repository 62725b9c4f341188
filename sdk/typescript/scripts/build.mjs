// Build: esbuild bundles the ES modules (dist/index.js for browsers with every encoding,
// dist/browser-{rappor,basic,histogram,heavy-hitters}.js with one each, dist/node.js for Node;
// @hpke/core stays an import), tsc checks the types and writes the .d.ts files, and
// dist/crowdmix.browser.js and dist/crowdmix.rappor.browser.js are the self-contained
// minified bundles a page can load as they are.
import { execFileSync } from "node:child_process";
import { build } from "esbuild";

/**
 * @hpke/core and @hpke/common say `"sideEffects": false`, but their esm/ folders hold a
 * package.json of their own without it, which a bundler takes as theirs: their unused
 * modules (pure-JS HMAC, SHA-3, curves: 1.6 KB gzipped) would stay in the bundle.
 */
export const hpkeSideEffectFree = {
  name: "hpke-side-effect-free",
  setup(b) {
    b.onResolve({ filter: /.*/ }, async (a) => {
      if (a.pluginData === "inner" || !/@hpke|\.js$/.test(a.path)) return undefined;
      const r = await b.resolve(a.path, { resolveDir: a.resolveDir, kind: a.kind, importer: a.importer, pluginData: "inner" });
      return !r.errors.length && /[\\/]@hpke[\\/]/.test(r.path) ? { path: r.path, sideEffects: false } : undefined;
    });
  },
};

const common = { bundle: true, format: "esm", target: "es2022", sourcemap: false, logLevel: "warning", outdir: "dist" };
if (import.meta.url === `file://${process.argv[1]}`) {
  const browser = ["index", "browser-rappor", "browser-basic", "browser-histogram", "browser-heavy-hitters"];
  await build({ ...common, entryPoints: browser.map((e) => `src/${e}.ts`), platform: "browser", external: ["@hpke/core"] });
  await build({ ...common, entryPoints: ["src/node.ts"], platform: "node", external: ["@hpke/core"] });
  await build({
    ...common,
    entryPoints: [
      { in: "src/index.ts", out: "crowdmix.browser" },
      { in: "src/browser-rappor.ts", out: "crowdmix.rappor.browser" },
    ],
    platform: "browser",
    minify: true,
    plugins: [hpkeSideEffectFree],
  });
  execFileSync(process.execPath, ["node_modules/typescript/bin/tsc", "-p", "."], { stdio: "inherit" });
}
