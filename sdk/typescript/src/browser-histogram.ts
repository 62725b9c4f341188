/**
 * The browser entry point for an app whose metrics are all shuffled histograms: the same
 * reporter as `@crowdmix/client`, without the other encoders (a metric of another
 * encoding is refused as `unknown_metric`).
 */
import { type BrowserReporterOptions, openBrowserReporter } from "./browser.js";
import { histogramEncoding } from "./histogram.js";
import type { Reporter } from "./reporter.js";

export * from "./core.js";
export { type BrowserReporterOptions, IdbBackend } from "./browser.js";
export { HistogramParams } from "./params.js";
export { HistogramEncoder, histogramEncoding } from "./histogram.js";

/** `openReporter` of `@crowdmix/client`, reporting shuffled-histogram metrics only. */
export function openReporter(options: BrowserReporterOptions): Promise<Reporter> {
  return openBrowserReporter(options, [histogramEncoding]);
}
