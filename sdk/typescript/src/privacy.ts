/**
 * Per-report local privacy of RAPPOR (Erlingsson, Pihur, Korolova, CCS 2014, §4), as
 * `crowdmix.client.privacy`:
 *
 *     p* = f(p+q)/2 + (1-f)p          q* = f(p+q)/2 + (1-f)q
 *     ε_1 = h · ln( q*(1-p*) / (p*(1-q*)) )     one report
 *     ε_∞ = 2h · ln( (1-f/2) / (f/2) )          any number of reports of one value
 *
 * ε_1 is evaluated on exact rationals (every float is one; BigInt), so p* and q* cannot
 * underflow to a ratio that is not the true one.
 */
import type { RapporParams } from "./params.js";

type Frac = [bigint, bigint]; // numerator, denominator > 0

function exact(x: number): Frac {
  let den = 1n;
  while (!Number.isInteger(x)) {
    x *= 2; // exact for a finite float
    den *= 2n;
  }
  return [BigInt(x), den];
}

const mul = (a: Frac, b: Frac): Frac => [a[0] * b[0], a[1] * b[1]];
const add = (a: Frac, b: Frac): Frac => [a[0] * b[1] + b[0] * a[1], a[1] * b[1]];
const sub = (a: Frac, b: Frac): Frac => [a[0] * b[1] - b[0] * a[1], a[1] * b[1]];
const ONE: Frac = [1n, 1n];
const HALF: Frac = [1n, 2n];

/** ln of a positive BigInt (as Python's math.log of an int: scaled to the float range). */
function bigLog(n: bigint): number {
  const bits = n.toString(2).length;
  if (bits <= 1000) return Math.log(Number(n));
  const shift = bits - 64;
  return Math.log(Number(n >> BigInt(shift))) + shift * Math.LN2;
}

/** ε_1: the LDP level of one report; Infinity if p* = 0 or q* = 1. */
export function epsilonOne(params: RapporParams): number {
  const [f, p, q] = [exact(params.f), exact(params.p), exact(params.q)];
  const shared = mul(mul(f, add(p, q)), HALF);
  const ps = add(shared, mul(sub(ONE, f), p));
  const qs = add(shared, mul(sub(ONE, f), q));
  if (ps[0] <= 0n || qs[0] >= qs[1]) return Infinity;
  const num = mul(qs, sub(ONE, ps));
  const den = mul(ps, sub(ONE, qs));
  // ratio = (num0·den1) / (num1·den0)
  return params.h * (bigLog(num[0] * den[1]) - bigLog(num[1] * den[0]));
}

/** ε_∞ = 2h·ln((1-f/2)/(f/2)): the PRR bound; Infinity if f = 0. */
export function epsilonInf(params: RapporParams): number {
  if (params.f <= 0) return Infinity;
  const half = params.f / 2;
  return 2 * params.h * (Math.log1p(-half) - Math.log(half));
}
