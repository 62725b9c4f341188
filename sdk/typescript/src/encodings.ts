/** Every encoding this SDK offers, for the entry points that carry them all. */
import { basicEncoding } from "./basic.js";
import { type DeviceConfig, type Encoding, readConfig } from "./config.js";
import { heavyHittersEncoding } from "./heavy.js";
import { histogramEncoding } from "./histogram.js";
import { rapporEncoding } from "./rappor.js";

export const ALL_ENCODINGS: readonly Encoding[] = [rapporEncoding, basicEncoding, histogramEncoding, heavyHittersEncoding];

/** The GetConfig answer (protobuf bytes) as a DeviceConfig; ParamsError when inconsistent. */
export function parseConfig(answer: Uint8Array, encodings: readonly Encoding[] = ALL_ENCODINGS): DeviceConfig {
  return readConfig(answer, encodings);
}
