/**
 * `Reporter`: what an app embeds. A report claimed is a report delivered.
 *
 *     const reporter = await openReporter({ url: "https://shuffler.example:7443", token });
 *     await reporter.report("theme", "dark");   // true: this window's report is made and queued
 *     await reporter.flush(2000);               // the number still queued
 *     await reporter.close();
 *
 * - Config from the shuffler (`GetConfig`): params, window length and tolerance, keys and
 *   the server's time; cached in the outbox with its lifetime. The server's time is the
 *   answer's plus the monotonic time since (`performance.now()`), so a wall clock set by
 *   the user moves no window; it picks each report's window (policy.ts).
 * - One report per (metric, window), durable (`Outbox`); it keeps its window and report
 *   id through every retry, across restarts; the shuffler files it under that window or
 *   refuses it (`window_closed`: dropped and counted; `window_ahead`: the server time is
 *   re-learnt once and the report waits).
 * - Sealing required by default: sealed when sent (HPKE to the aggregator's newest
 *   usable key); a shuffler publishing no key gets nothing. `sealing: "off"` opts out.
 * - Privacy ceiling: served params less private than `maxEpsilon` per report (RAPPOR's
 *   ε_1, a basic mechanism's ε, a histogram's ε_L, a heavy-hitters round's ε) or
 *   `maxEpsilonInf` (RAPPOR's ε_∞) make no report; a histogram without local
 *   randomization needs `allowUnrandomizedHistograms` (each kind's figures: its `Encoding`).
 * - Heavy hitters: a report is encoded against the round served for its window, or not
 *   made (`no_round`: the config is fetched again; `not_this_round`: the device is in
 *   another round of the discovery).
 * - Never throws into the app after construction: `report` resolves to false, `flush`
 *   to the number still queued, and `lastError` says why.
 */
import { type Ceilings, type DeviceConfig, type Encode, type Encoding, type MetricConfig, Refusal, readConfig } from "./config.js";
import { call } from "./connect.js";
import { type Outbox, type StoredRow } from "./outbox.js";
import { type Answer, type CachedConfig, type Reading, type SendState, CLOCK_SLACK, classify, decide, drifted, expired, learnt, nextGroup, restored, serverNow, windowOf } from "./policy.js";
import { type WireKey, type WireReport, decodeSubmitResponse, encodeSubmitRequest } from "./proto.js";
import { type RandomBytes, secureRandomBytes } from "./random.js";
import { PROTOCOL_VERSION, type Report, fromHex, toHex } from "./report.js";
import { chooseKey, sealReport } from "./sealed.js";

export interface ReporterOptions {
  /** The shuffler's HTTP port, e.g. "https://shuffler.example:7443". */
  url: string;
  /** The app's bearer token. */
  token?: string;
  sealing?: "required" | "off";
  maxEpsilon?: number;
  maxEpsilonInf?: number;
  allowUnrandomizedHistograms?: boolean;
  maxReports?: number;
  maxBytes?: number;
  /** One request's timeout (ms). */
  timeoutMs?: number;
  backoffBaseMs?: number;
  backoffCapMs?: number;
  /** Send from a background timer (default true); false: only `flush` sends. */
  background?: boolean;
  /** The wall clock, unix seconds (tests). */
  clock?: () => number;
  /** A monotonic clock, seconds (tests); default performance.now() / 1000. */
  monotonic?: () => number;
  /** The encoders' randomness (tests); default crypto.getRandomValues. */
  randomBytes?: RandomBytes;
  fetch?: typeof fetch;
  /**
   * A GetConfig answer shipped with the app (`crowdmix config export`): the first report
   * is made with it even offline; a fresh one is fetched as soon as the shuffler answers.
   */
  bundledConfig?: Uint8Array;
}

/** What `report` did (the Python SDK's `ReportStatus` values). */
export type ReportStatus =
  | "claimed"
  | "already_reported_this_window"
  | "no_config"
  | "unknown_metric"
  | "invalid_value"
  | "refused_by_ceiling"
  | "refused_unsealed"
  | "no_round"
  | "not_this_round"
  | "outbox_full"
  | "internal_error"
  | "closed";

export const MAX_EPSILON = 10;
export const MAX_EPSILON_INF = 20;
const CONFIG_WAIT_MS = 2000;
const EARLIEST = 1577836800; // 2020-01-01: a server time before it is not plausible
const LATEST = 4102444800; // 2100-01-01
const MAX_STEPS = 1000; // decisions in one round: a bound, never reached by a sane outbox

