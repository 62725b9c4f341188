/**
 * The few protobuf messages of `protos/crowdmix.proto` a device exchanges, by hand
 * (no generated code, no runtime dependency): SubmitRequest and GetConfigRequest out,
 * SubmitResponse and ConfigResponse in. Field numbers are the .proto's.
 */

class Writer {
  private parts: number[] = [];

  varint(v: number | bigint): this {
    let x = BigInt.asUintN(64, BigInt(v));
    while (x >= 0x80n) {
      this.parts.push(Number(x & 0x7fn) | 0x80);
      x >>= 7n;
    }
    this.parts.push(Number(x));
    return this;
  }

  tag(field: number, wire: number): this {
    return this.varint((field << 3) | wire);
  }

  uint(field: number, v: number | bigint): this {
    return v ? this.tag(field, 0).varint(v) : this;
  }

  bytes(field: number, b: Uint8Array): this {
    if (!b.length) return this;
    this.tag(field, 2).varint(b.length);
    for (const x of b) this.parts.push(x);
    return this;
  }

  string(field: number, s: string): this {
    return this.bytes(field, new TextEncoder().encode(s));
  }

  message(field: number, b: Uint8Array): this {
    this.tag(field, 2).varint(b.length);
    for (const x of b) this.parts.push(x);
    return this;
  }

  fixed64(field: number, v: bigint): this {
    if (!v) return this;
    this.tag(field, 1);
    for (let i = 0n; i < 8n; i++) this.parts.push(Number((v >> (8n * i)) & 0xffn));
    return this;
  }

  finish(): Uint8Array {
    return Uint8Array.from(this.parts);
  }
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

export function encodeSubmitRequest(reports: readonly WireReport[], protocol: number): Uint8Array {
  const w = new Writer();
  for (const r of reports) {
    const m = new Writer()
      .string(1, r.metric)
      .uint(2, r.cohort ?? 0)
      .bytes(3, r.bits ?? new Uint8Array(0))
      .fixed64(4, r.fingerprint ?? 0n)
      .bytes(5, r.reportId ?? new Uint8Array(0))
      .uint(6, r.keyId ?? 0)
      .bytes(7, r.sealed ?? new Uint8Array(0))
      .uint(8, r.window)
      .finish();
    w.message(1, m);
  }
  return w.uint(3, protocol).finish();
}

type Field = { n: number; wire: number; int: bigint; data: Uint8Array };

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
  const empty = new Uint8Array(0);
  while (i < buf.length) {
    const key = Number(varint());
    const n = key >>> 3;
    const wire = key & 7;
    if (wire === 0) out.push({ n, wire, int: varint(), data: empty });
    else if (wire === 1 || wire === 5) {
      const len = wire === 1 ? 8 : 4;
      if (i + len > buf.length) throw new RangeError("truncated protobuf");
      out.push({ n, wire, int: 0n, data: buf.subarray(i, i + len) });
      i += len;
    } else if (wire === 2) {
      const len = Number(varint());
      if (i + len > buf.length) throw new RangeError("truncated protobuf");
      out.push({ n, wire, int: 0n, data: buf.subarray(i, i + len) });
      i += len;
    } else throw new RangeError(`unsupported protobuf wire type ${wire}`);
  }
  return out;
}

const utf8 = new TextDecoder();
const str = (f: Field): string => utf8.decode(f.data);
const dbl = (f: Field): number => new DataView(f.data.buffer, f.data.byteOffset, 8).getFloat64(0, true);
const u64 = (f: Field): bigint => new DataView(f.data.buffer, f.data.byteOffset, 8).getBigUint64(0, true);
const num = (f: Field): number => Number(f.int);
const i64 = (f: Field): number => Number(BigInt.asIntN(64, f.int));

export function decodeSubmitResponse(buf: Uint8Array): number {
  let accepted = 0;
  for (const f of fields(buf)) if (f.n === 1 && f.wire === 0) accepted = num(f);
  return accepted;
}

