/**
 * Encoding parameters: validated, frozen, with the 64-bit fingerprint every report
 * carries. The fingerprints are the Python SDK's (BLAKE2b-64 of a canonical string in
 * which floats appear as Python's `repr`), so a report made here matches the registry.
 *
 * - RAPPOR (Erlingsson, Pihur, Korolova, CCS 2014): k Bloom bits, h hashes, m cohorts,
 *   PRR f, IRR p = P(1 | PRR 0), q = P(1 | PRR 1).
 * - Basic mechanisms (Wang et al., USENIX Security 2017): binary-rr, krr, oue, olh.
 * - Shuffled histograms with fake reports: domain d, m fake slots filled w.p. q, optional
 *   local k-RR with ε_L.
 */
import { blake2bOf } from "./blake2b.js";
import { ParamsError } from "./errors.js";
import { leBigInt, utf8 } from "./report.js";

export type Hashing = "mmh3";
export type Mechanism = "binary-rr" | "krr" | "oue" | "olh";
export const MECHANISMS: readonly Mechanism[] = ["binary-rr", "krr", "oue", "olh"];

const MAX_K = 65536;
const MAX_COHORTS = 2 ** 32;
const MAX_H_MMH3 = 4;
const MAX_DOMAIN = 1 << 24;
const MAX_EPSILON = 30;
const MAX_OLH_EPSILON = 20;
const MAX_FAKE_SLOTS = 4096;


/** Python's `repr(float(x))`: shortest round-trip digits, Python's layout. */
export function pyFloatRepr(x: number): string {
  if (Number.isNaN(x)) return "nan";
  if (!Number.isFinite(x)) return x > 0 ? "inf" : "-inf";
  if (x === 0) return Object.is(x, -0) ? "-0.0" : "0.0";
  const [mant, expStr] = x.toExponential().split("e") as [string, string];
  const exp = Number(expStr);
  const sign = mant.startsWith("-") ? "-" : "";
  const digits = mant.replace("-", "").replace(".", "");
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      const int = digits.slice(0, exp + 1).padEnd(exp + 1, "0");
      return `${sign}${int}.${digits.slice(exp + 1) || "0"}`;
    }
    return `${sign}0.${"0".repeat(-exp - 1)}${digits}`;
  }
  const m = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
  return `${sign}${m}e${exp < 0 ? "-" : "+"}${String(Math.abs(exp)).padStart(2, "0")}`;
}

/** BLAKE2b-64 of `canon` as an unsigned 64-bit integer (little-endian). */
export function fingerprintOf(canon: string): bigint {
  return leBigInt(blake2bOf(utf8(canon), 8));
}

function checkInt(name: string, v: unknown, lo: number, hi: number): number {
  if (typeof v !== "number" || !Number.isInteger(v)) throw new ParamsError(`${name} must be an integer, got ${String(v)}`);
  if (v < lo || v > hi) throw new ParamsError(`${name} must be between ${lo} and ${hi}, got ${v}`);
  return v;
}

function checkProbability(name: string, v: unknown): number {
  if (typeof v !== "number" || !Number.isFinite(v) || v < 0 || v > 1)
    throw new ParamsError(`${name} must be a probability in [0, 1], got ${String(v)}`);
  return v;
}

function checkEpsilon(name: string, v: unknown, max: number): number {
  if (typeof v !== "number" || !Number.isFinite(v)) throw new ParamsError(`${name} must be a finite number, got ${String(v)}`);
  if (!(v > 0 && v <= max)) throw new ParamsError(`${name} must be in (0, ${max}], got ${v}`);
  return v;
}

/** Bytes for an index in [0, n): 1, 2 or 4. */
export function indexBytes(n: number): number {
  return n <= 256 ? 1 : n <= 65536 ? 2 : 4;
}

export class RapporParams {
  readonly k: number;
  readonly h: number;
  readonly m: number;
  readonly f: number;
  readonly p: number;
  readonly q: number;
  readonly hashing: Hashing = "mmh3";

  constructor(o: { k: number; h: number; m: number; f: number; p: number; q: number; hashing?: string }) {
    this.k = checkInt("k", o.k, 1, MAX_K);
    this.h = checkInt("h", o.h, 1, MAX_H_MMH3);
    this.m = checkInt("m", o.m, 1, MAX_COHORTS);
    this.f = checkProbability("f", o.f);
    this.p = checkProbability("p", o.p);
    this.q = checkProbability("q", o.q);
    if ((o.hashing ?? "mmh3") !== "mmh3")
      throw new ParamsError(`hashing must be mmh3, got ${o.hashing}`);
    if (this.h > this.k) throw new ParamsError(`h must not exceed k, got h=${this.h}, k=${this.k}`);
    if (this.f >= 1) throw new ParamsError(`f must be below 1, got f=${this.f}`);
    if (!(this.p < this.q)) throw new ParamsError(`p must be below q, got p=${this.p}, q=${this.q}`);
    Object.freeze(this);
  }

