/**
 * The delivery policy as pure functions, as `crowdmix.client.delivery` and
 * `crowdmix.client.answers`: `decide(rows, config, now, state)` looks at the oldest group
 * of waiting reports (one metric, one window: a report, or a histogram's real report and
 * its fakes) and answers with one action; `Reporter` does the I/O and asks again.
 *
 * - send: seal (or not) and submit the group, with its window and report ids;
 * - drop: never deliverable (window closed or of another length, params no longer
 *   served, a heavy-hitters report of another round than its window now serves, above
 *   the privacy ceiling, refused): delete it, counted under `reason`; or
 *   more than a window ahead of a server time learnt here (`window_ahead`: a wall clock
 *   set forward named it): withdrawn, its claim moved back (`Outbox.withdraw`);
 * - refetch: fetch the config first (none yet, expired, or an answer saying ours is
 *   outdated — at most once per pass);
 * - wait: nothing to do now (`problem`: something the app should hear of);
 * - offline: stop and back off (unreachable, or a refusal retrying now cannot fix).
 *
 * `now` is a `Reading` of the device's wall clock and monotonic clock taken together
 * (`decide` reads no clock). The server's time is the config's `server_time` plus the
 * monotonic time since it arrived, so a wall clock set by the user moves no window; the
 * config is fetched again when it is `cacheSeconds` old on the monotonic clock or when the
 * two clocks drifted more than CLOCK_SLACK apart (the clock was set, or the device slept on
 * a monotonic clock that stops in suspend). A config restored by a new page or process runs
 * on the wall clock and the offset stored with it until it expires. A report's window is
 * fixed when it is claimed; one more than the served `windowTolerance` behind the current
 * one is closed at the shuffler and dropped without asking it.
 */
import type { DeviceConfig, MetricConfig } from "./config.js";
import type { StoredRow } from "./outbox.js";
import type { WireKey } from "./proto.js";
import { chooseKey } from "./sealed.js";

/** Seconds the wall and monotonic clocks may drift apart before the server time is fetched again. */
export const CLOCK_SLACK = 60;

/** The device's clocks read together: `wall` (unix s; may be set) and `mono` (s, any origin; this page or process only). */
export interface Reading {
  wall: number;
  mono: number;
}

/**
 * The config in use: the server's clock `serverTime` when the device's clocks read `at`,
 * and how long the answer had been held then (`age`: 0 when fetched by this page or
 * process, Infinity for a bundled one: fetched again at once).
 */
export interface CachedConfig {
  config: DeviceConfig;
  serverTime: number;
  at: Reading;
  age: number;
}

/**
 * An answer stored by an earlier page or process (`fetchedAt`: its wall clock then;
 * `offset`: server − wall seconds): the server time is the wall clock corrected by the
 * offset until the config expires, aged by the wall clock (set back since: expired).
 */
export function restored(config: DeviceConfig, fetchedAt: number, offset: number, now: Reading): CachedConfig {
  const age = now.wall - fetchedAt;
  return { config, serverTime: now.wall + offset, at: now, age: age >= 0 ? age : Infinity };
}

/** The server's clock at `now`: its time at the fetch plus the monotonic time since. */
export const serverNow = (c: CachedConfig, now: Reading): number => c.serverTime + (now.mono - c.at.mono);

/** The collection window at `now`: ⌊server time / window_seconds⌋. */
export const windowOf = (c: CachedConfig, now: Reading): number => Math.floor(serverNow(c, now) / c.config.windowSeconds);

/** The wall and monotonic clocks moved apart by more than CLOCK_SLACK since the fetch. */
export const drifted = (c: CachedConfig, now: Reading): boolean => Math.abs(now.wall - c.at.wall - (now.mono - c.at.mono)) > CLOCK_SLACK;

export const expired = (c: CachedConfig, now: Reading): boolean =>
  c.age + (now.mono - c.at.mono) >= c.config.cacheSeconds || drifted(c, now);

