/**
 * The few protobuf messages of `protos/crowdmix.proto` a device exchanges, by hand
 * (no generated code, no runtime dependency): SubmitRequest and GetConfigRequest out,
 * SubmitResponse and ConfigResponse in. Field numbers are the .proto's.
 */
import { utf8 } from "./report.js";

type Value = number | bigint | string | Uint8Array;

/**
 * A message of (field number, value[, kept]) in field order, proto3's way: a 0, 0n, "" or
 * empty bytes is left out (unless kept: an embedded message); a number is a varint, a
 * bigint a fixed64, a string UTF-8 bytes.
 */
function message(fields: readonly (readonly [number, Value, boolean?])[]): Uint8Array {
  const out: number[] = [];
  const varint = (v: number | bigint): void => {
    let x = BigInt.asUintN(64, BigInt(v));
    for (; x >= 0x80n; x >>= 7n) out.push(Number(x & 0x7fn) | 0x80);
    out.push(Number(x));
  };
  for (const [n, v, kept] of fields) {
    if (typeof v === "number") {
      if (v) {
        varint(n << 3);
        varint(v);
      }
    } else if (typeof v === "bigint") {
      if (v) {
        varint((n << 3) | 1);
        for (let i = 0n; i < 64n; i += 8n) out.push(Number((v >> i) & 0xffn));
      }
    } else {
      const b = typeof v === "string" ? utf8(v) : v;
      if (b.length || kept) {
        varint((n << 3) | 2);
        varint(b.length);
        for (const x of b) out.push(x);
      }
    }
  }
  return Uint8Array.from(out);
}

/** One report as it goes on the wire: sealed (metric, window, key id, sealed) or clear. */
export interface WireReport {
  metric: string;
  window: number;
  keyId?: number;
  sealed?: Uint8Array;
  cohort?: number;
  bits?: Uint8Array;
  fingerprint?: bigint;
  reportId?: Uint8Array;
}

const EMPTY = /* @__PURE__ */ new Uint8Array(0);

export function encodeSubmitRequest(reports: readonly WireReport[], protocol: number): Uint8Array {
  const each = reports.map((r) => {
    const m = message([
      [1, r.metric],
      [2, r.cohort ?? 0],
      [3, r.bits ?? EMPTY],
      [4, r.fingerprint ?? 0n],
      [5, r.reportId ?? EMPTY],
      [6, r.keyId ?? 0],
      [7, r.sealed ?? EMPTY],
      [8, r.window],
    ]);
    return [1, m, true] as const;
  });
  return message([...each, [3, protocol]]);
}

export type Field = { n: number; wire: number; int: bigint; data: Uint8Array };

/** The fields of one message, in order. Throws RangeError on a malformed message. */
export function fields(buf: Uint8Array): Field[] {
  const out: Field[] = [];
  let i = 0;
  const varint = (): bigint => {
    let x = 0n;
    for (let s = 0n; ; s += 7n) {
      if (i >= buf.length || s > 63n) throw new RangeError("malformed protobuf varint");
      const b = buf[i++]!;
      x |= BigInt(b & 0x7f) << s;
      if (!(b & 0x80)) return x;
    }
  };
  while (i < buf.length) {
    const key = Number(varint());
    const n = key >>> 3;
    const wire = key & 7;
    if (wire === 0) out.push({ n, wire, int: varint(), data: EMPTY });
    else if (wire === 1 || wire === 2 || wire === 5) {
      const len = wire === 2 ? Number(varint()) : wire === 1 ? 8 : 4;
      if (i + len > buf.length) throw new RangeError("truncated protobuf");
      out.push({ n, wire, int: 0n, data: buf.subarray(i, i + len) });
      i += len;
    } else throw new RangeError(`unsupported protobuf wire type ${wire}`);
  }
  return out;
}

const utf8d = /* @__PURE__ */ new TextDecoder();
const view = (f: Field): DataView => new DataView(f.data.buffer, f.data.byteOffset, 8);

export function decodeSubmitResponse(buf: Uint8Array): number {
  let accepted = 0;
  for (const f of fields(buf)) if (f.n === 1 && f.wire === 0) accepted = Number(f.int);
  return accepted;
}

