/**
 * Heavy hitters without a candidate list: the params of a metric and of its rounds, and
 * the prefix hash, as `crowdmix.core.discovery` bit for bit (the encoders: heavy.ts).
 *
 * A value is `maxLength + 1` symbols over the alphabet (a character outside it is OTHER,
 * then END pads; the last position is OTHER for a longer value); characters are Unicode
 * code points, as Python's. A prefix round extends prefixes `[0, start)` by symbols
 * `[start, stop)`: with the extension e = hi·g + lo, key = BLAKE2b-64(tag, start, stop,
 * hi, prefix) and a seed s uniform in [0, S), h = (H_s(key) + m_s·lo) mod g (g prime;
 * H_s, m_s from SplitMix64 of s); the report is k-RR of h over g buckets (optimised local
 * hashing, Wang et al., USENIX Security 2017), index s·g + y. The value round: k-RR over
 * the candidates and "none of these". Its keep probability is the largest float at most
 * L/(L + n − 1), L an integer lower bound on e^ε (`keepProbabilityOf`), so the ε a device
 * realises never exceeds the round's. docs/design.md, "Core", has the hash in full.
 */
import { blake2bOf } from "./blake2b.js";
import { ParamsError } from "./errors.js";
import { fingerprintOf, indexBytes, pyFloatRepr, roundHalfEven } from "./params.js";
import { leBigInt, utf8 } from "./report.js";

export const HEAVY_HITTERS = "heavy-hitters";
/** Most index values one round's report may take (S·g or C + 1). */
export const MAX_CELLS = 1 << 24;
/** Every round's report: the index in this many bytes, little-endian. */
export const REPORT_BYTES = /* @__PURE__ */ indexBytes(MAX_CELLS);
const MAX_ALPHABET = 254;
const MAX_LENGTH = 64;
const MAX_EXTENSIONS = 1 << 20;
const MAX_EPSILON = 20;
/** The smallest round ε: from it up a round's keep is ≥ 1/n (`keepProbabilityOf`). */
const MIN_EPSILON = 2 ** -48;
const MASK = (1n << 64n) - 1n;
const KEY_TAG = /* @__PURE__ */ utf8("crowdmix/discovery/v1\0");
const SEED_SALTS = [0x9e3779b97f4a7c15n, 0x3c6ef372fe94f82an, 0xdaa66d2c7ddf743fn] as const;

/** Python's `repr(str)`: the quote it picks, its escapes, non-printable code points as \x, \u, \U. */
export function pyStrRepr(s: string): string {
  const quote = s.includes("'") && !s.includes('"') ? '"' : "'";
  let out = quote;
  for (const c of s) {
    const cp = c.codePointAt(0)!;
    if (c === quote || c === "\\") out += `\\${c}`;
    else if (c === "\t") out += "\\t";
    else if (c === "\n") out += "\\n";
    else if (c === "\r") out += "\\r";
    else if (cp < 0x20 || cp === 0x7f) out += `\\x${cp.toString(16).padStart(2, "0")}`;
    else if (cp < 0x7f || (cp !== 0x20 && !NON_PRINTABLE.test(c))) out += c;
    else if (cp <= 0xff) out += `\\x${cp.toString(16).padStart(2, "0")}`;
    else if (cp <= 0xffff) out += `\\u${cp.toString(16).padStart(4, "0")}`;
    else out += `\\U${cp.toString(16).padStart(8, "0")}`;
  }
  return out + quote;
}
// str.isprintable() is false for these categories (and the space is printable)
const NON_PRINTABLE = /^[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}\p{Zs}]$/u;

/** SplitMix64's finaliser (Steele, Lea, Flood 2014): a bijection of 64-bit words. */
export function mix64(x: bigint): bigint {
  let z = x & MASK;
  z ^= z >> 30n;
  z = (z * 0xbf58476d1ce4e5b9n) & MASK;
  z ^= z >> 27n;
  z = (z * 0x94d049bb133111ebn) & MASK;
  return z ^ (z >> 31n);
}

