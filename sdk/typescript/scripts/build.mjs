// Build: esbuild bundles the ES modules (dist/index.js for browsers with every encoding,
// dist/browser-{rappor,basic,histogram,heavy-hitters}.js with one each, dist/node.js for Node;
// @hpke/core stays an import), tsc checks the types and writes the .d.ts files, and
// dist/crowdmix.browser.js and dist/crowdmix.rappor.browser.js are the self-contained
// minified bundles a page can load as they are.
import { execFileSync } from "node:child_process";
import { readFile } from "node:fs/promises";
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

/**
 * Three rewrites of @hpke's Deno-compiled (dnt) output, each the same program:
 * - a field declared as `Object.defineProperty(this, "f", { enumerable, configurable,
 *   writable: true, value })` (~90 bytes a field minified, 44 in the RAPPOR bundle) is
 *   written `this.f = value`: no class of @hpke has an accessor of a field's name (only
 *   getters `kem`, `kdf`, `aead`, whose fields are `_kem`, ...) and every field is
 *   writable, so the assignment makes the same own, enumerable, configurable, writable
 *   property. A value spanning lines is left as it is.
 * - `dntGlobalThis`, a Proxy merging globalThis with an empty object nothing ever adds
 *   to (only read: `.process`, `!== undefined`), is globalThis itself.
 * - tsc's `__classPrivateFieldGet`/`Set` helpers (a copy in each module with a private
 *   field), where every call is of a field ("f") kept in a WeakMap: what they do for
 *   that case alone (the same check and TypeError, then `get` / `set`).
 */
export const hpkeRewritten = {
  name: "hpke-rewritten",
  setup(b) {
    b.onLoad({ filter: /[\\/]@hpke[\\/].*\.js$/ }, async (a) => {
      if (/[\\/]_dnt\.shims\.js$/.test(a.path)) return { contents: "export const dntGlobalThis = globalThis;\n", loader: "js" };
      const source = await readFile(a.path, "utf8");
      const field = /Object\.defineProperty\(this, "(\w+)", \{\s*enumerable: true,\s*configurable: true,\s*writable: true,\s*value: (.*)\n\s*\}\);/g;
      return { contents: privateFields(source.replace(field, "this.$1 = $2;")), loader: "js" };
    });
  },
};

const PRIVATE_HELPERS = /var __classPrivateFieldGet = \(this && this\.__classPrivateFieldGet\) \|\| function \(receiver, state, kind, f\) \{\n[\s\S]*?\n\};\nvar __classPrivateFieldSet = \(this && this\.__classPrivateFieldSet\) \|\| function \(receiver, state, value, kind, f\) \{\n[\s\S]*?\n\};\n/;
const FIELD_HELPERS = `var __classPrivateFieldGet = (receiver, state) => {
    if (!state.has(receiver)) throw new TypeError("Cannot read private member from an object whose class did not declare it");
    return state.get(receiver);
};
var __classPrivateFieldSet = (receiver, state, value) => {
    if (!state.has(receiver)) throw new TypeError("Cannot write private member to an object whose class did not declare it");
    return state.set(receiver, value), value;
};
`;

/** The helpers of `source` cut to the field case, when each call in it is that case. */
function privateFields(source) {
  const m = PRIVATE_HELPERS.exec(source);
  if (!m) return source;
  const rest = source.slice(0, m.index) + source.slice(m.index + m[0].length);
  const calls = rest.match(/__classPrivateField[GS]et\(this, _\w+, /g) ?? [];
  const fieldCalls = rest.match(/, "f"\)/g) ?? [];
  const states = calls.map((c) => c.slice(c.indexOf("this, ") + 6, -2));
  const weak = states.every((n) => rest.includes(`\n${n} = new WeakMap();`));
  const all = (rest.match(/__classPrivateField[GS]et\(/g) ?? []).length;
  return all === calls.length && calls.length === fieldCalls.length && weak ? source.replace(m[0], FIELD_HELPERS) : source;
}

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
    plugins: [hpkeSideEffectFree, hpkeRewritten],
  });
  execFileSync(process.execPath, ["node_modules/typescript/bin/tsc", "-p", "."], { stdio: "inherit" });
}
