/** The encoded report as the SDK stores and sends it (bit i = bit i % 8 of byte i / 8). */
import type { RandomBytes } from "./random.js";

export const REPORT_ID_BYTES = 16;
/** The protocol this SDK speaks (a report names its window; HPKE info binds it). */
export const PROTOCOL_VERSION = 2;

export interface Report {
  readonly metric: string;
  readonly cohort: number;
  readonly bits: Uint8Array;
  /** The params fingerprint (u64). */
  readonly fingerprint: bigint;
  /** 16 fresh CSPRNG bytes, drawn at encode time and kept through every retry. */
  readonly reportId: Uint8Array;
}

/** A fresh report id; never all zero (the wire's "no id"). */
export function newReportId(rand: RandomBytes): Uint8Array {
  for (;;) {
    const id = rand(REPORT_ID_BYTES);
    if (id.length !== REPORT_ID_BYTES) throw new RangeError(`a report id is ${REPORT_ID_BYTES} bytes`);
    if (id.some((b) => b !== 0)) return id;
  }
}

const encoder = /* @__PURE__ */ new TextEncoder();

/** UTF-8 bytes of a string. */
export const utf8 = (s: string): Uint8Array => encoder.encode(s);

/** Little-endian bytes as an unsigned integer. */
export function leBigInt(b: Uint8Array): bigint {
  let x = 0n;
  for (let i = b.length - 1; i >= 0; i--) x = (x << 8n) | BigInt(b[i]!);
  return x;
}

export function toHex(b: Uint8Array): string {
  let s = "";
  for (const x of b) s += x.toString(16).padStart(2, "0");
  return s;
}

export function fromHex(s: string): Uint8Array {
  const out = new Uint8Array(s.length >> 1);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(s.slice(2 * i, 2 * i + 2), 16);
  return out;
}
