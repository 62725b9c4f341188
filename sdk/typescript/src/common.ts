/** Everything both entry points export (the browser's `index` and `node`). */
export { CrowdmixError, ParamsError } from "./errors.js";
export { BasicParams, HistogramParams, RapporParams, pyFloatRepr, indexBytes, type Mechanism } from "./params.js";
export { epsilonInf, epsilonOne } from "./privacy.js";
export { RapporEncoder, bloomBits, cohortForSecret } from "./rappor.js";
export { BasicEncoder, olhHash } from "./basic.js";
export { HistogramEncoder } from "./histogram.js";
export { type Report, toHex, fromHex } from "./report.js";
export { PROTOCOL_VERSION, chooseKey, packPlaintext, reportInfo, sealReport } from "./sealed.js";
export { type DeviceConfig, type MetricConfig, parseConfig } from "./config.js";
export { CLOCK_SLACK, classify, decide, expired, nextGroup, restored, serverNow, windowOf, type Answer, type CachedConfig, type Decision, type Reading, type SendState } from "./policy.js";
export { MemoryBackend, Outbox, applyOp, type Backend, type Op, type OutboxState, type StoredRow } from "./outbox.js";
export { Reporter, ceilingProblem, type ReportStatus, type ReporterOptions } from "./reporter.js";
export { type RandomBytes, secureRandomBytes } from "./random.js";
export { blake2b } from "./blake2b.js";
export { mmh3Words } from "./mmh3.js";
