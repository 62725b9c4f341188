/**
 * Heavy hitters on the device, as `crowdmix.client.discovery` bit for bit: each report is
 * one k-ary randomized response (ε-LDP for the value) against the round served for its
 * window, its index in REPORT_BYTES bytes little-endian under that round's fingerprint
 * (`roundFingerprint`: a shuffler or aggregator holding another round refuses it).
 * A device reports in one round of each discovery: round r with probability weights[r],
 * drawn by HMAC-SHA256 under its secret (`deviceRound`), so the rounds' groups are
 * disjoint. Without a round for the window nothing is made (`no_round`: the config is
 * fetched again, never guessed); in another round's window, `not_this_round`.
 * Draw order, which the golden vectors pin: a prefix round's seed, then the keep coin,
 * then the other bucket; a value round's keep coin, then the other index.
 */
import { type Encoding, Refusal } from "./config.js";
import { HEAVY_HITTERS, HeavyHittersParams, PrefixRound, REPORT_BYTES, type ServedRound, ValueRound, prefixBucket, prefixKey, roundFingerprint, roundParams, symbolKey } from "./discovery.js";
import { ParamsError } from "./errors.js";
import { type Field, fields } from "./proto.js";
import { type RandomBytes, flip, secureRandomBytes, uniformBelow } from "./random.js";
import { type Report, newReportId, utf8 } from "./report.js";

/** HeavyHittersConfig (protos/crowdmix.proto), as GetConfig serves it. */
export interface WireHeavyHitters {
  alphabet: string;
  maxLength: number;
  spans: number[];
  keep: number;
  candidates: number;
  seeds: number;
  weights: number[];
  epsilon: number;
  delta: number;
  devices: number;
  rounds: WireRound[];
}

export interface WireRound {
  round: number;
  window: number;
  opened: number;
  epsilon: number;
  start: number;
  stop: number;
  seeds: number;
  buckets: number;
  candidates: string[];
}

const utf8d = /* @__PURE__ */ new TextDecoder();
const f64 = (b: Uint8Array, at = 0): number => new DataView(b.buffer, b.byteOffset + at, 8).getFloat64(0, true);

/** A repeated uint32 or double field's values: packed (proto3's default) or one per field. */
function numbers(f: Field, double: boolean): number[] {
  if (f.wire !== 2) return [double ? f64(f.data) : Number(f.int)];
  const out: number[] = [];
  if (double) {
    if (f.data.length % 8) throw new RangeError("truncated packed doubles");
    for (let i = 0; i < f.data.length; i += 8) out.push(f64(f.data, i));
    return out;
  }
  let x = 0;
  let shift = 0;
  for (const b of f.data) {
    if (shift > 63) throw new RangeError("malformed protobuf varint");
    x += (b & 0x7f) * 2 ** shift;
    shift += 7;
    if (!(b & 0x80)) {
      out.push(x);
      x = shift = 0;
    }
  }
  if (shift) throw new RangeError("malformed protobuf varint");
  return out;
}

/** The served HeavyHittersConfig's bytes as a `WireHeavyHitters` (absent fields: proto3's defaults). */
export function decodeHeavyHitters(buf: Uint8Array): WireHeavyHitters {
  const c: WireHeavyHitters = { alphabet: "", maxLength: 0, spans: [], keep: 0, candidates: 0, seeds: 0, weights: [], epsilon: 0, delta: 0, devices: 0, rounds: [] };
  for (const f of fields(buf)) {
    if (f.n === 1) c.alphabet = utf8d.decode(f.data);
    else if (f.n === 2) c.maxLength = Number(f.int);
    else if (f.n === 3) c.spans.push(...numbers(f, false));
    else if (f.n === 4) c.keep = Number(f.int);
    else if (f.n === 5) c.candidates = Number(f.int);
    else if (f.n === 6) c.seeds = Number(f.int);
    else if (f.n === 7) c.weights.push(...numbers(f, true));
    else if (f.n === 8) c.epsilon = f64(f.data);
    else if (f.n === 9) c.delta = f64(f.data);
    else if (f.n === 10) c.devices = Number(f.int);
    else if (f.n === 11) {
      const r: WireRound = { round: 0, window: 0, opened: 0, epsilon: 0, start: 0, stop: 0, seeds: 0, buckets: 0, candidates: [] };
      for (const g of fields(f.data)) {
        const key = ([, "round", "window", "epsilon", "start", "stop", "seeds", "buckets", "candidates", "opened"] as const)[g.n];
        if (key === "candidates") r.candidates.push(utf8d.decode(g.data));
        else if (key === "epsilon") r.epsilon = f64(g.data);
        else if (key) r[key] = Number(g.int);
      }
      c.rounds.push(r);
    }
  }
  return c;
}

/**
 * The round of the discovery opened in window `opened` this device reports in: HMAC-SHA256
 * under the secret of "crowdmix/discovery-group/v1|metric|fingerprint (16 hex)|opened",
 * its first 8 bytes little-endian over 2^64, against the cumulative weights.
 */
