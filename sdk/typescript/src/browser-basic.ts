/**
 * The browser entry point for an app whose metrics all use the basic mechanisms
 * (binary-rr, krr, oue, olh): the same reporter as `@crowdmix/client`, without the
 * other encoders (a metric of another encoding is refused as `unknown_metric`).
 */
import { basicEncoding } from "./basic.js";
import { type BrowserReporterOptions, openBrowserReporter } from "./browser.js";
import type { Reporter } from "./reporter.js";

export * from "./core.js";
export { type BrowserReporterOptions, IdbBackend } from "./browser.js";
export { BasicParams, type Mechanism } from "./params.js";
export { BasicEncoder, basicEncoding, olhHash } from "./basic.js";

/** `openReporter` of `@crowdmix/client`, reporting basic-mechanism metrics only. */
export function openReporter(options: BrowserReporterOptions): Promise<Reporter> {
  return openBrowserReporter(options, [basicEncoding]);
}