  get reportBytes(): number {
    return (this.k + 7) >> 3;
  }

  fingerprint(): bigint {
    const r = pyFloatRepr;
    return fingerprintOf(
      `rappor/v1;k=${this.k};h=${this.h};m=${this.m};f=${r(this.f)};p=${r(this.p)};q=${r(this.q)};hashing=${this.hashing}`,
    );
  }
}

export class BasicParams {
  readonly mechanism: Mechanism;
  readonly epsilon: number;
  readonly domainSize: number;

  constructor(o: { mechanism: string; epsilon: number; domainSize: number }) {
    if (!(MECHANISMS as readonly string[]).includes(o.mechanism))
      throw new ParamsError(`mechanism must be one of ${MECHANISMS.join(", ")}, got ${o.mechanism}`);
    this.mechanism = o.mechanism as Mechanism;
    this.epsilon = checkEpsilon("epsilon", o.epsilon, MAX_EPSILON);
    this.domainSize = checkInt("domain_size", o.domainSize, 2, MAX_DOMAIN);
    if (this.mechanism === "olh" && this.epsilon > MAX_OLH_EPSILON)
      throw new ParamsError(`epsilon must be at most ${MAX_OLH_EPSILON} for olh, got ${this.epsilon}`);
    if (this.mechanism === "binary-rr" && this.domainSize !== 2)
      throw new ParamsError(`domain_size must be 2 for binary-rr, got ${this.domainSize}`);
    Object.freeze(this);
  }

  /** binary-rr / krr: P(report the true value); olh: the same over g buckets. */
  get keepProbability(): number {
    const e = Math.exp(this.epsilon);
    const n = this.mechanism === "olh" ? this.olhBuckets : this.domainSize;
    return e / (e + n - 1);
  }

  /** oue: P(bit set) for a bit that is not the true value's: 1/(e^ε+1). */
  get oueQ(): number {
    return 1 / (Math.exp(this.epsilon) + 1);
  }

  /** olh: g = round(e^ε) + 1 (Python's round: half to even). */
  get olhBuckets(): number {
    return Math.max(2, roundHalfEven(Math.exp(this.epsilon)) + 1);
  }

  get reportBytes(): number {
    switch (this.mechanism) {
      case "binary-rr":
        return 1;
      case "krr":
        return indexBytes(this.domainSize);
      case "oue":
        return (this.domainSize + 7) >> 3;
      default:
        return 8 + indexBytes(this.olhBuckets);
    }
  }

  fingerprint(): bigint {
    return fingerprintOf(`basic/v1;mechanism=${this.mechanism};epsilon=${pyFloatRepr(this.epsilon)};d=${this.domainSize}`);
  }
}

/** Python's round(x) for a float: half to even. */
export function roundHalfEven(x: number): number {
  const f = Math.floor(x);
  const d = x - f;
  if (d > 0.5) return f + 1;
  if (d < 0.5) return f;
  return f % 2 === 0 ? f : f + 1;
}

export class HistogramParams {
  readonly domainSize: number;
  readonly fakeSlots: number;
  readonly fakeProbability: number;
  readonly localEpsilon: number | null;

  constructor(o: { domainSize: number; fakeSlots: number; fakeProbability: number; localEpsilon?: number | null }) {
    this.domainSize = checkInt("domain_size", o.domainSize, 2, MAX_DOMAIN);
    this.fakeSlots = checkInt("fake_slots", o.fakeSlots, 0, MAX_FAKE_SLOTS);
    this.fakeProbability = checkProbability("fake_probability", o.fakeProbability);
    this.localEpsilon = o.localEpsilon == null ? null : checkEpsilon("local_epsilon", o.localEpsilon, MAX_EPSILON);
    Object.freeze(this);
  }

  /** P(real report = true value): e^ε_L/(e^ε_L+d-1), or 1 without k-RR. */
  get keepProbability(): number {
    return this.localEpsilon === null ? 1 : 1 / (1 + (this.domainSize - 1) * Math.exp(-this.localEpsilon));
  }

  get reportBytes(): number {
    return indexBytes(this.domainSize);
  }

  get maxMessages(): number {
    return 1 + this.fakeSlots;
  }

  fingerprint(): bigint {
    const le = this.localEpsilon === null ? "None" : pyFloatRepr(this.localEpsilon);
    return fingerprintOf(
      `shuffled-histogram/v1;d=${this.domainSize};m=${this.fakeSlots};q=${pyFloatRepr(this.fakeProbability)};local_epsilon=${le}`,
    );
  }
}
