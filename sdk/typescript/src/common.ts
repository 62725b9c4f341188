/** Everything the entry points with every encoding export (the browser's `index` and `node`). */
export * from "./core.js";
export * from "./parts.js";
export { BasicParams, HistogramParams, RapporParams, type Mechanism } from "./params.js";
export { epsilonInf, epsilonOne } from "./privacy.js";
export { RapporEncoder, bloomBits, cohortForSecret, rapporEncoding } from "./rappor.js";
export { BasicEncoder, basicEncoding, olhHash } from "./basic.js";
export { HistogramEncoder, histogramEncoding } from "./histogram.js";
export { HeavyHittersParams, PrefixRound, SymbolMap, ValueRound, expLower, keepProbabilityOf, mix64, nextPrime, prefixBucket, prefixKey, pyStrRepr, roundFingerprint, roundParams, type ServedRound } from "./discovery.js";
export { RoundEncoder, deviceRound, heavyHittersEncoding } from "./heavy.js";
export { ALL_ENCODINGS, parseConfig } from "./encodings.js";
export { blake2b } from "./blake2b.js";
export { mmh3Words } from "./mmh3.js";
