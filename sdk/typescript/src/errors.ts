/**
 * Errors of the SDK, one hierarchy:
 *
 *     CrowdmixError          the SDK cannot do what was asked (bad app dir, closed reporter)
 *     └── ParamsError        invalid params or a served config above the privacy ceiling
 *
 * Only constructors and the encoders throw them; `Reporter`'s methods never throw
 * into the app after construction (they resolve to false / a count, and set `lastError`).
 */
export class CrowdmixError extends Error {
  override name = "CrowdmixError";
}

export class ParamsError extends CrowdmixError {
  override name = "ParamsError";
}
