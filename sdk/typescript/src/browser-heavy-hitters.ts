/**
 * The browser entry point for an app whose metrics are all heavy hitters without a
 * candidate list (`crowdmix discover`): the same reporter as `@crowdmix/client`, without
 * the other encoders (a metric of another encoding is refused as `unknown_metric`).
 */
import { type BrowserReporterOptions, openBrowserReporter } from "./browser.js";
import { heavyHittersEncoding } from "./heavy.js";
import type { Reporter } from "./reporter.js";

export * from "./core.js";
export { type BrowserReporterOptions, IdbBackend } from "./browser.js";
export { HeavyHittersParams, PrefixRound, SymbolMap, ValueRound, type ServedRound } from "./discovery.js";
export { RoundEncoder, deviceRound, heavyHittersEncoding } from "./heavy.js";

/** `openReporter` of `@crowdmix/client`, reporting heavy-hitters metrics only. */
export function openReporter(options: BrowserReporterOptions): Promise<Reporter> {
  return openBrowserReporter(options, [heavyHittersEncoding]);
}