export interface WireKey {
  keyId: number;
  suite: string;
  publicKey: Uint8Array;
  notBefore: number;
  notAfter: number | null;
}

export interface WireMetric {
  name: string;
  encoding: string;
  fingerprint: bigint;
  reportBytes: number;
  disposalSeconds: number;
  rappor?: { k: number; h: number; m: number; f: number; p: number; q: number; hashing: string };
  basic?: { epsilon: number; domainSize: number; domain: string[] };
  histogram?: { domainSize: number; fakeSlots: number; fakeProbability: number; localEpsilon: number; domain: string[] };
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
  windowTolerance: number;
}

function decodeMetric(buf: Uint8Array): WireMetric {
  const m: WireMetric = { name: "", encoding: "", fingerprint: 0n, reportBytes: 0, disposalSeconds: 0 };
  for (const f of fields(buf)) {
    if (f.n === 1) m.name = str(f);
    else if (f.n === 2) m.encoding = str(f);
    else if (f.n === 3) m.fingerprint = u64(f);
    else if (f.n === 4) m.reportBytes = num(f);
    else if (f.n === 7) m.disposalSeconds = num(f);
    else if (f.n === 5) {
      const r = { k: 0, h: 0, m: 0, f: 0, p: 0, q: 0, hashing: "" };
      for (const g of fields(f.data)) {
        if (g.n === 1) r.k = num(g);
        else if (g.n === 2) r.h = num(g);
        else if (g.n === 3) r.m = num(g);
        else if (g.n === 4) r.f = dbl(g);
        else if (g.n === 5) r.p = dbl(g);
        else if (g.n === 6) r.q = dbl(g);
        else if (g.n === 7) r.hashing = str(g);
      }
      m.rappor = r;
    } else if (f.n === 6) {
      const b = { epsilon: 0, domainSize: 0, domain: [] as string[] };
      for (const g of fields(f.data)) {
        if (g.n === 1) b.epsilon = dbl(g);
        else if (g.n === 2) b.domainSize = num(g);
        else if (g.n === 3) b.domain.push(str(g));
      }
      m.basic = b;
    } else if (f.n === 8) {
      const h = { domainSize: 0, fakeSlots: 0, fakeProbability: 0, localEpsilon: 0, domain: [] as string[] };
      for (const g of fields(f.data)) {
        if (g.n === 1) h.domainSize = num(g);
        else if (g.n === 2) h.fakeSlots = num(g);
        else if (g.n === 3) h.fakeProbability = dbl(g);
        else if (g.n === 4) h.localEpsilon = dbl(g);
        else if (g.n === 5) h.domain.push(str(g));
      }
      m.histogram = h;
    }
  }
  return m;
}

export function decodeConfigResponse(buf: Uint8Array): WireConfig {
  const c: WireConfig = { version: "", cacheSeconds: 0, metrics: [], keys: [], protocol: 0, windowSeconds: 0, serverTime: 0, window: 0, windowTolerance: 0 };
  for (const f of fields(buf)) {
    if (f.n === 1) c.version = str(f);
    else if (f.n === 2) c.cacheSeconds = num(f);
    else if (f.n === 3) c.metrics.push(decodeMetric(f.data));
    else if (f.n === 5) c.protocol = num(f);
    else if (f.n === 6) c.windowSeconds = num(f);
    else if (f.n === 7) c.serverTime = dbl(f);
    else if (f.n === 8) c.window = num(f);
    else if (f.n === 10) c.windowTolerance = num(f);
    else if (f.n === 4) {
      const k: WireKey = { keyId: 0, suite: "", publicKey: new Uint8Array(0), notBefore: 0, notAfter: null };
      for (const g of fields(f.data)) {
        if (g.n === 1) k.keyId = num(g);
        else if (g.n === 2) k.suite = str(g);
        else if (g.n === 3) k.publicKey = g.data.slice();
        else if (g.n === 4) k.notBefore = i64(g);
        else if (g.n === 5) k.notAfter = i64(g) || null;
      }
      c.keys.push(k);
    }
  }
  return c;
}