/**
 * The server time is believed: learnt by this page or process (run on the monotonic clock
 * since, even once expired), or restored and not expired. A bundled answer, or a restored
 * one past its lifetime, is only the wall clock: no report is taken for closed on it.
 */
export const trusted = (c: CachedConfig, now: Reading): boolean => learnt(c) || !expired(c, now);

/** The server time was learnt by this page or process (and runs on the monotonic clock). */
export const learnt = (c: CachedConfig): boolean => c.age === 0;

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

/** The next action for `rows` (one group, oldest first; empty: nothing waits) at `now`. */
export function decide(rows: readonly StoredRow[], cached: CachedConfig | null, now: Reading, state: SendState): Decision {
  if (!cached) return state.refetched ? { kind: "offline", reason: state.fetchFailure ?? "no config yet" } : { kind: "refetch", reason: "no config yet" };
  const { config } = cached;
  if (expired(cached, now) && !state.refetched)
    return { kind: "refetch", reason: drifted(cached, now) ? "the device's clock was set (or it slept)" : "the config expired" };
  if (!rows.length) return { kind: "wait" };
  const first = rows[0]!;
  const ids = rows.map((r) => r.id);
  if (first.windowSeconds !== config.windowSeconds) return { kind: "drop", ids, reason: "window_changed" };
  if (first.window < windowOf(cached, now) - config.windowTolerance && trusted(cached, now)) return { kind: "drop", ids, reason: "window_closed" };
  const current = windowOf(cached, now);
  if (first.window > current + 1 && learnt(cached)) {
    // a wall clock set forward named it (a restart on the stored offset): no shuffler took
    // it (its skew allowance is under one window); withdrawn, so the metric is not held
    return { kind: "drop", ids, reason: "window_ahead", message: `metric ${first.metric}: window ${first.window} has not begun` };
  }
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
  // a heavy-hitters report carries its round's fingerprint; a window this config serves no
  // round of (no longer listed) is the shuffler's to judge
  const hh = !!mc?.rounds;
  const expected = hh ? mc?.rounds?.find((x) => x.window === first.window)?.fingerprint : mc?.fingerprint;
  if (!mc || (expected !== undefined && rows.some((r) => BigInt(r.fp) !== expected))) {
    if (!state.refetched) return { kind: "refetch", reason: `metric ${first.metric}: the reports' params are not in the config` };
    // a heavy-hitters report of another round of its window (another shuffler's) cannot be
    // made again, and is never counted against this round
    return { kind: "drop", ids, reason: hh ? "round_changed" : "params_changed" };
  }
  if (state.sealing === "off" && (mc.sealedOnly || !(mc.rappor || mc.basic || mc.heavyHitters))) {
    // nor is a report of an encoding this build does not carry (another build made it)
    const why = mc.sealedOnly ?? `encoding ${mc.encoding}, not in this build,`;
    return { kind: "drop", ids, reason: "refused", message: `metric ${first.metric}: ${why} is never sent clear` };
  }
  const refusal = state.ceiling(first.metric, mc);
  if (refusal !== null) return { kind: "drop", ids, reason: "refused_by_ceiling", message: refusal };
  if (state.sealing === "off") return { kind: "send", rows: [...rows], window: first.window, key: null };
  const key = chooseKey(config.keys, serverNow(cached, now));
  if (!key) {
    if (!state.refetched) return { kind: "refetch", reason: "no aggregator key usable now" };
    // never downgraded to clear reports: they wait for a config with a key
    return { kind: "wait", problem: "no aggregator key usable now: reports wait, never sent clear" };
  }
  return { kind: "send", rows: [...rows], window: first.window, key };
}

/** The oldest group: the first row's metric and window, all its rows. */
export function nextGroup(rows: readonly StoredRow[]): StoredRow[] {
  const first = rows[0];
  return first ? rows.filter((r) => r.metric === first.metric && r.window === first.window) : [];
}
