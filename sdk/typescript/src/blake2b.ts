/**
 * BLAKE2b (RFC 7693) with key and personalisation, as Python's
 * `hashlib.blake2b(data, key=..., person=..., digest_size=...)`.
 *
 * WebCrypto has no BLAKE2b, and the permanent randomized response must be the
 * Python SDK's keyed BLAKE2b PRF bit for bit (one device, one PRR, whichever SDK
 * made it), so it is computed here: 64-bit words as pairs of 32-bit halves.
 */

const IV = /* @__PURE__ */ new Uint32Array([
  0xf3bcc908, 0x6a09e667, 0x84caa73b, 0xbb67ae85, 0xfe94f82b, 0x3c6ef372, 0x5f1d36f1, 0xa54ff53a,
  0xade682d1, 0x510e527f, 0x2b3e6c1f, 0x9b05688c, 0xfb41bd6b, 0x1f83d9ab, 0x137e2179, 0x5be0cd19,
]);

// Message schedule (RFC 7693 §2.7), one hex digit per word index, rounds 0-9; rounds 10
// and 11 repeat rounds 0 and 1. Doubled because every 64-bit word takes two slots.
const ROUNDS = "0123456789abcdefea489fd61c02b753b8c052fdae3671947931dcbe265a40f8905724afe1bc683d2c6a0b834d75fe19c51fed4a0763928bdb7ec13950f4862a6fe9b308c2d714a5a2847615fb9e3cd0";
const SIGMA = /* @__PURE__ */ Uint8Array.from(ROUNDS + ROUNDS.slice(0, 32), (c) => parseInt(c, 16) * 2);

const v = /* @__PURE__ */ new Uint32Array(32);
const m = /* @__PURE__ */ new Uint32Array(32);

function add(a: number, b: number): void {
  const lo = v[a]! + v[b]!;
  v[a + 1] = v[a + 1]! + v[b + 1]! + (lo >= 0x100000000 ? 1 : 0);
  v[a] = lo;
}

function addm(a: number, i: number): void {
  const lo = v[a]! + m[i]!;
  v[a + 1] = v[a + 1]! + m[i + 1]! + (lo >= 0x100000000 ? 1 : 0);
  v[a] = lo;
}

function g(a: number, b: number, c: number, d: number, x: number, y: number): void {
  add(a, b);
  addm(a, x);
  let lo = v[d]! ^ v[a]!;
  let hi = v[d + 1]! ^ v[a + 1]!;
  v[d] = hi;
  v[d + 1] = lo; // rotr 32
  add(c, d);
  lo = v[b]! ^ v[c]!;
  hi = v[b + 1]! ^ v[c + 1]!;
  v[b] = (lo >>> 24) ^ (hi << 8);
  v[b + 1] = (hi >>> 24) ^ (lo << 8); // rotr 24
  add(a, b);
  addm(a, y);
  lo = v[d]! ^ v[a]!;
  hi = v[d + 1]! ^ v[a + 1]!;
  v[d] = (lo >>> 16) ^ (hi << 16);
  v[d + 1] = (hi >>> 16) ^ (lo << 16); // rotr 16
  add(c, d);
  lo = v[b]! ^ v[c]!;
  hi = v[b + 1]! ^ v[c + 1]!;
  v[b] = (hi >>> 31) ^ (lo << 1);
  v[b + 1] = (lo >>> 31) ^ (hi << 1); // rotr 63
}

/** An incremental BLAKE2b state; `copy()` forks it (a keyed prefix reused per call). */
export class Blake2b {
  private h = new Uint32Array(16);
  private buf = new Uint8Array(128);
  private fill = 0;
  private t = 0;

  constructor(
    readonly outlen = 64,
    key?: Uint8Array,
    person?: Uint8Array,
  ) {
    if (outlen < 1 || outlen > 64) throw new RangeError("BLAKE2b digest size is 1..64 bytes");
    const keylen = key ? key.length : 0;
    if (keylen > 64) throw new RangeError("BLAKE2b key is at most 64 bytes");
    if (person && person.length > 16) throw new RangeError("BLAKE2b person is at most 16 bytes");
    this.h.set(IV);
    this.h[0]! ^= 0x01010000 ^ (keylen << 8) ^ outlen;
    if (person) {
      const p = new Uint8Array(16);
      p.set(person);
      for (let i = 0; i < 4; i++) this.h[12 + i]! ^= le32(p, 4 * i);
    }
    if (key && keylen) {
      this.update(key);
      this.fill = 128; // the key block is a whole block of its own
    }
  }

  copy(): Blake2b {
    const c = Object.create(Blake2b.prototype) as Blake2b;
    Object.assign(c, { outlen: this.outlen, h: this.h.slice(), buf: this.buf.slice(), fill: this.fill, t: this.t });
    return c;
  }

  update(data: Uint8Array): this {
    for (let i = 0; i < data.length; i++) {
      if (this.fill === 128) {
        this.t += 128;
        this.compress(false);
        this.fill = 0;
      }
      this.buf[this.fill++] = data[i]!;
    }
    return this;
  }

  digest(): Uint8Array {
    const s = this.copy();
    s.t += s.fill;
    s.buf.fill(0, s.fill);
    s.compress(true);
    const out = new Uint8Array(this.outlen);
    for (let i = 0; i < this.outlen; i++) out[i] = s.h[i >> 2]! >>> (8 * (i & 3));
    return out;
  }

  private compress(last: boolean): void {
    const h = this.h;
    v.set(h);
    v.set(IV, 16);
    v[24]! ^= this.t >>> 0;
    v[25]! ^= Math.floor(this.t / 0x100000000);
    if (last) {
      v[28] = ~v[28]!;
      v[29] = ~v[29]!;
    }
    for (let i = 0; i < 32; i++) m[i] = le32(this.buf, 4 * i);
    for (let r = 0; r < 12; r++) {
      const s = 16 * r;
      // columns (0,4,8,12) ... then diagonals (0,5,10,15) ..., each word two slots
      for (let j = 0; j < 8; j++) {
        const c = j & 3;
        const d = j >> 2;
        g(2 * c, 8 + 2 * ((c + d) & 3), 16 + 2 * ((c + 2 * d) & 3), 24 + 2 * ((c + 3 * d) & 3), SIGMA[s + 2 * j]!, SIGMA[s + 2 * j + 1]!);
      }
    }
    for (let i = 0; i < 16; i++) h[i] = h[i]! ^ v[i]! ^ v[i + 16]!;
  }
}

function le32(b: Uint8Array, i: number): number {
  return (b[i]! | (b[i + 1]! << 8) | (b[i + 2]! << 16) | (b[i + 3]! << 24)) >>> 0;
}

/** `hashlib.blake2b(data, key=key, person=person, digest_size=outlen).digest()`. */
export function blake2b(
  data: Uint8Array,
  opts: { key?: Uint8Array; person?: Uint8Array; outlen?: number } = {},
): Uint8Array {
  return new Blake2b(opts.outlen ?? 64, opts.key, opts.person).update(data).digest();
}