export interface WireKey {
  keyId: number;
  suite: string;
  publicKey: Uint8Array;
  notBefore: number;
  notAfter: number | null;
}

/**
 * A served metric; its params message undecoded (RapporConfig, BasicConfig, HistogramConfig
 * or HeavyHittersConfig): the encoding of its kind reads it, so a build without that
 * encoding carries no code for it.
 */
export interface WireMetric {
  name: string;
  encoding: string;
  fingerprint: bigint;
  reportBytes: number;
  disposalSeconds: number;
  rappor?: Uint8Array;
  basic?: Uint8Array;
  histogram?: Uint8Array;
  heavyHitters?: Uint8Array;
}

export interface WireConfig {
  version: string;
  cacheSeconds: number;
  metrics: WireMetric[];
  keys: WireKey[];
  protocol: number;
  windowSeconds: number;
  serverTime: number;
  window: number;
  /** absent (an answer from before the field): undefined, read as the shuffler's default */
  windowTolerance: number | undefined;
}

// A message's schema: per field number, its name and how to read it. A scalar's default is
// 0 (or "", 0n, empty bytes); an `optional` one ("?"-suffixed kind) stays undefined when
// absent; a repeated field ("*"-suffixed kind) starts as [].
type Kind = "u" | "u?" | "s" | "d" | "x" | "i" | "b" | "b?" | "s*" | Schema | [Schema];
export interface Schema {
  [n: number]: [string, Kind];
}
const READ: Record<string, (f: Field) => unknown> = {
  u: (f) => Number(f.int), // varint
  "u?": (f) => Number(f.int), // optional varint
  s: (f) => utf8d.decode(f.data), // string
  d: (f) => view(f).getFloat64(0, true), // double
  x: (f) => view(f).getBigUint64(0, true), // fixed64
  i: (f) => Number(BigInt.asIntN(64, f.int)), // int64
  b: (f) => f.data.slice(), // bytes
  "b?": (f) => f.data.slice(), // optional bytes
};
const DEFAULT: Record<string, () => unknown> = { u: () => 0, s: () => "", d: () => 0, x: () => 0n, i: () => 0, b: () => new Uint8Array(0) };

/** A message's fields by `schema` (see above); RangeError on a malformed message. */
export function decode(buf: Uint8Array, schema: Schema): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [name, kind] of Object.values(schema))
    if (Array.isArray(kind) || kind === "s*") out[name] = [];
    else if (typeof kind === "string" && !kind.endsWith("?")) out[name] = DEFAULT[kind]!();
  for (const f of fields(buf)) {
    const [name, kind] = schema[f.n] ?? [];
    if (!name) continue;
    if (Array.isArray(kind)) (out[name] as unknown[]).push(decode(f.data, kind[0]));
    else if (kind === "s*") (out[name] as unknown[]).push(READ.s!(f));
    else out[name] = typeof kind === "object" ? decode(f.data, kind) : READ[kind!]!(f);
  }
  return out;
}

// protos/crowdmix.proto: ConfigResponse, MetricConfig (its params: see WireMetric), PublicKey
const CONFIG: Schema = {
  1: ["version", "s"],
  2: ["cacheSeconds", "u"],
  3: [
    "metrics",
    [
      {
        1: ["name", "s"],
        2: ["encoding", "s"],
        3: ["fingerprint", "x"],
        4: ["reportBytes", "u"],
        7: ["disposalSeconds", "u"],
        5: ["rappor", "b?"],
        6: ["basic", "b?"],
        8: ["histogram", "b?"],
        9: ["heavyHitters", "b?"],
      },
    ],
  ],
  4: ["keys", [{ 1: ["keyId", "u"], 2: ["suite", "s"], 3: ["publicKey", "b"], 4: ["notBefore", "i"], 5: ["notAfter", "i"] }]],
  5: ["protocol", "u"],
  6: ["windowSeconds", "u"],
  7: ["serverTime", "d"],
  8: ["window", "u"],
  10: ["windowTolerance", "u?"],
};

export function decodeConfigResponse(buf: Uint8Array): WireConfig {
  const c = decode(buf, CONFIG) as unknown as WireConfig;
  for (const k of c.keys) k.notAfter ||= null; // 0: no end
  return c;
}
