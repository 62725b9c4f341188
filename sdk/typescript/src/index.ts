/**
 * The browser entry point with every encoding (RAPPOR, the basic mechanisms, shuffled
 * histograms, heavy hitters). An app reporting one kind only imports
 * `@crowdmix/client/rappor`, `/basic`, `/histogram` or `/heavy-hitters` and ships that
 * encoder alone.
 */
import { type BrowserReporterOptions, openBrowserReporter } from "./browser.js";
import { ALL_ENCODINGS } from "./encodings.js";
import type { Reporter } from "./reporter.js";

export * from "./common.js";
export { type BrowserReporterOptions, IdbBackend } from "./browser.js";

/**
 * Open the app's outbox (IndexedDB database `name`, default "crowdmix") and start a
 * reporter that also sends on `pagehide` and when the page is hidden.
 */
export function openReporter(options: BrowserReporterOptions): Promise<Reporter> {
  return openBrowserReporter(options, ALL_ENCODINGS);
}
