/**
 * BLAKE2b (RFC 7693) with key and personalisation, as Python's
 * `hashlib.blake2b(data, key=..., person=..., digest_size=...)`.
 *
 * WebCrypto has no BLAKE2b, and the permanent randomized response must be the
 * Python SDK's keyed BLAKE2b PRF bit for bit (one device, one PRR, whichever SDK
 * made it), so it is computed here, on 64-bit BigInt words: 300 B less than 32-bit
 * halves in a gzipped browser bundle, for about 30 µs more per RAPPOR report (k = 128,
 * Node 20: BENCHMARKS.md), against a report() of ~1.5 ms in a browser.
 */

const MASK = (1n << 64n) - 1n;
const IV = [
  0x6a09e667f3bcc908n, 0xbb67ae8584caa73bn, 0x3c6ef372fe94f82bn, 0xa54ff53a5f1d36f1n,
  0x510e527fade682d1n, 0x9b05688c2b3e6c1fn, 0x1f83d9abfb41bd6bn, 0x5be0cd19137e2179n,
];

// Message schedule (RFC 7693 §2.7), one hex digit per word index, rounds 0-9; rounds 10
// and 11 repeat rounds 0 and 1.
const ROUNDS = "0123456789abcdefea489fd61c02b753b8c052fdae3671947931dcbe265a40f8905724afe1bc683d2c6a0b834d75fe19c51fed4a0763928bdb7ec13950f4862a6fe9b308c2d714a5a2847615fb9e3cd0";
const SIGMA = /* @__PURE__ */ Array.from(ROUNDS + ROUNDS.slice(0, 32), (c) => parseInt(c, 16));

const rotr = (x: bigint, n: bigint): bigint => ((x >> n) | (x << (64n - n))) & MASK;
const le64 = (b: Uint8Array, i: number): bigint => new DataView(b.buffer, b.byteOffset).getBigUint64(i, true);

/**
 * An incremental BLAKE2b state; `copy()` forks it (a keyed prefix reused per call). Its
 * arguments are taken as given (1..64 output bytes, a key of at most 64 bytes, a person
 * of at most 16): `blake2b` checks them for a caller outside the SDK.
 */
export class Blake2b {
  private _h = IV.slice();
  private _buf = new Uint8Array(128);
  private _fill = 0;
  private _t = 0n;

  constructor(
    readonly outlen = 64,
    key?: Uint8Array,
    person?: Uint8Array,
  ) {
    const keylen = key ? key.length : 0;
    this._h[0]! ^= BigInt(0x01010000 ^ (keylen << 8) ^ outlen);
    if (person) {
      const p = new Uint8Array(16);
      p.set(person);
      this._h[6]! ^= le64(p, 0);
      this._h[7]! ^= le64(p, 8);
    }
    if (key && keylen) {
      this.update(key);
      this._fill = 128; // the key block is a whole block of its own
    }
  }

  copy(): Blake2b {
    return Object.assign(Object.create(Blake2b.prototype) as Blake2b, this, { _h: this._h.slice(), _buf: this._buf.slice() });
  }

  update(data: Uint8Array): this {
    for (let i = 0; i < data.length; i++) {
      if (this._fill === 128) {
        this._t += 128n;
        this._compress(false);
        this._fill = 0;
      }
      this._buf[this._fill++] = data[i]!;
    }
    return this;
  }

  digest(): Uint8Array {
    const s = this.copy();
    s._t += BigInt(s._fill);
    s._buf.fill(0, s._fill);
    s._compress(true);
    const out = new DataView(new ArrayBuffer(64));
    s._h.forEach((x, i) => out.setBigUint64(8 * i, x, true));
    return new Uint8Array(out.buffer).slice(0, this.outlen);
  }

  private _compress(last: boolean): void {
    const v = [...this._h, ...IV];
    v[12]! ^= this._t; // t < 2^64: the high counter word stays 0
    if (last) v[14]! ^= MASK;
    const m = Array.from({ length: 16 }, (_, i) => le64(this._buf, 8 * i));
    const g = (a: number, b: number, c: number, d: number, x: bigint, y: bigint): void => {
      v[a] = (v[a]! + v[b]! + x) & MASK;
      v[d] = rotr(v[d]! ^ v[a]!, 32n);
      v[c] = (v[c]! + v[d]!) & MASK;
      v[b] = rotr(v[b]! ^ v[c]!, 24n);
      v[a] = (v[a]! + v[b]! + y) & MASK;
      v[d] = rotr(v[d]! ^ v[a]!, 16n);
      v[c] = (v[c]! + v[d]!) & MASK;
      v[b] = rotr(v[b]! ^ v[c]!, 63n);
    };
    for (let r = 0; r < 12; r++) {
      const s = 16 * r;
      // columns (0,4,8,12) ... then diagonals (0,5,10,15) ...
      for (let j = 0; j < 8; j++) {
        const c = j & 3;
        const d = j >> 2;
        g(c, 4 + ((c + d) & 3), 8 + ((c + 2 * d) & 3), 12 + ((c + 3 * d) & 3), m[SIGMA[s + 2 * j]!]!, m[SIGMA[s + 2 * j + 1]!]!);
      }
    }
    for (let i = 0; i < 8; i++) this._h[i] = this._h[i]! ^ v[i]! ^ v[i + 8]!;
  }
}

/** `new Blake2b(outlen, key, person).update(data).digest()`, for the SDK's own (valid) arguments. */
export const blake2bOf = (data: Uint8Array, outlen = 64, key?: Uint8Array, person?: Uint8Array): Uint8Array =>
  new Blake2b(outlen, key, person).update(data).digest();

/** `hashlib.blake2b(data, key=key, person=person, digest_size=outlen).digest()`; RangeError on arguments it refuses. */
export function blake2b(data: Uint8Array, opts: { key?: Uint8Array; person?: Uint8Array; outlen?: number } = {}): Uint8Array {
  const { key, person, outlen = 64 } = opts;
  if (!(Number.isInteger(outlen) && outlen >= 1 && outlen <= 64)) throw new RangeError("BLAKE2b digest size is 1..64 bytes");
  if (key && key.length > 64) throw new RangeError("BLAKE2b key is at most 64 bytes");
  if (person && person.length > 16) throw new RangeError("BLAKE2b person is at most 16 bytes");
  return blake2bOf(data, outlen, key, person);
}
