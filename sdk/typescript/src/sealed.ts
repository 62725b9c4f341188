/**
 * Sealed reports, as `crowdmix.client.sealed` (protocol 2): RFC 9180 HPKE
 * (DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, AES-128-GCM; hpke.ts, on WebCrypto) to
 * the aggregator's public key, with no `aad`.
 *
 *     plaintext = bits ‖ cohort (u32 LE) ‖ params fingerprint (u64 LE) ‖ report id (16 B)
 *     info      = "crowdmix/sealed-report" ‖ 0x00 ‖ protocol (u8 = 2) ‖ key id (u32 LE)
 *                 ‖ window (u32 LE) ‖ len(metric) (u16 LE) ‖ metric (UTF-8)
 *     sealed    = enc (32 B) ‖ ciphertext ‖ tag (16 B)
 *
 * A ciphertext replayed under another metric, key or window does not open. Only the
 * X25519 suite is sealed here (WebCrypto has no ML-KEM for the hybrid suite).
 */
import { hpkeSeal } from "./hpke.js";
import type { WireKey } from "./proto.js";
import { PROTOCOL_VERSION, type Report, utf8 } from "./report.js";

export { PROTOCOL_VERSION };
export const X25519_SUITE = "x25519-hkdf-sha256-aes128gcm";
const LABEL = /* @__PURE__ */ utf8("crowdmix/sealed-report\0");

export function reportInfo(metric: string, keyId: number, window: number): Uint8Array {
  const name = utf8(metric);
  if (!name.length || name.length > 0xffff) throw new RangeError("metric name must be 1..65535 UTF-8 bytes");
  const out = new Uint8Array(LABEL.length + 11 + name.length);
  out.set(LABEL);
  const dv = new DataView(out.buffer, LABEL.length);
  dv.setUint8(0, PROTOCOL_VERSION);
  dv.setUint32(1, keyId, true);
  dv.setUint32(5, window, true);
  dv.setUint16(9, name.length, true);
  out.set(name, LABEL.length + 11);
  return out;
}

export function packPlaintext(r: Report): Uint8Array {
  const out = new Uint8Array(r.bits.length + 28);
  out.set(r.bits);
  const dv = new DataView(out.buffer, r.bits.length);
  dv.setUint32(0, r.cohort, true);
  dv.setBigUint64(4, r.fingerprint, true);
  out.set(r.reportId, r.bits.length + 12);
  return out;
}

/** The key a device seals to: of the X25519 keys usable at `now` (unix s), the newest. */
export function chooseKey(keys: readonly WireKey[], now: number): WireKey | null {
  let best: WireKey | null = null;
  for (const k of keys) {
    if (k.suite !== X25519_SUITE || k.publicKey.length !== 32) continue;
    if (!(k.notBefore <= now && (k.notAfter === null || now < k.notAfter))) continue;
    if (!best || k.notBefore > best.notBefore || (k.notBefore === best.notBefore && k.keyId > best.keyId)) best = k;
  }
  return best;
}

/** Seal one report of `window` to `key`: enc ‖ ct ‖ tag (a fresh ephemeral key each call). */
export async function sealReport(key: WireKey, window: number, report: Report): Promise<Uint8Array> {
  return hpkeSeal(key.publicKey, reportInfo(report.metric, key.keyId, window), new Uint8Array(0), packPlaintext(report));
}
