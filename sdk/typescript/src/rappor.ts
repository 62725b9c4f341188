/**
 * The RAPPOR encoder: Bloom filter -> permanent RR -> instantaneous RR, as
 * `crowdmix.client.rappor` (mmh3 hashing) bit for bit up to the PRR:
 *
 * - Bloom: d = mmh3.hash128(value, seed=cohort); hash i sets bit (word_i(d) mod k).
 * - PRR (f): a deterministic function of (secret, metric, Bloom) through keyed BLAKE2b.
 *   K = the secret (BLAKE2b of it if longer than 64 bytes), person "crowdmix.prr.v1",
 *   M = len(metric) (u32 LE) ‖ metric ‖ Bloom (ceil(k/8) bytes); the stream S is
 *   BLAKE2b-512_K(M ‖ 0 as u32 LE) ‖ BLAKE2b-512_K(M ‖ 1) ‖ ..., a little-endian bit
 *   string; word 0 (bits [0, k)) is the uniform word U, the next k-bit words give an
 *   exact Bernoulli(f) mask N; PRR = B where N is 0, U where N is 1. Memoised for free.
 * - IRR (p, q): fresh for every report from the CSPRNG: Bernoulli(q) where the PRR is 1,
 *   Bernoulli(p) where it is 0.
 * - Cohort: BLAKE2b-128_K("cohort", person "crowdmix.cht.v1") as an integer, mod m.
 */
import { Blake2b, blake2bOf } from "./blake2b.js";
import { mmh3Words } from "./mmh3.js";
import { type Encoding, aboveCeiling } from "./config.js";
import { RapporParams } from "./params.js";
import { epsilonInf, epsilonOne } from "./privacy.js";
import { type Schema, decode } from "./proto.js";
import { type RandomBytes, bernoulliBits, maskTail, randomWords, secureRandomBytes } from "./random.js";
import { type Report, leBigInt, newReportId, utf8 } from "./report.js";

export const MIN_SECRET_BYTES = 16;
const PERSON_PRR = /* @__PURE__ */ utf8("crowdmix.prr.v1");
const PERSON_COHORT = /* @__PURE__ */ utf8("crowdmix.cht.v1");

function prfKey(secret: Uint8Array): Uint8Array {
  return secret.length <= 64 ? secret : blake2bOf(secret);
}

function checkSecret(secret: Uint8Array): void {
  if (!(secret instanceof Uint8Array) || secret.length < MIN_SECRET_BYTES)
    throw new RangeError(`secret must be at least ${MIN_SECRET_BYTES} bytes to key the PRR`);
}

/** The client's cohort in [0, m): a PRF of its secret, never re-drawn per report. */
export function cohortForSecret(secret: Uint8Array, m: number): number {
  checkSecret(secret);
  const d = blake2bOf(utf8("cohort"), 16, prfKey(secret), PERSON_COHORT);
  return Number(leBigInt(d) % BigInt(m));
}

/** Bloom bits of `value` in `cohort`, as ceil(k/8) little-endian bytes. */
export function bloomBits(value: string | Uint8Array, cohort: number, params: RapporParams): Uint8Array {
  const data = typeof value === "string" ? utf8(value) : value;
  const words = mmh3Words(data, cohort);
  const out = new Uint8Array(params.reportBytes);
  for (let i = 0; i < params.h; i++) {
    const bit = words[i]! % params.k;
    out[bit >> 3]! |= 1 << (bit & 7);
  }
  return out;
}

/** Bits [start, start + k) of `s` as a k-bit word. */
function wordAt(s: Uint8Array, start: number, k: number): Uint8Array {
  const n = (k + 7) >> 3;
  const out = new Uint8Array(n);
  const b = start >> 3;
  const sh = start & 7;
  for (let i = 0; i < n; i++) {
    const lo = s[b + i] ?? 0;
    const hi = s[b + i + 1] ?? 0;
    out[i] = sh ? ((lo >>> sh) | (hi << (8 - sh))) & 0xff : lo;
  }
  maskTail(out, k);
  return out;
}

export class RapporEncoder {
  readonly cohort: number;
  readonly fingerprint: bigint;
  private readonly _prefix: Blake2b;
  private readonly _rand: RandomBytes;

