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

/** A report an encoder must not make now: `status` is the reporter's (e.g. "no_round"). */
export class Refusal extends Error {
  constructor(
    readonly status: "no_round" | "not_this_round" | "refused_by_ceiling",
    message: string,
  ) {
    super(message);
  }
}

/**
 * One kind of encoding as the reporter uses it (`rapporEncoding`, `basicEncoding`,
 * `histogramEncoding`, `heavyHittersEncoding`): a build carries the ones its entry point
 * names, no others.
 */
export interface Encoding {
  /** The served metric's params, validated, and their fingerprint; undefined: another kind. */
  read(m: WireMetric): [MetricParams, bigint] | undefined;
  /** The encoder of a metric of this kind (undefined: another kind); `maxEpsilon`: the device's ceiling on a served round's ε. */
  encoder(metric: string, mc: MetricConfig, secret: Uint8Array, rand: RandomBytes, maxEpsilon?: number): Encode | undefined;
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
    throw new ParamsError(`window_seconds ${wire.windowSeconds} is below the shortest collection window (${MIN_WINDOW_SECONDS} s)`);
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