/** The smallest prime ≥ max(n, 2), by trial division (n is at most ~2^24 here). */
export function nextPrime(n: number): number {
  for (let p = Math.max(2, n); ; p++) {
    if (p < 4) return p;
    if (p % 2 === 0) continue;
    let prime = true;
    for (let d = 3; d * d <= p; d += 2)
      if (p % d === 0) {
        prime = false;
        break;
      }
    if (prime) return p;
  }
}

/** BLAKE2b-64 (little-endian) of the round's span, the extension's high part and the prefix. */
export function prefixKey(start: number, stop: number, hi: number, prefix: Uint8Array): bigint {
  const data = new Uint8Array(KEY_TAG.length + 6 + prefix.length);
  data.set(KEY_TAG);
  const at = KEY_TAG.length;
  data[at] = start;
  data[at + 1] = stop;
  new DataView(data.buffer).setUint32(at + 2, hi, true);
  data.set(prefix, at + 6);
  return leBigInt(blake2bOf(data, 8));
}

/** h = (H_s(key) + m_s·lo) mod g; H_s reduces the high 32 bits of a multiply-add by multiplication. */
export function prefixBucket(seed: number, key: bigint, lo: number, buckets: number): number {
  const s = BigInt(seed);
  const g = BigInt(buckets);
  const a = mix64(s ^ SEED_SALTS[0]) | 1n;
  const b = mix64(s ^ SEED_SALTS[1]);
  const m = 1n + (mix64(s ^ SEED_SALTS[2]) % (g - 1n));
  const base = ((((a * key + b) & MASK) >> 32n) * g) >> 32n;
  return Number((base + m * BigInt(lo)) % g);
}

const EXP_BITS = 256n;
const bits64 = /* @__PURE__ */ new DataView(new ArrayBuffer(8));

/**
 * An integer L ≤ e^ε·2^256, as `crowdmix.core.discovery.exp_lower`: the Taylor series at
 * x = ⌊ε·2^256⌋/2^256, each term rounded down from the one before (integers only).
 * ε must be in (0, 20].
 */
export function expLower(epsilon: number): bigint {
  if (typeof epsilon !== "number" || !(epsilon > 0 && epsilon <= MAX_EPSILON)) throw new ParamsError(`epsilon must be in (0, ${MAX_EPSILON}], got ${String(epsilon)}`);
  bits64.setFloat64(0, epsilon);
  const raw = bits64.getBigUint64(0);
  const biased = Number((raw >> 52n) & 0x7ffn);
  const frac = raw & ((1n << 52n) - 1n);
  const mant = biased ? frac | (1n << 52n) : frac;
  const shift = BigInt((biased || 1) - 1075) + EXP_BITS; // ε = mant·2^(shift − 256)
  const x = shift >= 0n ? mant << shift : mant >> -shift;
  let term = 1n << EXP_BITS;
  let total = term;
  for (let k = 1n; term; k++) {
    term = ((term * x) >> EXP_BITS) / k;
    total += term;
  }
  return total;
}

/** The largest float ≤ a/b for 2^-1000 < a/b < 1: m·2^-s with 2^52 ≤ m < 2^53, built from its bits. */
function floatAtMost(a: bigint, b: bigint): number {
  let s = 53 + b.toString(2).length - a.toString(2).length;
  let m = (a << BigInt(s)) / b;
  if (m >> 53n) m = (a << BigInt(--s)) / b;
  bits64.setBigUint64(0, (BigInt(1075 - s) << 52n) | (m - (1n << 52n)));
  return bits64.getFloat64(0);
}

/**
 * A round's keep probability over n values, as `crowdmix.core.discovery.keep_probability`:
 * the largest float ≤ L/(L + (n−1)·2^256), L = expLower(ε); at most e^ε/(e^ε + n − 1), and at
 * least 1/n when ε ≥ 2^-48 (what a round requires; the proof is Python's).
 */
export function keepProbabilityOf(epsilon: number, n: number): number {
  if (!Number.isSafeInteger(n) || n < 2) throw new ParamsError(`n must be an integer >= 2, got ${String(n)}`);
  const a = expLower(epsilon);
  return floatAtMost(a, a + (BigInt(n - 1) << EXP_BITS));
}