/** Why `mc`'s served params are above the ceilings `o`, or null (by the encoding of its kind among `encodings`). */
export function ceilingProblem(metric: string, mc: MetricConfig, o: Ceilings, encodings: readonly Encoding[]): string | null {
  for (const e of encodings) {
    const problem = e.ceiling(metric, mc, o);
    if (problem !== undefined) return problem;
  }
  return null; // an encoding this build leaves out: no report is made here
}

function rowOf(r: Report, window: number, windowSeconds: number): StoredRow {
  return { id: toHex(r.reportId), metric: r.metric, window, windowSeconds, cohort: r.cohort, bits: toHex(r.bits), fp: r.fingerprint.toString() };
}

function reportOf(r: StoredRow): Report {
  return { metric: r.metric, cohort: r.cohort, bits: fromHex(r.bits), fingerprint: BigInt(r.fp), reportId: fromHex(r.id) };
}

export class Reporter {
  /** Why the last report or send did not go through (null after a success). */
  lastError: string | null = null;
  /** What the last `report` call did. */
  lastStatus: ReportStatus | null = null;
  private _cfg: CachedConfig | null = null;
  private _encoders = new Map<string, { fp: bigint; enc: Encode }>();
  private _closed = false;
  private _round: Promise<boolean> | null = null;
  private _timer: ReturnType<typeof setTimeout> | null = null;
  private _failures = 0;
  private _prepared: { ids: string[]; body: Uint8Array }[] = [];
  private readonly _o: Required<Omit<ReporterOptions, "token" | "fetch" | "randomBytes" | "bundledConfig">> & Pick<ReporterOptions, "token" | "fetch">;
  private readonly _rand: RandomBytes;

  /** `encodings`: the kinds of metric this reporter reports (the entry point's). */
  constructor(
    private readonly _outbox: Outbox,
    private readonly _secret: Uint8Array,
    options: ReporterOptions,
    private readonly _encodings: readonly Encoding[],
  ) {
    if (!options.url) throw new RangeError("url must name the shuffler's HTTP port");
    const sealing = options.sealing ?? "required";
    if (sealing !== "required" && sealing !== "off") throw new RangeError(`sealing must be 'required' or 'off', got ${String(sealing)}`);
    for (const k of ["maxEpsilon", "maxEpsilonInf"] as const) {
      const v = options[k];
      if (v !== undefined && !(typeof v === "number" && v > 0)) throw new RangeError(`${k} must be a positive number (Infinity: no ceiling)`);
    }
    this._o = {
      url: options.url,
      token: options.token,
      sealing,
      maxEpsilon: options.maxEpsilon ?? MAX_EPSILON,
      maxEpsilonInf: options.maxEpsilonInf ?? MAX_EPSILON_INF,
      allowUnrandomizedHistograms: options.allowUnrandomizedHistograms ?? false,
      maxReports: options.maxReports ?? 1000,
      maxBytes: options.maxBytes ?? 1 << 20,
      timeoutMs: options.timeoutMs ?? 10000,
      backoffBaseMs: options.backoffBaseMs ?? 1000,
      backoffCapMs: options.backoffCapMs ?? 300000,
      background: options.background ?? true,
      clock: options.clock ?? (() => Date.now() / 1000),
      monotonic: options.monotonic ?? (() => performance.now() / 1000),
      fetch: options.fetch,
    };
    this._rand = options.randomBytes ?? secureRandomBytes;
    const cached = this._outbox.snapshot.config;
    if (cached) {
      try {
        // a monotonic reading of another page or process means nothing here: the wall
        // clock and the offset stored with the answer, until it expires
        this._cfg = restored(readConfig(fromHex(cached.answer), this._encodings), cached.fetchedAt, cached.offset, this._now());
      } catch {
        this._cfg = null; // a cached answer this SDK cannot read: fetch a new one
      }
    }
    if (!this._cfg && options.bundledConfig) {
      // made before this device's clock was ever compared with the server's: the wall
      // clock stands in, and it is already expired, so a fresh one is fetched at once
      const now = this._now();
      this._cfg = { config: readConfig(options.bundledConfig, this._encodings), serverTime: now.wall, at: now, age: Infinity };
    }
    if (this._o.background && this._outbox.snapshot.rows.length) this._schedule(0);
  }

  /** Reports claimed and not yet acknowledged. */
  get queued(): number {
    return this._outbox.snapshot.rows.length;
  }

