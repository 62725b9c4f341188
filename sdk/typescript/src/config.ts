/**
 * What `GetConfig` serves a device, checked as `crowdmix.client.device_config.from_proto`:
 * each metric's params are rebuilt here (by the `Encoding` of its kind) and an answer whose
 * advertised fingerprint differs from the one the params give is refused (an SDK and a
 * server that would disagree byte for byte); so is an unknown protocol or a window shorter
 * than an hour. A metric of an encoding this build leaves out is kept without params.
 */
import { ParamsError } from "./errors.js";
import type { HeavyHittersParams, ServedRound } from "./discovery.js";
import type { BasicParams, HistogramParams, RapporParams } from "./params.js";
import { type WireConfig, type WireKey, type WireMetric, decodeConfigResponse } from "./proto.js";
import type { RandomBytes } from "./random.js";
import { PROTOCOL_VERSION, type Report } from "./report.js";

export const MIN_WINDOW_SECONDS = 3600;

/** A metric's params as an encoding reads them (none: an encoding this build leaves out). */
export interface MetricParams {
  readonly rappor?: RapporParams;
  readonly basic?: BasicParams;
  readonly histogram?: HistogramParams;
  readonly heavyHitters?: HeavyHittersParams;
  /** heavy hitters: the rounds served for the windows around the current one */
  readonly rounds?: readonly ServedRound[];
  readonly domain: readonly string[] | null;
  /** what the metric's reports are when they go sealed or not at all ("a shuffled histogram") */
  readonly sealedOnly?: string;
}

export interface MetricConfig extends MetricParams {
  readonly name: string;
  readonly encoding: string;
  readonly fingerprint: bigint;
  readonly reportBytes: number;
  readonly disposalSeconds: number;
}

/**
 * The window's reports of a value (`mc`: the metric in the config in use, whose served
 * rounds a heavy-hitters report needs). Throws `Refusal` for a report it must not make,
 * another error for a value it cannot encode.
 */
export type Encode = (value: string | number | Uint8Array, window: number, mc?: MetricConfig) => Report[] | Promise<Report[]>;

/**
 * A report an encoder must not make now: `status` is the reporter's (e.g. "no_round").
 * `refetchAfter`: a newer config may lift it, so one at least this many seconds old is
 * fetched again.
 */
export class Refusal extends Error {
  constructor(
    readonly status: "no_round" | "not_this_round" | "refused_by_ceiling",
    message: string,
    readonly refetchAfter?: number,
  ) {
    super(message);
  }
}

/** The device's privacy ceilings (`ReporterOptions`, defaults applied). */
export interface Ceilings {
  maxEpsilon: number;
  maxEpsilonInf: number;
  allowUnrandomizedHistograms: boolean;
}

/** A privacy figure of served params and the ceiling it must not pass: name, value, option, ceiling. */
export type Figure = readonly [string, number, keyof Ceilings, number];

/** Why one of `figures` is above its ceiling (a sentence naming both), or null. */
export function aboveCeiling(metric: string, figures: readonly Figure[]): string | null {
  for (const [name, value, knob, ceiling] of figures)
    if (!(value <= ceiling)) return `metric ${metric}: the served params give ${name} = ${value.toPrecision(6)}, above this device's ceiling ${knob} = ${ceiling}`;
  return null;
}

/**
 * One kind of encoding as the reporter uses it (`rapporEncoding`, `basicEncoding`,
 * `histogramEncoding`, `heavyHittersEncoding`): a build carries the ones its entry point
 * names, no others, and what is particular to a kind (its params message, its privacy
 * figures, its rounds) lives in its encoding.
 */
export interface Encoding {
  /** The served metric's params, validated, and their fingerprint; undefined: another kind. */
  read(m: WireMetric): [MetricParams, bigint] | undefined;
  /** The encoder of a metric of this kind (undefined: another kind); `maxEpsilon`: the device's ceiling on a served round's ε. */
  encoder(metric: string, mc: MetricConfig, secret: Uint8Array, rand: RandomBytes, maxEpsilon?: number): Encode | undefined;
  /** Why the served params of `mc` are above the device's ceilings, or null; undefined: another kind. */
  ceiling(metric: string, mc: MetricConfig, o: Ceilings): string | null | undefined;
}

/** The shuffler's default window_tolerance: what an answer without the field (one from
 * before it) is read as, never proto3's 0. */
export const DEFAULT_WINDOW_TOLERANCE = 1;

export interface DeviceConfig {
  readonly version: string;
  readonly cacheSeconds: number;
  readonly windowSeconds: number;
  /** the shuffler takes the current window and this many before it */
  readonly windowTolerance: number;
  readonly serverTime: number;
  readonly metrics: ReadonlyMap<string, MetricConfig>;
  readonly keys: readonly WireKey[];
}

/** The GetConfig answer (protobuf bytes) as a DeviceConfig; ParamsError when inconsistent. */
export function readConfig(answer: Uint8Array, encodings: readonly Encoding[]): DeviceConfig {
  let wire: WireConfig;
  try {
    wire = decodeConfigResponse(answer);
  } catch (e) {
    throw new ParamsError(`the config answer is not a ConfigResponse: ${(e as Error).message}`);
  }
  if (wire.protocol !== PROTOCOL_VERSION) throw new ParamsError(`unsupported protocol version ${wire.protocol}`);
  if (wire.windowSeconds < MIN_WINDOW_SECONDS)
    throw new ParamsError(`window_seconds ${wire.windowSeconds} is below ${MIN_WINDOW_SECONDS}`);
  const metrics = new Map<string, MetricConfig>();
  for (const m of wire.metrics) {
    const name = JSON.stringify(m.name);
    if (!m.rappor && !m.basic && !m.histogram && !m.heavyHitters) throw new ParamsError(`metric ${name}: the config carries no params`);
    let params: MetricParams = { domain: null };
    for (const e of encodings) {
      const got = e.read(m);
      if (!got) continue;
      if (got[1] !== m.fingerprint) throw new ParamsError(`metric ${name}: the served fingerprint is not that of the served params`);
      params = got[0];
    }
    const { encoding, fingerprint, reportBytes, disposalSeconds } = m;
    metrics.set(m.name, { name: m.name, encoding, fingerprint, reportBytes, disposalSeconds, ...params });
  }
  return { version: wire.version, cacheSeconds: wire.cacheSeconds, windowSeconds: wire.windowSeconds, windowTolerance: wire.windowTolerance ?? DEFAULT_WINDOW_TOLERANCE, serverTime: wire.serverTime, metrics, keys: wire.keys };
}