function checkInt(name: string, v: unknown, lo = 0): number {
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < lo) throw new ParamsError(`${name} must be an integer >= ${lo}, got ${String(v)}`);
  return v;
}

function checkEpsilon(v: unknown): number {
  if (typeof v !== "number" || !Number.isFinite(v) || !(v >= MIN_EPSILON && v <= MAX_EPSILON))
    throw new ParamsError(`epsilon must be a finite number in [2^-48, ${MAX_EPSILON}] (below it the keep probability cannot stay at least 1/n), got ${String(v)}`);
  return v;
}

/** `base ** k` as long as it stays at most `cap`, else `cap + 1`. */
function powCapped(base: number, k: number, cap: number): number {
  let x = 1;
  for (let i = 0; i < k && x <= cap; i++) x *= base;
  return Math.min(x, cap + 1);
}

/** Characters → symbols: the alphabet's characters 0..a−1, OTHER = a, END = a + 1. */
export class SymbolMap {
  private readonly _index: ReadonlyMap<string, number>;
  readonly other: number;
  readonly end: number;
  /** A: the number of symbols (alphabet, OTHER, END). */
  readonly size: number;
  /** Symbols per value: maxLength + 1. */
  readonly length: number;

  constructor(
    readonly alphabet: string,
    readonly maxLength: number,
  ) {
    const chars = typeof alphabet === "string" ? Array.from(alphabet) : [];
    if (chars.length < 1 || chars.length > MAX_ALPHABET) throw new ParamsError(`alphabet must be 1 to ${MAX_ALPHABET} characters, got ${JSON.stringify(alphabet)}`);
    this._index = new Map(chars.map((c, i) => [c, i]));
    if (this._index.size !== chars.length) throw new ParamsError(`alphabet characters must be distinct, got ${JSON.stringify(alphabet)}`);
    checkInt("max_length", maxLength, 1);
    if (maxLength > MAX_LENGTH) throw new ParamsError(`max_length must be an integer in [1, ${MAX_LENGTH}], got ${maxLength}`);
    this.other = chars.length;
    this.end = chars.length + 1;
    this.size = chars.length + 2;
    this.length = maxLength + 1;
  }

  /** The value's maxLength + 1 symbols, one byte each. */
  symbols(value: string): Uint8Array {
    const chars = Array.from(value);
    const out = new Uint8Array(this.length).fill(chars.length <= this.maxLength ? this.end : this.other);
    for (let i = 0; i < Math.min(chars.length, this.maxLength); i++) out[i] = this._index.get(chars[i]!) ?? this.other;
    return out;
  }
}

/** A discovery round: extend prefixes [0, start) by symbols [start, stop). */
export class PrefixRound {
  readonly epsilon: number;
  readonly buckets: number;
  /** P(y = h): e^ε/(e^ε + g − 1) rounded toward the smaller ε (`keepProbabilityOf`). */
  readonly keepProbability: number;

  constructor(
    readonly symbols: SymbolMap,
    readonly start: number,
    readonly stop: number,
    epsilon: number,
    readonly seeds: number,
    buckets = 0,
  ) {
    this.epsilon = checkEpsilon(epsilon);
    for (const [name, v] of [["start", start], ["stop", stop], ["seeds", seeds], ["buckets", buckets]] as const) checkInt(name, v);
    const L = symbols.length;
    if (!(start < stop && stop <= L)) throw new ParamsError(`need 0 <= start < stop <= ${L} (max_length + 1), got ${start}, ${stop}`);
    if (powCapped(symbols.size, stop - start, MAX_EXTENSIONS) > MAX_EXTENSIONS)
      throw new ParamsError(`a round of ${stop - start} symbols over ${symbols.size} has more than ${MAX_EXTENSIONS} extensions: use shorter rounds`);
    const g = buckets === 0 ? nextPrime(roundHalfEven(Math.exp(this.epsilon)) + 1) : buckets;
    if (g < 3 || g !== nextPrime(g)) throw new ParamsError(`buckets must be a prime >= 3, got ${g}`);
    if (seeds < 1 || seeds * g > MAX_CELLS)
      throw new ParamsError(`seeds must be in [1, ${Math.floor(MAX_CELLS / g)}] (seeds x buckets <= ${MAX_CELLS}), got ${seeds}`);
    this.buckets = g;
    this.keepProbability = keepProbabilityOf(this.epsilon, g);
    Object.freeze(this);
  }

