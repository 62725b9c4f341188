/**
 * The browser entry point for an app whose metrics are all RAPPOR: the same reporter as
 * `@crowdmix/client`, without the other encoders (a metric of another encoding is
 * refused as `unknown_metric`, naming its encoding).
 */
import { type BrowserReporterOptions, openBrowserReporter } from "./browser.js";
import { rapporEncoding } from "./rappor.js";
import type { Reporter } from "./reporter.js";

export * from "./core.js";
export { type BrowserReporterOptions, IdbBackend } from "./browser.js";
export { RapporParams } from "./params.js";
export { epsilonInf, epsilonOne } from "./privacy.js";
export { RapporEncoder, bloomBits, cohortForSecret, rapporEncoding } from "./rappor.js";

/** `openReporter` of `@crowdmix/client`, reporting RAPPOR metrics only. */
export function openReporter(options: BrowserReporterOptions): Promise<Reporter> {
  return openBrowserReporter(options, [rapporEncoding]);
}
