/**
 * The delivery policy as a pure function: `decide(rows, view, now)` -> what to do next.
 * `Reporter` does the I/O around it (fetch the config, seal, send, delete); this module
 * does none, so its cases are a table in the tests.
 *
 * - Send: the oldest row's (metric, window) group, whole (a histogram's real report and
 *   its fakes go in one call), once the config is fresh, the params still match and a
 *   key is usable (sealing required).
 * - Drop(reason): its window is past the metric's disposal age ("expired"); its params
 *   are no longer served after a refetch ("params_changed"); a histogram that would go
 *   in the clear, or params above the device's privacy ceiling ("refused").
 * - Refetch: no config, an expired one, or one that does not know the row's params or
 *   has no usable key (once per round: `view.refetched`).
 * - Offline: nothing can go now (no usable key after a refetch).
 * - Wait: nothing is queued.
 *
 * What the shuffler answers is classified by `outcome` (the same table for every send).
 */
import type { DeviceConfig, MetricConfig } from "./config.js";
import { chooseKey } from "./sealed.js";
import type { StoredRow } from "./outbox.js";

export type Decision =
  | { kind: "send"; metric: string; window: number; rows: StoredRow[] }
  | { kind: "drop"; rows: StoredRow[]; reason: string }
  | { kind: "refetch"; why: string }
  | { kind: "offline"; why: string }
  | { kind: "wait" };

export interface PolicyView {
  config: DeviceConfig | null;
  /** local unix seconds when the config was received */
  fetchedAt: number;
  /** server time - local time, seconds */
  offset: number;
  /** a refetch was made in this round already */
  refetched: boolean;
  sealing: "required" | "off";
  /** why a metric's served params are above the device's ceiling, or null */
  ceiling: (metric: string, mc: MetricConfig) => string | null;
}

/** The collection window of local time `now` under `config` (server-corrected). */
export function windowAt(now: number, offset: number, windowSeconds: number): number {
  return Math.floor((now + offset) / windowSeconds);
}

export function decide(rows: readonly StoredRow[], view: PolicyView, now: number): Decision {
  if (!rows.length) return { kind: "wait" };
  const config = view.config;
  if (!config || now - view.fetchedAt >= config.cacheSeconds || now < view.fetchedAt) {
    if (!view.refetched || !config) return { kind: "refetch", why: config ? "the config expired" : "no config" };
  }
  if (!config) return { kind: "offline", why: "no config" };
  const ws = config.windowSeconds;
  const expired = rows.filter((r) => {
    const age = config.metrics.get(r.metric)?.disposalSeconds ?? 0;
    return age > 0 && (r.window + 1) * ws + age <= now + view.offset;
  });
  if (expired.length) return { kind: "drop", rows: expired, reason: "expired" };
  const first = rows[0]!;
  const group = rows.filter((r) => r.metric === first.metric && r.window === first.window);
  const mc = config.metrics.get(first.metric);
  const stale = group.filter((r) => !mc || BigInt(r.fp) !== mc.fingerprint);
  if (stale.length) {
    if (!view.refetched) return { kind: "refetch", why: `params of ${first.metric} not served` };
    return { kind: "drop", rows: stale, reason: "params_changed" };
  }
  if (mc!.histogram && view.sealing !== "required") return { kind: "drop", rows: group, reason: "refused" };
  if (view.ceiling(first.metric, mc!) !== null) return { kind: "drop", rows: group, reason: "refused" };
  if (view.sealing === "required" && !chooseKey(config.keys, now + view.offset)) {
    if (!view.refetched) return { kind: "refetch", why: "no usable aggregator key" };
    return { kind: "offline", why: "the shuffler publishes no usable aggregator key" };
  }
  return { kind: "send", metric: first.metric, window: first.window, rows: group };
}

export type Outcome =
  | { kind: "delivered" }
  | { kind: "drop"; reason: string }
  | { kind: "refetch" }
  | { kind: "retry_later" };

/** What a Submit's failure means for its rows (Connect code and message). */
export function outcome(code: string, message: string, refetched: boolean): Outcome {
  if (code === "failed_precondition") {
    if (message.startsWith("window_closed")) return { kind: "drop", reason: "window_closed" };
    // window_ahead: re-learn the server time once; stale_key: refetch the keys, reseal
    return refetched ? { kind: "retry_later" } : { kind: "refetch" };
  }
  if (code === "invalid_argument") return refetched ? { kind: "drop", reason: "refused" } : { kind: "refetch" };
  return { kind: "retry_later" };
}
