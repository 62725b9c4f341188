/** What every entry point exports, whichever encodings it carries. */
export { CrowdmixError, ParamsError } from "./errors.js";
export { PROTOCOL_VERSION, type Report, toHex, fromHex } from "./report.js";
export { chooseKey, packPlaintext, reportInfo, sealReport } from "./sealed.js";
export { hpkeSeal } from "./hpke.js";
export { type DeviceConfig, type Encode, type Encoding, Refusal, type MetricConfig, type MetricParams, readConfig } from "./config.js";
export { CLOCK_SLACK, classify, decide, expired, nextGroup, restored, serverNow, windowOf, type Answer, type CachedConfig, type Decision, type Reading, type SendState } from "./policy.js";
export { MemoryBackend, Outbox, applyOp, type Backend, type Op, type OutboxState, type StoredRow } from "./outbox.js";
export { Reporter, ceilingProblem, type ReportStatus, type ReporterOptions } from "./reporter.js";
export { type RandomBytes, secureRandomBytes } from "./random.js";
export { pyFloatRepr, indexBytes } from "./params.js";
