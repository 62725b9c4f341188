/**
 * The SDK's parts, for tools and tests: the pure delivery policy, the outbox, config
 * reading, the steps of sealing. The entry points with every encoding (`index`, `node`)
 * export them; the one-encoding browser entries leave them out of an app's bundle.
 */
export { chooseKey, packPlaintext, reportInfo } from "./sealed.js";
export { hpkeSeal } from "./hpke.js";
export { Refusal, aboveCeiling, readConfig } from "./config.js";
export { CLOCK_SLACK, classify, decide, expired, nextGroup, restored, serverNow, windowOf, type Answer, type CachedConfig, type Decision, type Reading, type SendState } from "./policy.js";
export { MemoryBackend, Outbox, applyOp, type Backend, type Op, type OutboxState, type StoredRow } from "./outbox.js";
export { ceilingProblem } from "./reporter.js";
export { pyFloatRepr, indexBytes } from "./params.js";