  /** S·g: the index values a report may take. */
  get cells(): number {
    return this.seeds * this.buckets;
  }

  /** (prefix, hi, lo) of a value's symbols for this round. */
  split(symbols: Uint8Array): [Uint8Array, number, number] {
    let e = 0;
    for (let i = this.start; i < this.stop; i++) e = e * this.symbols.size + symbols[i]!;
    return [symbols.subarray(0, this.start), Math.floor(e / this.buckets), e % this.buckets];
  }
}

/** An estimation round: k-RR over the candidates and one "none of these" index. */
export class ValueRound {
  readonly epsilon: number;
  /** P(report the true index): e^ε/(e^ε + C) rounded toward the smaller ε (`keepProbabilityOf`). */
  readonly keepProbability: number;
  /** candidate symbols (hex) → position */
  readonly positions: ReadonlyMap<string, number>;

  constructor(
    readonly symbols: SymbolMap,
    epsilon: number,
    readonly candidates: readonly string[],
  ) {
    this.epsilon = checkEpsilon(epsilon);
    if (!candidates.length || candidates.length >= MAX_CELLS) throw new ParamsError(`candidates must hold 1 to ${MAX_CELLS - 1} values, got ${candidates.length}`);
    this.positions = new Map(candidates.map((v, i) => [symbolKey(symbols.symbols(v)), i]));
    if (this.positions.size !== candidates.length) throw new ParamsError("candidates must be distinct after mapping to symbols");
    this.keepProbability = keepProbabilityOf(this.epsilon, candidates.length + 1);
    Object.freeze(this);
  }

  /** C + 1: every candidate and "none". */
  get cells(): number {
    return this.candidates.length + 1;
  }

}

export const symbolKey = (s: Uint8Array): string => String.fromCharCode(...s);

/** A heavy-hitters metric as the registry states it: the plan and the central target. */
export class HeavyHittersParams {
  readonly symbols: SymbolMap;

  constructor(
    readonly o: {
      alphabet: string;
      maxLength: number;
      spans: readonly number[];
      keep: number;
      candidates: number;
      seeds: number;
      weights: readonly number[];
      epsilon: number;
      delta: number;
      devices: number;
    },
  ) {
    const sm = (this.symbols = new SymbolMap(o.alphabet, o.maxLength));
    const { spans, weights: w } = o;
    if (!spans.length) throw new ParamsError("spans must be a non-empty list of integers");
    spans.forEach((s, i) => {
      if (checkInt("each span", s, 1) <= (i ? spans[i - 1]! : 0)) throw new ParamsError(`spans must be increasing, got [${spans.join(", ")}]`);
      const from = i ? spans[i - 1]! : 0;
      if (powCapped(sm.size, s - from, MAX_EXTENSIONS) > MAX_EXTENSIONS)
        throw new ParamsError(`spans ${from} -> ${s}: more than ${MAX_EXTENSIONS} extensions: use shorter rounds`);
    });
    if (spans[spans.length - 1] !== sm.length) throw new ParamsError(`the last span must be ${sm.length} (max_length + 1), got ${spans[spans.length - 1]}`);
    for (const k of ["keep", "candidates", "seeds", "devices"] as const) checkInt(k, o[k], 1);
    if (o.candidates >= MAX_CELLS || o.seeds * 3 > MAX_CELLS) throw new ParamsError(`candidates and seeds x 3 must stay below ${MAX_CELLS}`);
    if (w.length !== spans.length + 1) throw new ParamsError(`weights needs ${spans.length + 1} shares (one per round), got ${w.length}`);
    const sum = w.reduce((a, b) => a + b, 0);
    if (w.some((x) => !(x > 0)) || !(Math.abs(sum - 1) <= 1e-9)) throw new ParamsError(`weights must be positive and sum to 1, got [${w.join(", ")}]`);
    if (!(o.epsilon > 0 && Number.isFinite(o.epsilon))) throw new ParamsError(`epsilon must be a positive number, got ${o.epsilon}`);
    if (!(o.delta > 0 && o.delta < 1)) throw new ParamsError(`delta must be in (0, 1), got ${o.delta}`);
    if (o.devices < spans.length + 1) throw new ParamsError(`devices must be at least ${spans.length + 1} (one per round)`);
    Object.freeze(this);
  }

