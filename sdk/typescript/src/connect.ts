/**
 * The shuffler's two unary calls over plain HTTP POST in the Connect protocol's unary
 * format (protobuf body, `application/proto`): what a browser can send without a proxy.
 * A failure comes back as `{code, message}` with the Connect code (`unavailable`,
 * `invalid_argument`, ...), "unavailable" too when the network cannot be reached.
 */

export const SERVICE = "crowdmix.v2.Shuffler";

export type CallResult = { ok: true; body: Uint8Array } | { ok: false; code: string; message: string };

// Connect's mapping for an HTTP error that carries no Connect error body.
function codeForStatus(status: number): string {
  if (status === 400) return "internal";
  if (status === 401) return "unauthenticated";
  if (status === 403) return "permission_denied";
  if (status === 404) return "unimplemented";
  if (status === 429 || status === 502 || status === 503 || status === 504) return "unavailable";
  return "unknown";
}

export interface CallOptions {
  token?: string | undefined;
  timeoutMs: number;
  /** Let the request outlive the page (pagehide); fetch caps such bodies at 64 KiB. */
  keepalive?: boolean;
  fetch?: typeof fetch;
}

export async function call(baseUrl: string, method: string, body: Uint8Array, opts: CallOptions): Promise<CallResult> {
  const headers: Record<string, string> = {
    "content-type": "application/proto",
    "connect-protocol-version": "1",
    "connect-timeout-ms": String(Math.max(1, Math.round(opts.timeoutMs))),
  };
  if (opts.token) headers.authorization = `Bearer ${opts.token}`;
  const f = opts.fetch ?? fetch;
  let resp: Response;
  try {
    resp = await f(`${baseUrl.replace(/\/+$/, "")}/${SERVICE}/${method}`, {
      method: "POST",
      headers,
      body: body as unknown as BodyInit,
      keepalive: opts.keepalive ?? false,
      signal: opts.keepalive ? null : AbortSignal.timeout(opts.timeoutMs),
    });
  } catch (e) {
    const err = e as Error;
    const code = err.name === "TimeoutError" || err.name === "AbortError" ? "deadline_exceeded" : "unavailable";
    return { ok: false, code, message: `${method}: ${err.message}` };
  }
  let data: Uint8Array;
  try {
    data = new Uint8Array(await resp.arrayBuffer());
  } catch (e) {
    return { ok: false, code: "unavailable", message: `${method}: ${(e as Error).message}` };
  }
  if (resp.status === 200) return { ok: true, body: data };
  try {
    const err = JSON.parse(new TextDecoder().decode(data)) as { code?: unknown; message?: unknown };
    if (typeof err.code === "string") return { ok: false, code: err.code, message: String(err.message ?? "") };
  } catch {
    // not a Connect error body: classify by the HTTP status
  }
  return { ok: false, code: codeForStatus(resp.status), message: `HTTP ${resp.status}` };
}