  /** Reports delivered, and those that left without delivery, by reason. */
  counters(): Record<string, number> {
    return {
      delivered: 0,
      window_closed: 0,
      window_changed: 0,
      refused: 0,
      refused_by_ceiling: 0,
      window_ahead: 0,
      params_changed: 0,
      round_changed: 0,
      ...this._outbox.snapshot.counters,
    };
  }

  /** The current collection window (server-corrected clock), or null without a config. */
  window(): number | null {
    return this._cfg ? windowOf(this._cfg, this._now()) : null;
  }

  /**
   * Make, store and queue this window's report of `value` for `metric`. Resolves to true
   * when claimed, false when not; `lastStatus` says why (the Python SDK's ReportStatus
   * values) and `lastError` in words. Every refusal but "already reported" is counted in
   * `counters()` under its status.
   */
  async report(metric: string, value: string | number | Uint8Array): Promise<boolean> {
    try {
      if (this._closed) return this._refuse("closed", "the reporter is closed");
      if (!this._cfg || expired(this._cfg, this._now())) await this._fetchConfig(CONFIG_WAIT_MS);
      const cfg = this._cfg;
      if (!cfg) return this._refuse("no_config", `${this.lastError}, and no bundledConfig was given`);
      const mc = cfg.config.metrics.get(metric);
      if (!mc) return this._refuse("unknown_metric", `metric ${String(metric)} is not in the shuffler's config`);
      if (mc.sealedOnly && this._o.sealing !== "required")
        return this._refuse("refused_unsealed", `metric ${metric}: ${mc.sealedOnly} is sent sealed or not at all`);
      const problem = ceilingProblem(metric, mc, this._o, this._encodings);
      if (problem) return this._refuse("refused_by_ceiling", `${problem}; no report made`);
      const ws = cfg.config.windowSeconds;
      const window = windowOf(cfg, this._now());
      const enc = this._encoder(metric, mc);
      if (!enc) return this._refuse("unknown_metric", `metric ${metric}: encoding ${mc.encoding} is not in this build`);
      let reports: Report[];
      try {
        reports = await enc(value, window, mc);
      } catch (e) {
        if (!(e instanceof Refusal)) return this._refuse("invalid_value", `metric ${metric}: ${(e as Error).message}`);
        if (e.refetchAfter !== undefined && this._cfg === cfg && cfg.age + (this._now().mono - cfg.at.mono) >= e.refetchAfter) {
          this._cfg = { ...cfg, age: Infinity }; // fetched again
          if (this._o.background) this._schedule(0);
        }
        return this._refuse(e.status, e.message);
      }
      const result = await this._outbox.claim(metric, window, ws, reports.map((r) => rowOf(r, window, ws)));
      if (result === "full") return this._refuse("outbox_full", `the outbox holds ${this._o.maxReports} reports or ${this._o.maxBytes} bytes`);
      if (result === "taken") return this._refuse("already_reported_this_window", "");
      this.lastStatus = "claimed";
      this.lastError = null;
      if (this._o.background) this._schedule(0);
      return true;
    } catch (e) {
      return this._refuse("internal_error", `report(${String(metric)}): ${(e as Error).message}`);
    }
  }

  private async _refuse(status: ReportStatus, detail: string): Promise<false> {
    this.lastStatus = status;
    this.lastError = detail || null;
    if (status !== "already_reported_this_window" && status !== "closed")
      await this._outbox.count(status).catch(() => undefined); // the result says it; the count is best effort
    return false;
  }

  /** Send what waits for up to `timeoutMs`; resolves to the number still queued. */
  async flush(timeoutMs = 5000): Promise<number> {
    try {
      if (!this._closed) {
        // a background pass in progress goes first; the caller waits timeoutMs at most
        let timer: ReturnType<typeof setTimeout> | undefined;
        const timeout = new Promise<void>((resolve) => {
          timer = setTimeout(resolve, timeoutMs);
        });
        await Promise.race([this._runRound(Date.now() + timeoutMs), timeout]);
        clearTimeout(timer);
      }
    } catch (e) {
      this.lastError = (e as Error).message;
    }
    return this.queued;
  }

  /** The platform says the network is back: send now, backoff reset. */
  networkAvailable(): void {
    this._failures = 0;
    if (this._o.background && !this._closed && this.queued) this._schedule(0);
  }

  /** Stop sending and close the outbox (what waits stays stored; flush first to send it). */
  async close(): Promise<void> {
    if (this._closed) return;
    this._closed = true;
    if (this._timer) clearTimeout(this._timer);
    try {
      await this._round;
    } catch {
      // already recorded in lastError
    }
    await this._outbox.close().catch(() => undefined);
  }

