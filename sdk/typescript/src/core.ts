/** What every entry point exports, whichever encodings it carries: what an app uses. */
export { CrowdmixError, ParamsError } from "./errors.js";
export { PROTOCOL_VERSION, type Report, toHex, fromHex } from "./report.js";
export { sealReport } from "./sealed.js";
export type { Ceilings, DeviceConfig, Encode, Encoding, Figure, MetricConfig, MetricParams } from "./config.js";
export { Reporter, type ReportStatus, type ReporterOptions } from "./reporter.js";
export { type RandomBytes, secureRandomBytes } from "./random.js";
