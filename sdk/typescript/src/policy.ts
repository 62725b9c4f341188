/**
 * The delivery policy as pure functions, as `crowdmix.client.delivery` and
 * `crowdmix.client.answers`: `decide(rows, config, now, state)` looks at the oldest group
 * of waiting reports (one metric, one window: a report, or a histogram's real report and
 * its fakes) and answers with one action; `Reporter` does the I/O and asks again.
 *
 * - send: seal (or not) and submit the group, with its window and report ids;
 * - drop: never deliverable (window closed or of another length, params no longer
 *   served, above the privacy ceiling, refused): delete it, counted under `reason`;
 * - refetch: fetch the config first (none yet, expired, or an answer saying ours is
 *   outdated — at most once per pass);
 * - wait: nothing to do now (`problem`: something the app should hear of);
 * - offline: stop and back off (unreachable, or a refusal retrying now cannot fix).
 *
 * A report's window is fixed when it is claimed (the device clock corrected once by the
 * server time of the config); one more than TOLERANCE_WINDOWS behind the current one is
 * closed at the shuffler and dropped without asking it.
 */
import type { DeviceConfig, MetricConfig } from "./config.js";
import type { StoredRow } from "./outbox.js";
import type { WireKey } from "./proto.js";
import { chooseKey } from "./sealed.js";

export const TOLERANCE_WINDOWS = 1;

/** The config in use, when it arrived (local unix s) and the server's clock offset. */
export interface CachedConfig {
  config: DeviceConfig;
  fetchedAt: number;
  offset: number;
}

/** The collection window at local time `now`: ⌊(now + offset) / window_seconds⌋. */
export function windowAt(now: number, offset: number, windowSeconds: number): number {
  return Math.floor((now + offset) / windowSeconds);
}

export type Action = "retry" | "refetch" | "drop" | "fatal";

/** A classified refusal of the shuffler (`classify`). */
export interface Answer {
  action: Action;
  reason: string;
  message: string;
  /** for refetch: what the same answer means once the config was fetched again */
  afterRefetch: Action;
}

/**
 * The action for a call that failed with Connect `code` and `message` (which starts
 * with the shuffler's reason, "window_closed: ..."): one table for every sender.
 */
export function classify(code: string, message: string): Answer {
  const head = message.split(":", 1)[0]!.trim();
  const reason = message.includes(":") && /^[A-Za-z_]\w*$/.test(head) ? head : "";
  const msg = message ? `${code}: ${message}` : code;
  const a = (action: Action, r: string, afterRefetch: Action = "retry"): Answer => ({ action, reason: r, message: msg, afterRefetch });
  if (code === "failed_precondition") return reason === "window_closed" ? a("drop", reason) : a("refetch", reason || code);
  if (code === "invalid_argument") return reason === "protocol_unsupported" ? a("fatal", reason) : a("refetch", reason || code, "drop");
  if (code === "unauthenticated" || code === "permission_denied" || code === "unimplemented") return a("fatal", code);
  return a("retry", code);
}

export interface SendState {
  sealing: "required" | "off";
  /** why a metric's served params are above the device's ceiling, or null */
  ceiling: (metric: string, mc: MetricConfig) => string | null;
  /** the config was fetched (or tried) in this pass */
  refetched: boolean;
  /** why that fetch failed */
  fetchFailure: string | null;
  /** the shuffler's refusal of this group's last attempt in this pass */
  answer: Answer | null;
}

export type Decision =
  | { kind: "send"; rows: StoredRow[]; window: number; key: WireKey | null }
  | { kind: "drop"; ids: string[]; reason: string; message?: string }
  | { kind: "refetch"; reason: string }
  | { kind: "wait"; problem?: string }
  | { kind: "offline"; reason: string; fatal?: boolean };

const failed = (a: Answer | null, fallback: string): Decision =>
  a ? { kind: "offline", reason: a.message, fatal: a.action === "fatal" } : { kind: "offline", reason: fallback };

/** The next action for `rows` (one group, oldest first; empty: nothing waits) at local time `now`. */
export function decide(rows: readonly StoredRow[], cached: CachedConfig | null, now: number, state: SendState): Decision {
  if (!cached) return state.refetched ? { kind: "offline", reason: state.fetchFailure ?? "no config yet" } : { kind: "refetch", reason: "no config yet" };
  const { config } = cached;
  if (now >= cached.fetchedAt + config.cacheSeconds && !state.refetched) return { kind: "refetch", reason: "the config expired" };
  if (!rows.length) return { kind: "wait" };
  const first = rows[0]!;
  const ids = rows.map((r) => r.id);
  if (first.windowSeconds !== config.windowSeconds) return { kind: "drop", ids, reason: "window_changed" };
  if (first.window < windowAt(now, cached.offset, config.windowSeconds) - TOLERANCE_WINDOWS) return { kind: "drop", ids, reason: "window_closed" };
  const answer = state.answer;
  if (answer) {
    if (answer.action === "drop") return { kind: "drop", ids, reason: answer.reason, message: answer.message };
    if (answer.action === "refetch") {
      if (!state.refetched) return { kind: "refetch", reason: answer.message };
      if (answer.afterRefetch === "drop") return { kind: "drop", ids, reason: "refused", message: answer.message };
    }
    return failed(answer, answer.message);
  }
  const mc = config.metrics.get(first.metric);
  if (!mc || rows.some((r) => BigInt(r.fp) !== mc.fingerprint)) {
    if (!state.refetched) return { kind: "refetch", reason: `metric ${first.metric}: the reports' params are not in the config` };
    return { kind: "drop", ids, reason: "params_changed" };
  }
  if (state.sealing === "off" && (mc.histogram || !(mc.rappor || mc.basic))) {
    // nor is a report of an encoding this build does not carry (another build made it)
    const why = mc.histogram ? "a shuffled histogram" : `encoding ${mc.encoding}, not in this build,`;
    return { kind: "drop", ids, reason: "refused", message: `metric ${first.metric}: ${why} is never sent clear` };
  }
  const refusal = state.ceiling(first.metric, mc);
  if (refusal !== null) return { kind: "drop", ids, reason: "refused_by_ceiling", message: refusal };
  if (state.sealing === "off") return { kind: "send", rows: [...rows], window: first.window, key: null };
  const key = chooseKey(config.keys, now + cached.offset);
  if (!key) {
    if (!state.refetched) return { kind: "refetch", reason: "no aggregator key usable now" };
    // never downgraded to clear reports: they wait for a config with a key
    return { kind: "wait", problem: "the shuffler publishes no aggregator key usable now: reports wait (sealing 'required' never sends them clear)" };
  }
  return { kind: "send", rows: [...rows], window: first.window, key };
}

/** The oldest group: the first row's metric and window, all its rows. */
export function nextGroup(rows: readonly StoredRow[]): StoredRow[] {
  const first = rows[0];
  return first ? rows.filter((r) => r.metric === first.metric && r.window === first.window) : [];
}
