/**
 * MurmurHash3 x64 128-bit, as Python's `mmh3.hash128(data, seed, signed=False)`:
 * the four 32-bit words of the digest, low word first (word i = bits 32i..32i+31).
 */

const M64 = (1n << 64n) - 1n;
const C1 = 0x87c37b91114253d5n;
const C2 = 0x4cf5ad432745937fn;

const rotl = (x: bigint, r: bigint): bigint => ((x << r) | (x >> (64n - r))) & M64;

function fmix(k: bigint): bigint {
  k ^= k >> 33n;
  k = (k * 0xff51afd7ed558ccdn) & M64;
  k ^= k >> 33n;
  k = (k * 0xc4ceb9fe1a85ec53n) & M64;
  return k ^ (k >> 33n);
}

function le64(b: Uint8Array, i: number, n = 8): bigint {
  let x = 0n;
  for (let j = n - 1; j >= 0; j--) x = (x << 8n) | BigInt(b[i + j]!);
  return x;
}

export function mmh3Words(data: Uint8Array, seed: number): [number, number, number, number] {
  let h1 = BigInt(seed >>> 0);
  let h2 = h1;
  const n = data.length;
  const blocks = n - (n & 15);
  for (let i = 0; i < blocks; i += 16) {
    let k1 = le64(data, i);
    let k2 = le64(data, i + 8);
    k1 = (rotl((k1 * C1) & M64, 31n) * C2) & M64;
    h1 ^= k1;
    h1 = (((rotl(h1, 27n) + h2) & M64) * 5n + 0x52dce729n) & M64;
    k2 = (rotl((k2 * C2) & M64, 33n) * C1) & M64;
    h2 ^= k2;
    h2 = (((rotl(h2, 31n) + h1) & M64) * 5n + 0x38495ab5n) & M64;
  }
  const tail = n & 15;
  if (tail > 8) {
    const k2 = le64(data, blocks + 8, tail - 8);
    h2 ^= (rotl((k2 * C2) & M64, 33n) * C1) & M64;
  }
  if (tail > 0) {
    const k1 = le64(data, blocks, Math.min(tail, 8));
    h1 ^= (rotl((k1 * C1) & M64, 31n) * C2) & M64;
  }
  h1 ^= BigInt(n);
  h2 ^= BigInt(n);
  h1 = (h1 + h2) & M64;
  h2 = (h2 + h1) & M64;
  h1 = fmix(h1);
  h2 = fmix(h2);
  h1 = (h1 + h2) & M64;
  h2 = (h2 + h1) & M64;
  return [Number(h1 & 0xffffffffn), Number(h1 >> 32n), Number(h2 & 0xffffffffn), Number(h2 >> 32n)];
}