  /**
   * The page is going away (pagehide, or hidden): send what waits with `fetch` keepalive,
   * synchronously, from bodies sealed in advance. Acknowledged rows are deleted if the
   * page lives long enough to hear it; otherwise they are sent again later with the same
   * ids (the aggregator counts an id once).
   */
  sendBeforeUnload(): void {
    if (this._closed) return;
    for (const p of this._prepared) {
      void call(this._o.url, "Submit", p.body, { token: this._o.token, timeoutMs: this._o.timeoutMs, keepalive: true, fetch: this._o.fetch })
        .then(async (r) => {
          if (r.ok) await this._outbox.remove(p.ids, "delivered");
        })
        .catch(() => undefined);
    }
  }

  // -- internals -------------------------------------------------------------

  private _now(): Reading {
    return { wall: this._o.clock(), mono: this._o.monotonic() };
  }

  private _fail(why: string): false {
    this.lastError = why;
    return false;
  }

  private _encoder(metric: string, mc: MetricConfig): Encode | undefined {
    const have = this._encoders.get(metric);
    if (have && have.fp === mc.fingerprint) return have.enc;
    for (const e of this._encodings) {
      const enc = e.encoder(metric, mc, this._secret, this._rand, this._o.maxEpsilon);
      if (enc) {
        this._encoders.set(metric, { fp: mc.fingerprint, enc });
        return enc;
      }
    }
    return undefined;
  }

  private async _fetchConfig(timeoutMs: number): Promise<boolean> {
    const r = await call(this._o.url, "GetConfig", new Uint8Array(0), { token: this._o.token, timeoutMs, fetch: this._o.fetch });
    if (!r.ok) {
      this.lastError = `GetConfig: ${r.code}: ${r.message}`;
      await this._keepServerTime();
      return false;
    }
    const received = this._now();
    let config: DeviceConfig;
    try {
      config = readConfig(r.body, this._encodings);
    } catch (e) {
      this.lastError = `GetConfig: ${(e as Error).message}`;
      return false;
    }
    if (!(config.serverTime >= EARLIEST && config.serverTime <= LATEST)) {
      this.lastError = `GetConfig: the server time ${config.serverTime} is not a plausible time`;
      return false;
    }
    // stored with the wall clock's offset, for a later page or process (`restored`)
    await this._outbox.setConfig({ answer: toHex(r.body), fetchedAt: received.wall, offset: config.serverTime - received.wall });
    this._cfg = { config, serverTime: config.serverTime, at: received, age: 0 };
    return true;
  }

  /**
   * The wall clock was set since this process learnt the server time and the fetch that
   * would correct it failed: store the offset of the server time in use (the monotonic
   * one) against the wall clock as it now reads, so a restart before the next fetch names
   * the windows this process names.
   */
  private async _keepServerTime(): Promise<void> {
    const c = this._cfg;
    const now = this._now();
    const stored = this._outbox.snapshot.config;
    if (!c || !stored || !learnt(c) || !drifted(c, now)) return;
    const offset = serverNow(c, now) - now.wall;
    if (Math.abs(stored.offset - offset) > CLOCK_SLACK)
      await this._outbox.setConfig({ answer: stored.answer, fetchedAt: now.wall - (now.mono - c.at.mono), offset });
  }

  private _schedule(delayMs: number): void {
    if (this._closed) return;
    if (this._timer) clearTimeout(this._timer);
    this._timer = setTimeout(() => {
      this._timer = null;
      void this._runRound(Date.now() + this._o.timeoutMs * 3).then((done) => {
        if (done) this._failures = 0;
        else {
          this._failures++;
          const cap = Math.min(this._o.backoffCapMs, this._o.backoffBaseMs * 2 ** Math.min(this._failures, 30));
          this._schedule(Math.max(1, Math.random() * cap)); // full jitter
        }
      });
    }, delayMs);
    (this._timer as { unref?: () => void }).unref?.(); // never keeps a Node app alive
  }

  /** One sending round at a time; resolves true when nothing failed. */
  private _runRound(deadline: number): Promise<boolean> {
    const prev = this._round ?? Promise.resolve(true);
    const next = prev
      .catch(() => true)
      .then(() => this._sendAll(deadline))
      .catch((e: Error) => this._fail(`the sender failed: ${e.message}`));
    this._round = next;
    return next;
  }