  constructor(
    readonly params: RapporParams,
    readonly metric: string,
    secret: Uint8Array,
    opts: { cohort?: number; randomBytes?: RandomBytes } = {},
  ) {
    if (!metric) throw new RangeError("metric must be a non-empty string");
    checkSecret(secret);
    const cohort = opts.cohort ?? cohortForSecret(secret, params.m);
    if (!Number.isInteger(cohort) || cohort < 0 || cohort >= params.m)
      throw new RangeError(`cohort must be an integer in [0, ${params.m}), got ${cohort}`);
    this.cohort = cohort;
    this.fingerprint = params.fingerprint();
    this._rand = opts.randomBytes ?? secureRandomBytes;
    const mb = utf8(metric);
    const head = new Uint8Array(4 + mb.length);
    new DataView(head.buffer).setUint32(0, mb.length, true);
    head.set(mb, 4);
    this._prefix = new Blake2b(64, prfKey(secret), PERSON_PRR).update(head);
  }

  bloom(value: string | Uint8Array): Uint8Array {
    return bloomBits(value, this.cohort, this.params);
  }

  /** The memoised PRR of a Bloom filter: same inputs, same output, always. */
  permanentResponse(bloom: Uint8Array): Uint8Array {
    const k = this.params.k;
    const base = this._prefix.copy().update(bloom);
    let stream = new Uint8Array(0);
    let block = 0;
    const need = (bits: number): void => {
      while (stream.length * 8 < bits) {
        const idx = new Uint8Array(4);
        new DataView(idx.buffer).setUint32(0, block++, true);
        const d = base.copy().update(idx).digest();
        const next = new Uint8Array(stream.length + 64);
        next.set(stream);
        next.set(d, stream.length);
        stream = next;
      }
    };
    let word = 0;
    const nextWord = (): Uint8Array => {
      need((word + 1) * k + 8);
      return wordAt(stream, k * word++, k);
    };
    const uniform = nextWord();
    const noise = this.params.f > 0 ? bernoulliBits(this.params.f, k, nextWord) : new Uint8Array(uniform.length);
    const out = new Uint8Array(bloom.length);
    for (let i = 0; i < out.length; i++) out[i] = bloom[i]! ^ ((bloom[i]! ^ uniform[i]!) & noise[i]!);
    return out;
  }

  /** Fresh IRR of a PRR: Bernoulli(q) on its 1 bits, Bernoulli(p) on its 0 bits. */
  instantaneousResponse(prr: Uint8Array): Uint8Array {
    const { k, p, q } = this.params;
    const words = randomWords(this._rand, k);
    const pb = bernoulliBits(p, k, words);
    const qb = bernoulliBits(q, k, words);
    const out = new Uint8Array(prr.length);
    for (let i = 0; i < out.length; i++) out[i] = pb[i]! ^ ((pb[i]! ^ qb[i]!) & prr[i]!);
    return out;
  }

  /** One report of `value`: ε_1-LDP on its own. */
  encode(value: string | Uint8Array): Report {
    const bits = this.instantaneousResponse(this.permanentResponse(this.bloom(value)));
    return { metric: this.metric, cohort: this.cohort, bits, fingerprint: this.fingerprint, reportId: newReportId(this._rand) };
  }
}

// protos/crowdmix.proto: RapporConfig
const RAPPOR_CONFIG: Schema = { 1: ["k", "u"], 2: ["h", "u"], 3: ["m", "u"], 4: ["f", "d"], 5: ["p", "d"], 6: ["q", "d"], 7: ["hashing", "s"] };

/** RAPPOR for the reporter (`Encoding`): a value is a string or bytes; ceilings on ε_1 and ε_∞. */
export const rapporEncoding: Encoding = {
  read(m) {
    if (!m.rappor) return undefined;
    const w = decode(m.rappor, RAPPOR_CONFIG) as ConstructorParameters<typeof RapporParams>[0];
    const rappor = new RapporParams({ ...w, hashing: w.hashing || "mmh3" });
    return [{ rappor, domain: null }, rappor.fingerprint()];
  },
  ceiling(metric, mc, o) {
    const r = mc.rappor;
    if (!r) return undefined;
    return aboveCeiling(metric, [
      ["ε_1", epsilonOne(r), "maxEpsilon", o.maxEpsilon],
      ["ε_∞", epsilonInf(r), "maxEpsilonInf", o.maxEpsilonInf],
    ]);
  },
  encoder(metric, mc, secret, rand) {
    if (!mc.rappor) return undefined;
    const enc = new RapporEncoder(mc.rappor, metric, secret, { randomBytes: rand });
    return (value) => {
      if (typeof value === "number") throw new RangeError("a value is a string or bytes");
      return [enc.encode(value)];
    };
  },
};
