/**
 * Random bits for the encoders: `crypto.getRandomValues` by default, injectable for tests.
 *
 * Bit vectors are `Uint8Array`s, bit i = bit (i % 8) of byte (i / 8), as on the wire.
 * Bernoulli vectors are sampled exactly for any float probability, as
 * `crowdmix.client.randomness.bernoulli_bits`: a float p is a dyadic rational
 * 0.b1 b2 ... bd; lane by lane, digit j takes one fresh uniform bit u_j: b_j = 1, u_j = 1
 * decides 1, b_j = 0, u_j = 0 decides 0, anything else moves on; a lane still open after
 * digit d is 0. So P(1) = Σ b_j 2^-j = p exactly.
 */

/** Fills and returns `n` uniform random bytes. */
export type RandomBytes = (n: number) => Uint8Array;

const CHUNK = 65536; // getRandomValues' per-call limit

/** The default: the platform CSPRNG (WebCrypto). */
export const secureRandomBytes: RandomBytes = (n) => {
  const out = new Uint8Array(n);
  for (let i = 0; i < n; i += CHUNK) crypto.getRandomValues(out.subarray(i, Math.min(n, i + CHUNK)));
  return out;
};

const digitCache = /* @__PURE__ */ new Map<number, Uint8Array>();

/** The binary digits b1 b2 ... of `p` in [0, 1): finite for a float, each step exact. */
export function probabilityDigits(p: number): Uint8Array {
  if (!(p >= 0 && p < 1)) throw new RangeError(`probability must be in [0, 1), got ${p}`);
  let d = digitCache.get(p);
  if (d) return d;
  const out: number[] = [];
  let x = p;
  while (x !== 0) {
    x *= 2; // exact: doubling a float below 1
    if (x >= 1) {
      out.push(1);
      x -= 1; // exact (Sterbenz)
    } else out.push(0);
  }
  d = Uint8Array.from(out);
  if (digitCache.size < 256) digitCache.set(p, d);
  return d;
}

/** A source of k-bit words, read in order. */
export type WordSource = () => Uint8Array;

/** `nbits` independent Bernoulli(`p`) bits, exactly; one word per digit, early stop. */
export function bernoulliBits(p: number, nbits: number, next: WordSource): Uint8Array {
  const n = (nbits + 7) >> 3;
  const result = new Uint8Array(n);
  if (p >= 1) {
    if (p > 1) throw new RangeError(`probability must be in [0, 1], got ${p}`);
    result.fill(0xff);
    maskTail(result, nbits);
    return result;
  }
  const undecided = new Uint8Array(n).fill(0xff);
  maskTail(undecided, nbits);
  for (const digit of probabilityDigits(p)) {
    const u = next();
    let open = 0;
    for (let i = 0; i < n; i++) {
      if (digit) {
        result[i]! |= undecided[i]! & u[i]!;
        undecided[i]! &= ~u[i]!;
      } else undecided[i]! &= u[i]!;
      open |= undecided[i]!;
    }
    if (!open) break;
  }
  return result;
}

/** Clears the bits at positions >= nbits of the last byte. */
export function maskTail(b: Uint8Array, nbits: number): void {
  if (nbits & 7) b[b.length - 1]! &= (1 << (nbits & 7)) - 1;
}

/** Words of `nbits` uniform bits from `rand`. */
export function randomWords(rand: RandomBytes, nbits: number): WordSource {
  return () => {
    const w = rand((nbits + 7) >> 3);
    maskTail(w, nbits);
    return w;
  };
}

/** Uniform in [0, n) by rejection (no modulo bias), n <= 2^32. */
export function uniformBelow(rand: RandomBytes, n: number): number {
  let nbits = 1;
  while (2 ** nbits < n) nbits++;
  const nbytes = (nbits + 7) >> 3;
  for (;;) {
    const b = rand(nbytes);
    let r = 0;
    for (let i = nbytes - 1; i >= 0; i--) r = r * 256 + b[i]!;
    r %= 2 ** nbits; // keep the low nbits (a power of two: exact)
    if (r < n) return r;
  }
}

/** One Bernoulli(p) coin. */
export function coin(rand: RandomBytes, p: number): boolean {
  return (bernoulliBits(p, 1, randomWords(rand, 1))[0]! & 1) === 1;
}

/** k-ary randomized response of `index` over [0, n) with keep probability `keep`. */
export function flip(rand: RandomBytes, index: number, n: number, keep: number): number {
  if (coin(rand, keep)) return index;
  const other = uniformBelow(rand, n - 1);
  return other + (other >= index ? 1 : 0);
}

/** Number of set bits. */
export function popcount(b: Uint8Array): number {
  let c = 0;
  for (const x of b) {
    let y = x;
    while (y) {
      y &= y - 1;
      c++;
    }
  }
  return c;
}
