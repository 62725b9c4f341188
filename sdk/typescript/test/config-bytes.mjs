// A ConfigResponse by hand (protobuf), as `crowdmix config export` would write one: one
// krr metric "theme" over three values, protocol 2, daily windows taken one window late,
// no keys (sealing off), the server's clock at `serverTime`.
import * as sdk from "../dist/node.js";

function varint(n) {
  const out = [];
  let x = BigInt(n);
  while (x >= 0x80n) {
    out.push(Number(x & 0x7fn) | 0x80);
    x >>= 7n;
  }
  out.push(Number(x));
  return out;
}
const field = (n, wire, bytes) => [...varint((n << 3) | wire), ...(wire === 2 ? varint(bytes.length) : []), ...bytes];
const str = (n, s) => field(n, 2, [...new TextEncoder().encode(s)]);
const dbl = (n, x) => {
  const b = new Uint8Array(8);
  new DataView(b.buffer).setFloat64(0, x, true);
  return field(n, 1, [...b]);
};
const fixed64 = (n, x) => {
  const b = new Uint8Array(8);
  new DataView(b.buffer).setBigUint64(0, x, true);
  return field(n, 1, [...b]);
};

// `tolerance`: the window_tolerance field; null leaves it out (an answer from before it)
export function encodeConfigForTest(serverTime = 1_800_000_000, tolerance = 1) {
  const params = new sdk.BasicParams({ mechanism: "krr", epsilon: 1, domainSize: 3 });
  const basic = [...dbl(1, 1), ...field(2, 0, varint(3)), ...str(3, "light"), ...str(3, "dark"), ...str(3, "sepia")];
  const metric = [...str(1, "theme"), ...str(2, "krr"), ...fixed64(3, params.fingerprint()), ...field(4, 0, varint(1)), ...field(6, 2, basic)];
  return Uint8Array.from([
    ...str(1, "v1"),
    ...field(2, 0, varint(3600)),
    ...field(3, 2, metric),
    ...field(5, 0, varint(2)),
    ...field(6, 0, varint(86400)),
    ...dbl(7, serverTime),
    ...(tolerance === null ? [] : field(10, 0, varint(tolerance))),
  ]);
}

/** The heavy-hitters metric "words" of the discovery tests: its plan (wire names). */
export const WORDS = {
  alphabet: "abcehlnpry",
  maxLength: 6,
  spans: [3, 7],
  keep: 20,
  candidates: 10,
  seeds: 16,
  weights: [1 / 3, 1 / 3, 1 / 3],
  epsilon: 9.5,
  delta: 1e-6,
  devices: 300,
};

// `rounds`: [{round, window, opened, epsilon, start, stop, seeds, buckets, candidates}]
// as a round file serves them; hourly windows, no keys (sealing off)
export function encodeHeavyConfigForTest(serverTime, rounds) {
  const fp = new sdk.HeavyHittersParams(WORDS).fingerprint();
  const u = (n, x) => (x ? field(n, 0, varint(x)) : []);
  const packedDoubles = WORDS.weights.flatMap((x) => dbl(0, x).slice(1));
  const round = (r) => [
    ...u(1, r.round), ...u(2, r.window), ...dbl(3, r.epsilon), ...u(4, r.start), ...u(5, r.stop),
    ...u(6, r.seeds), ...u(7, r.buckets), ...(r.candidates ?? []).flatMap((c) => str(8, c)), ...u(9, r.opened),
  ];
  const hh = [
    ...str(1, WORDS.alphabet), ...u(2, WORDS.maxLength), ...field(3, 2, WORDS.spans.flatMap(varint)), ...u(4, WORDS.keep),
    ...u(5, WORDS.candidates), ...u(6, WORDS.seeds), ...field(7, 2, packedDoubles), ...dbl(8, WORDS.epsilon),
    ...dbl(9, WORDS.delta), ...u(10, WORDS.devices), ...rounds.flatMap((r) => field(11, 2, round(r))),
  ];
  const metric = [...str(1, "words"), ...str(2, "heavy-hitters"), ...fixed64(3, fp), ...u(4, 4), ...field(9, 2, hh)];
  return Uint8Array.from([
    ...str(1, "v1"), ...u(2, 3600), ...field(3, 2, metric), ...u(5, 2), ...u(6, 3600), ...dbl(7, serverTime), ...u(10, 1),
  ]);
}
