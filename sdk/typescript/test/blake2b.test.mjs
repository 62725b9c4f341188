// BLAKE2b (src/blake2b.ts) against RFC 7693's vector, Node's own BLAKE2b-512 across block
// boundaries, and Python's hashlib with a key and a person (digests below made by
// `hashlib.blake2b(bytes(range(n)), key=bytes(range(64)))`, the BLAKE2 KAT's form). The
// golden vectors check it again inside the PRR, cohorts and fingerprints.
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { test } from "node:test";
import * as sdk from "../dist/node.js";

const hex = sdk.toHex;
const range = (n, from = 0) => Uint8Array.from({ length: n }, (_, i) => (from + i) & 0xff);

test("RFC 7693 Appendix A: BLAKE2b-512 of 'abc'", () => {
  const want = "ba80a53f981c4d0d6a2797b69f12f6e94c212f14685ac4b74b12bb6fdbffa2d17d87c5392aab792dc252d5de4533cc9518d38aa8dbf1925ab92386edd4009923";
  assert.equal(hex(sdk.blake2b(new TextEncoder().encode("abc"))), want);
});

test("unkeyed BLAKE2b-512 of 0 to 400 bytes is Node's", () => {
  for (let n = 0; n <= 400; n++) {
    const data = range(n, 7 * n);
    assert.equal(hex(sdk.blake2b(data)), createHash("blake2b512").update(data).digest("hex"), `${n} bytes`);
  }
});

test("keyed and personalised BLAKE2b is Python's hashlib", () => {
  const keyed = {
    0: "10ebb67700b1868efb4417987acf4690ae9d972fb7a590c2f02871799aaa4786b5e996e8f0f4eb981fc214b005f42d2ff4233499391653df7aefcbc13fc51568",
    1: "961f6dd1e4dd30f63901690c512e78e4b45e4742ed197c3c5e45c549fd25f2e4187b0bc9fe30492b16b0d0bc4ef9b0f34c7003fac09a5ef1532e69430234cebd",
    127: "76d2d819c92bce55fa8e092ab1bf9b9eab237a25267986cacf2b8ee14d214d730dc9a5aa2d7b596e86a1fd8fa0804c77402d2fcd45083688b218b1cdfa0dcbcb",
    128: "72065ee4dd91c2d8509fa1fc28a37c7fc9fa7d5b3f8ad3d0d7a25626b57b1b44788d4caf806290425f9890a3a2a35a905ab4b37acfd0da6e4517b2525c9651e4",
    129: "64475dfe7600d7171bea0b394e27c9b00d8e74dd1e416a79473682ad3dfdbb706631558055cfc8a40e07bd015a4540dcdea15883cbbf31412df1de1cd4152b91",
    255: "142709d62e28fcccd0af97fad0f8465b971e82201dc51070faa0372aa43e92484be1c1e73ba10906d5d1853db6a4106e0a7bf9800d373d6dee2d46d62ef2a461",
    256: "b72071e096277edebb8ee5134dd3714996307ba3a55aa4733d412abbe28e909e10e57e6fbfb4ef53b3b960518294ff889a90829254412e2a60b85add07a3674f",
    257: "3a9e68b5a91ccd5de231647907c427b82dcbeaaca7077a71474516d44a6c96a230590534bd9f3bafa8143f8be67b3abce7b6405329664c47c0c22f5f53ac1369",
  };
  for (const [n, want] of Object.entries(keyed)) assert.equal(hex(sdk.blake2b(range(Number(n)), { key: range(64) })), want, `${n} bytes`);
  // hashlib.blake2b(bytes(range(200)), key=bytes(range(65, 85)), person=b"crowdmix.prr.v1", digest_size=16)
  const person = new TextEncoder().encode("crowdmix.prr.v1");
  assert.equal(hex(sdk.blake2b(range(200), { key: range(20, 65), person, outlen: 16 })), "30a3b383efb7761d3245d2fbcf8b1dac");
});

test("keyed and personalised BLAKE2b-128 at block boundaries is Python's hashlib (the PRR's and the cohort's form)", () => {
  // hashlib.blake2b(bytes(range(n)), key=bytes(range(65, 85)), person=b"crowdmix.prr.v1", digest_size=16)
  const want = {
    0: "6e107d7439574d890c629824cdc90cb5",
    127: "cc757cc7d73dad4e2b1087268de4b9cf",
    128: "8c54c7a93a395c034b906a1043dbbeb2",
    129: "b64c350f8d46ced03df65730438bc3d0",
    255: "d991306f9c4e1b99ec79ffe680b81cf4",
    256: "b9adda1ee6e51d3846100acb519e0077",
    257: "10b330d12cfe6a915d29d8d78de8912e",
  };
  const person = new TextEncoder().encode("crowdmix.prr.v1");
  for (const [n, h] of Object.entries(want)) assert.equal(hex(sdk.blake2b(range(Number(n)), { key: range(20, 65), person, outlen: 16 })), h, `${n} bytes`);
});

test("blake2b refuses what hashlib refuses: a digest size outside 1..64, a key over 64 bytes, a person over 16", () => {
  for (const outlen of [0, 65, 1.5]) assert.throws(() => sdk.blake2b(range(1), { outlen }), RangeError);
  assert.throws(() => sdk.blake2b(range(1), { key: range(65) }), RangeError);
  assert.throws(() => sdk.blake2b(range(1), { person: range(17) }), RangeError);
});
