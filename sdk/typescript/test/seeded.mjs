// A seeded byte stream for statistical tests: AES-128-CTR of zeros under a key made
// from the seed (deterministic, uniform to any test's resolution). Never a default.
import { createCipheriv, createHash } from "node:crypto";

export function seededBytes(seed) {
  const key = createHash("sha256").update(`crowdmix test seed ${seed}`).digest().subarray(0, 16);
  const ctr = createCipheriv("aes-128-ctr", key, Buffer.alloc(16));
  let buf = new Uint8Array(0);
  let pos = 0;
  return (n) => {
    if (pos + n > buf.length) {
      buf = new Uint8Array(ctr.update(Buffer.alloc(Math.max(n, 1 << 16))));
      pos = 0;
    }
    const out = buf.slice(pos, pos + n);
    pos += n;
    return out;
  };
}

/** χ² statistic of per-bit counts over n draws against probabilities pi (independent bits). */
export function chiSquare(counts, n, pi) {
  let s = 0;
  for (let i = 0; i < counts.length; i++) s += (counts[i] - n * pi[i]) ** 2 / (n * pi[i] * (1 - pi[i]));
  return s;
}

export function bitCounts(reports, k) {
  const c = new Array(k).fill(0);
  for (const b of reports) for (let i = 0; i < k; i++) c[i] += (b[i >> 3] >> (i & 7)) & 1;
  return c;
}