  get reportBytes(): number {
    return REPORT_BYTES;
  }

  fingerprint(): bigint {
    const { o } = this;
    const r = pyFloatRepr;
    return fingerprintOf(
      `${HEAVY_HITTERS}/metric/v1;alphabet=${pyStrRepr(o.alphabet)};max_length=${o.maxLength};` +
        `spans=[${o.spans.join(", ")}];keep=${o.keep};candidates=${o.candidates};` +
        `seeds=${o.seeds};weights=[${o.weights.map((x) => `'${r(x)}'`).join(", ")}];` +
        `epsilon=${r(o.epsilon)};delta=${r(o.delta)};devices=${o.devices}`,
    );
  }
}

/** One round as GetConfig serves it, with its params checked against the metric's plan. */
export interface ServedRound {
  readonly round: number;
  readonly window: number;
  /** round 0's window: names the discovery */
  readonly opened: number;
  readonly epsilon: number;
  readonly params: PrefixRound | ValueRound;
  /** what its reports carry instead of the metric's fingerprint (`roundFingerprint`) */
  readonly fingerprint: bigint;
}

const ROUND_TAG = /* @__PURE__ */ utf8("crowdmix/round/v1\0");

/**
 * A round's fingerprint, as `crowdmix.core.rounds.ServedRound.fingerprint`: BLAKE2b-64
 * (little-endian) of "crowdmix/round/v1\0" ‖ the metric's fingerprint (u64) ‖ round,
 * window, opened (u32) ‖ ε (f64) ‖ start, stop, seeds, buckets, the number of candidates
 * (u32) ‖ each candidate's UTF-8 length (u32) and bytes; little-endian, fields as served.
 */
export function roundFingerprint(
  metricFingerprint: bigint,
  r: { round: number; window: number; opened: number; epsilon: number; start: number; stop: number; seeds: number; buckets: number; candidates: readonly string[] },
): bigint {
  const cands = r.candidates.map(utf8);
  const data = new Uint8Array(ROUND_TAG.length + 8 + 40 + cands.reduce((n, c) => n + 4 + c.length, 0));
  const view = new DataView(data.buffer);
  data.set(ROUND_TAG);
  let at = ROUND_TAG.length;
  view.setBigUint64(at, metricFingerprint, true);
  at += 8;
  const u32 = (x: number): void => {
    view.setUint32(at, x, true);
    at += 4;
  };
  u32(r.round);
  u32(r.window);
  u32(r.opened);
  view.setFloat64(at, r.epsilon, true);
  at += 8;
  for (const x of [r.start, r.stop, r.seeds, r.buckets, cands.length]) u32(x);
  for (const c of cands) {
    u32(c.length);
    data.set(c, at);
    at += c.length;
  }
  return leBigInt(blake2bOf(data, 8));
}

/** The round's params for `metric` (`crowdmix.core.rounds.ServedRound.params`); ParamsError when they do not fit. */
export function roundParams(
  metric: HeavyHittersParams,
  r: { round: number; epsilon: number; start: number; stop: number; seeds: number; buckets: number; candidates: readonly string[] },
): PrefixRound | ValueRound {
  const spans = metric.o.spans;
  if (r.candidates.length) {
    if (r.round !== spans.length) throw new ParamsError(`round ${r.round} is not the value round`);
    return new ValueRound(metric.symbols, r.epsilon, r.candidates);
  }
  if (!(r.round < spans.length) || r.start !== (r.round ? spans[r.round - 1] : 0) || r.stop !== spans[r.round])
    throw new ParamsError(`round ${r.round} does not extend prefixes from ${r.start} to ${r.stop}`);
  return new PrefixRound(metric.symbols, r.start, r.stop, r.epsilon, r.seeds, r.buckets);
}