  /** Act on `decide` until it says to wait or to stop (see policy.ts); true unless offline. */
  private async _sendAll(deadline: number): Promise<boolean> {
    let state: SendState = {
      sealing: this._o.sealing,
      ceiling: (m, mc) => ceilingProblem(m, mc, this._o, this._encodings),
      refetched: false,
      fetchFailure: null,
      answer: null,
    };
    const refused = new Map<string, Answer>(); // this pass's refusals, per group
    for (let step = 0; step < MAX_STEPS; step++) {
      if (this._closed && step > 0) return false;
      const left = deadline - Date.now();
      if (left <= 0) return this._fail("out of time");
      const rows = nextGroup((await this._outbox.load()).rows);
      const group = rows.length ? `${rows[0]!.metric}\0${rows[0]!.window}` : "";
      const d = decide(rows, this._cfg, this._now(), { ...state, answer: refused.get(group) ?? null });
      if (d.kind === "send") {
        const body = await this._request(d.rows, d.window, d.key);
        const r = await call(this._o.url, "Submit", body, { token: this._o.token, timeoutMs: Math.min(this._o.timeoutMs, left), fetch: this._o.fetch });
        if (r.ok) {
          decodeSubmitResponse(r.body);
          await this._outbox.remove(d.rows.map((x) => x.id), "delivered");
        } else refused.set(group, classify(r.code, r.message));
      } else if (d.kind === "drop") {
        if (d.reason === "window_ahead") await this._outbox.withdraw(d.ids); // never taken: the claim moves back
        else await this._outbox.remove(d.ids, d.reason);
      } else if (d.kind === "wait") {
        this.lastError = d.problem ?? null;
        if (!d.problem) this._prepared = [];
        return d.problem === undefined;
      } else if (d.kind === "offline") {
        await this._prepare();
        return this._fail(d.reason);
      } else {
        // refetch: at most once a pass, then send again what was refused
        const failure = await this._fetchConfig(Math.min(this._o.timeoutMs, left)) ? null : this.lastError;
        state = { ...state, refetched: true, fetchFailure: failure };
        refused.clear();
      }
    }
    return this._fail("too many steps in one sending pass");
  }

  /** One Submit body for one group of rows: sealed to `key`, or clear (key null). */
  private async _request(rows: readonly StoredRow[], window: number, key: WireKey | null): Promise<Uint8Array> {
    const wire: WireReport[] = [];
    // a report of a metric served in rounds (heavy hitters) names its round's fingerprint
    // beside its seal too: the shuffler refuses one of another round than it serves for the window
    const roundBound = !!this._cfg?.config.metrics.get(rows[0]!.metric)?.rounds;
    for (const row of rows) {
      const r = reportOf(row);
      wire.push(
        key
          ? { metric: r.metric, window, keyId: key.keyId, sealed: await sealReport(key, window, r), fingerprint: roundBound ? r.fingerprint : 0n }
          : { metric: r.metric, window, cohort: r.cohort, bits: r.bits, fingerprint: r.fingerprint, reportId: r.reportId },
      );
    }
    return encodeSubmitRequest(wire, PROTOCOL_VERSION);
  }

  /**
   * Seal what waits now, so that a page going away can send it synchronously. Only the
   * groups not sealed yet are sealed (to the key usable now); acknowledged ones are gone.
   */
  private async _prepare(): Promise<void> {
    const cfg = this._cfg;
    if (!cfg) return;
    const key = chooseKey(cfg.config.keys, serverNow(cfg, this._now()));
    if (this._o.sealing === "required" && !key) return; // nothing is sent clear
    const groups = new Map<string, StoredRow[]>();
    for (const r of this._outbox.snapshot.rows) {
      const k = `${r.metric}\0${r.window}`;
      groups.set(k, [...(groups.get(k) ?? []), r]);
    }
    const have = new Map(this._prepared.map((p) => [p.ids.join(","), p]));
    const out: { ids: string[]; body: Uint8Array }[] = [];
    for (const rows of groups.values()) {
      const ids = rows.map((r) => r.id);
      out.push(have.get(ids.join(",")) ?? { ids, body: await this._request(rows, rows[0]!.window, this._o.sealing === "off" ? null : key) });
    }
    this._prepared = out;
  }

  /** Seal the queued reports in advance (the browser entry calls it after each claim). */
  async prepareForUnload(): Promise<void> {
    try {
      await this._prepare();
    } catch {
      // best effort
    }
  }
}