export async function deviceRound(secret: Uint8Array, metric: string, fingerprint: bigint, opened: number, weights: readonly number[]): Promise<number> {
  const key = await crypto.subtle.importKey("raw", Uint8Array.from(secret), { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  const msg = utf8(`crowdmix/discovery-group/v1|${metric}|${fingerprint.toString(16).padStart(16, "0")}|${opened}`);
  const mac = new DataView(await crypto.subtle.sign("HMAC", key, Uint8Array.from(msg)));
  const u = Number(mac.getBigUint64(0, true)) / 2 ** 64;
  let acc = 0;
  for (let r = 0; r < weights.length; r++) {
    acc += weights[r]!;
    if (u < acc) return r;
  }
  return weights.length - 1;
}

/** One device's reports against one round (`PrefixRound` or `ValueRound`). */
export class RoundEncoder {
  private readonly _rand: RandomBytes;

  constructor(
    readonly round: PrefixRound | ValueRound,
    readonly metric: string,
    /** the round's fingerprint (`roundFingerprint`): the report is bound to its round */
    readonly fingerprint: bigint,
    opts: { randomBytes?: RandomBytes } = {},
  ) {
    if (!metric) throw new RangeError("metric must be a non-empty string");
    this._rand = opts.randomBytes ?? secureRandomBytes;
  }

  /** The report's index for `value`: s·g + y (a prefix round), or the randomized candidate position (C for none). */
  index(value: string): number {
    const r = this.round;
    const symbols = r.symbols.symbols(value);
    if (r instanceof ValueRound) return flip(this._rand, r.positions.get(symbolKey(symbols)) ?? r.cells - 1, r.cells, r.keepProbability);
    const [prefix, hi, lo] = r.split(symbols);
    const seed = uniformBelow(this._rand, r.seeds);
    const h = prefixBucket(seed, prefixKey(r.start, r.stop, hi, prefix), lo, r.buckets);
    return seed * r.buckets + flip(this._rand, h, r.buckets, r.keepProbability);
  }

  encode(value: string): Report {
    if (typeof value !== "string") throw new RangeError(`a heavy-hitters value is a string, got ${typeof value}`);
    const i = this.index(value);
    const bits = new Uint8Array(REPORT_BYTES);
    new DataView(bits.buffer).setUint32(0, i, true);
    return { metric: this.metric, cohort: 0, bits, fingerprint: this.fingerprint, reportId: newReportId(this._rand) };
  }
}

/** A report without its window's round fetches the config again, at most once per this many seconds of the config's age. */
export const ROUND_REFETCH_SECONDS = 10;

/** Heavy hitters for the reporter (`Encoding`): the round of the report's window, or a refusal. */
export const heavyHittersEncoding: Encoding = {
  read(m) {
    if (!m.heavyHitters || m.encoding !== HEAVY_HITTERS) return undefined;
    const w = decodeHeavyHitters(m.heavyHitters);
    const { alphabet, maxLength, spans, keep, candidates, seeds, weights, epsilon, delta, devices } = w;
    const heavyHitters = new HeavyHittersParams({ alphabet, maxLength, spans, keep, candidates, seeds, weights, epsilon, delta, devices });
    const fp = heavyHitters.fingerprint();
    const rounds: ServedRound[] = w.rounds.map((r) => {
      try {
        return { round: r.round, window: r.window, opened: r.opened, epsilon: r.epsilon, params: roundParams(heavyHitters, r), fingerprint: roundFingerprint(fp, r) };
      } catch (e) {
        throw new ParamsError(`metric ${JSON.stringify(m.name)}: served round ${r.round}: ${(e as Error).message}`);
      }
    });
    if (new Set(rounds.map((r) => r.window)).size !== rounds.length) throw new ParamsError(`metric ${JSON.stringify(m.name)}: two served rounds name one window`);
    return [{ heavyHitters, rounds, domain: null }, fp];
  },
  // a round's ε is checked against maxEpsilon when a report is encoded against it
  ceiling: (_metric, mc) => (mc.heavyHitters ? null : undefined),
  encoder(metric, mc, secret, rand, maxEpsilon = Infinity) {
    const hh = mc.heavyHitters;
    if (!hh) return undefined;
    const mine = new Map<number, Promise<number>>(); // per discovery (opened): this device's round
    let current: { window: number; enc: RoundEncoder } | null = null;
    return async (value, window, served = mc) => {
      const r = served.rounds?.find((x) => x.window === window);
      if (!r)
        throw new Refusal(
          "no_round",
          `metric ${metric}: no discovery round is served for window ${window} yet (nothing is made: a report is encoded only against its window's round)`,
          ROUND_REFETCH_SECONDS, // the round may have been written since
        );
      let round = mine.get(r.opened);
      if (round === undefined) mine.set(r.opened, (round = deviceRound(secret, metric, mc.fingerprint, r.opened, hh.o.weights)));
      const own = await round;
      if (own !== r.round)
        throw new Refusal("not_this_round", `metric ${metric}: this device reports in round ${own} of the discovery, not in round ${r.round} (window ${window}): each device is in one round`);
      if (!(r.epsilon <= maxEpsilon))
        throw new Refusal("refused_by_ceiling", `metric ${metric}: the served round gives ε = ${r.epsilon.toPrecision(6)}, above this device's ceiling maxEpsilon = ${maxEpsilon}`);
      if (typeof value !== "string") throw new RangeError(`a heavy-hitters value is a string, got ${typeof value}`);
      if (current?.window !== window || current.enc.round !== r.params) current = { window, enc: new RoundEncoder(r.params, metric, r.fingerprint, { randomBytes: rand }) };
      return [current.enc.encode(value)];
    };
  },
};
