/**
 * Basic LDP mechanisms for small known domains (Wang, Blocki, Li, Jha, USENIX Security
 * 2017), payloads byte for byte as `crowdmix.client.basic` (little-endian):
 *
 * - binary-rr: 1 byte, bit 0 the answer, kept w.p. e^ε/(e^ε+1).
 * - krr: the index in indexBytes(d) bytes; true w.p. e^ε/(e^ε+d-1), else one of the others.
 * - oue: d bits; the true bit set w.p. 1/2, every other w.p. 1/(e^ε+1).
 * - olh: a (4 B), b (4 B), y (indexBytes(g) B), H(x) = ((a·x + b) mod P) mod g,
 *   P = 2^31 - 1, then k-RR over g = round(e^ε)+1 buckets.
 *
 * Every report of a basic mechanism has cohort 0.
 */
import { ParamsError } from "./errors.js";
import { type Encoding, aboveCeiling } from "./config.js";
import { BasicParams, indexBytes } from "./params.js";
import { type Schema, decode } from "./proto.js";
import { type RandomBytes, bernoulliBits, coin, flip, randomWords, secureRandomBytes, uniformBelow } from "./random.js";
import { type Report, newReportId } from "./report.js";

export const OLH_PRIME = 2 ** 31 - 1;

export function olhHash(a: number, b: number, x: number, g: number): number {
  return Number((BigInt(a) * BigInt(x) + BigInt(b)) % BigInt(OLH_PRIME)) % g;
}

function le(n: number, bytes: number): Uint8Array {
  const out = new Uint8Array(bytes);
  for (let i = 0; i < bytes; i++) out[i] = Math.floor(n / 2 ** (8 * i)) & 0xff;
  return out;
}

/** Domain look-up shared by the encoders of known domains. */
export class Domain {
  private readonly _index: Map<string, number> | null;

  constructor(
    readonly size: number,
    values: readonly string[] | null,
  ) {
    if (values && values.length) {
      if (values.length !== size) throw new ParamsError(`domain has ${values.length} values but domain_size is ${size}`);
      this._index = new Map(values.map((v, i) => [v, i]));
      if (this._index.size !== values.length) throw new ParamsError("domain values must be distinct");
    } else this._index = null;
  }

  /** An integer is taken as the index itself (checked); a string is looked up. */
  indexOf(value: string | number): number {
    if (typeof value === "number") {
      if (!Number.isInteger(value) || value < 0 || value >= this.size)
        throw new RangeError(`index must be an integer in [0, ${this.size}), got ${value}`);
      return value;
    }
    if (!this._index) throw new RangeError("this metric has no domain: pass an index");
    const i = this._index.get(String(value));
    if (i === undefined) throw new RangeError(`value ${JSON.stringify(value)} is not in the metric's domain`);
    return i;
  }
}

/** An encoder over a known domain (the basic mechanisms, histograms): its params, metric, domain and coins. */
export class DomainEncoder<P extends { readonly domainSize: number; fingerprint(): bigint }> {
  readonly fingerprint: bigint;
  readonly domain: Domain;
  protected readonly rand: RandomBytes;

  constructor(
    readonly params: P,
    readonly metric: string,
    opts: { domain?: readonly string[] | null; randomBytes?: RandomBytes } = {},
  ) {
    if (!metric) throw new RangeError("metric must be a non-empty string");
    this.domain = new Domain(params.domainSize, opts.domain ?? null);
    this.fingerprint = params.fingerprint();
    this.rand = opts.randomBytes ?? secureRandomBytes;
  }
}

export class BasicEncoder extends DomainEncoder<BasicParams> {
  /** The mechanism's output for a domain index, as payload bytes. */
  randomize(index: number): Uint8Array {
    const { mechanism, domainSize: d } = this.params;
    const rand = this.rand;
    if (mechanism === "binary-rr") return Uint8Array.of(coin(rand, this.params.keepProbability) ? index : 1 - index);
    if (mechanism === "krr") return le(flip(rand, index, d, this.params.keepProbability), indexBytes(d));
    if (mechanism === "oue") {
      const bits = bernoulliBits(this.params.oueQ, d, randomWords(rand, d));
      bits[index >> 3]! &= ~(1 << (index & 7));
      if (coin(rand, 0.5)) bits[index >> 3]! |= 1 << (index & 7);
      return bits;
    }
    const g = this.params.olhBuckets;
    const a = 1 + uniformBelow(rand, OLH_PRIME - 1);
    const b = uniformBelow(rand, OLH_PRIME);
    const y = flip(rand, olhHash(a, b, index, g), g, this.params.keepProbability);
    const out = new Uint8Array(8 + indexBytes(g));
    out.set(le(a, 4), 0);
    out.set(le(b, 4), 4);
    out.set(le(y, indexBytes(g)), 8);
    return out;
  }

  encode(value: string | number): Report {
    const bits = this.randomize(this.domain.indexOf(value));
    return { metric: this.metric, cohort: 0, bits, fingerprint: this.fingerprint, reportId: newReportId(this.rand) };
  }
}

/** A value of a known domain: its string, or its index (the basic mechanisms, histograms). */
export function domainValue(value: string | number | Uint8Array): string | number {
  if (typeof value !== "string" && typeof value !== "number") throw new RangeError("a value is a string or an index");
  return value;
}

// protos/crowdmix.proto: BasicConfig
const BASIC_CONFIG: Schema = { 1: ["epsilon", "d"], 2: ["domainSize", "u"], 3: ["domain", "s*"] };

/** The basic mechanisms for the reporter (`Encoding`): a ceiling on ε. */
export const basicEncoding: Encoding = {
  read(m) {
    if (!m.basic) return undefined;
    const w = decode(m.basic, BASIC_CONFIG) as { epsilon: number; domainSize: number; domain: string[] };
    const basic = new BasicParams({ mechanism: m.encoding, epsilon: w.epsilon, domainSize: w.domainSize });
    return [{ basic, domain: w.domain.length ? w.domain : null }, basic.fingerprint()];
  },
  ceiling(metric, mc, o) {
    return mc.basic ? aboveCeiling(metric, [["ε", mc.basic.epsilon, "maxEpsilon", o.maxEpsilon]]) : undefined;
  },
  encoder(metric, mc, _secret, rand) {
    if (!mc.basic) return undefined;
    const enc = new BasicEncoder(mc.basic, metric, { randomBytes: rand, domain: mc.domain });
    return (value) => [enc.encode(domainValue(value))];
  },
};
