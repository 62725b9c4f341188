/**
 * The device's durable outbox: claimed reports until the shuffler acknowledges them.
 *
 * One document per app (a file in Node, one IndexedDB record in a browser) holds the
 * rows waiting, per metric the last window claimed, the counters, and the cached
 * GetConfig answer with the clock offset learnt from it. Every change is one atomic
 * read-modify-write of the document (`Backend.update`: a rename in Node, a readwrite
 * transaction in IndexedDB), so a process killed at any instant leaves the state
 * before or after it, never half:
 *
 * - `claim`: the claim of (metric, window) *and* its report rows are written together
 *   (a shuffled histogram's real report and its fakes: all, or none). A metric gets a
 *   report in a window only if no time of that window was claimed for it already: at
 *   most one report per (metric, window), even when the clock goes back.
 * - `remove` deletes rows only after the shuffler acknowledged them (or the policy
 *   dropped them), counting each row actually removed once, and records their windows
 *   as settled (they may have reached a shuffler: never claimed again).
 * - `withdraw` deletes rows named in a window that never began on the server (a wall
 *   clock set forward), counted as `window_ahead`, and moves the metric's claim back to
 *   the latest window of its rows still waiting or settled: none after it was ever
 *   accepted, so the metric is reported in its right window, still once per window.
 * - Bounded: a claim that would pass `maxReports` rows or `maxBytes` of payload is
 *   refused ("full"), claiming nothing; the reports already promised are kept.
 */

export interface StoredRow {
  id: string; // report id, hex
  metric: string;
  window: number;
  windowSeconds: number; // the window's length when claimed
  cohort: number;
  bits: string; // hex
  fp: string; // params fingerprint, decimal
}

export interface CachedConfig {
  answer: string; // ConfigResponse bytes, hex
  fetchedAt: number; // local unix seconds at receipt
  offset: number; // server_time - local receive time, seconds
}

export interface OutboxState {
  rows: StoredRow[];
  /** per metric, the end (unix s, server clock) of the last window claimed */
  claims: Record<string, number>;
  /** per metric, the end of the last window whose report left otherwise than withdrawn */
  settled: Record<string, number>;
  counters: Record<string, number>;
  config: CachedConfig | null;
}

export const emptyState = (): OutboxState => ({ rows: [], claims: {}, settled: {}, counters: {}, config: null });

/** The end (unix s) of a row's window. */
export const endOf = (r: { window: number; windowSeconds: number }): number => (r.window + 1) * r.windowSeconds;

/** One change of the outbox; `applyOp` is what it does to the document. */
export type Op =
  | { kind: "claim"; metric: string; window: number; windowSeconds: number; rows: StoredRow[]; maxReports: number; maxBytes: number }
  | { kind: "remove"; ids: readonly string[]; outcome: string }
  | { kind: "withdraw"; ids: readonly string[] }
  | { kind: "config"; config: CachedConfig }
  | { kind: "count"; name: string };

export type ClaimResult = "claimed" | "taken" | "full";

/** `op` applied to the document `s` (in place): the claim's result, or the rows removed. */
export function applyOp(s: OutboxState, op: Op): ClaimResult | number {
  if (op.kind === "claim") {
    const claimedUntil = s.claims[op.metric];
    if (claimedUntil !== undefined && op.window * op.windowSeconds < claimedUntil) return "taken";
    const bytes = [...s.rows, ...op.rows].reduce((n, r) => n + r.bits.length / 2, 0);
    if (s.rows.length + op.rows.length > op.maxReports || bytes > op.maxBytes) return "full";
    s.claims[op.metric] = (op.window + 1) * op.windowSeconds;
    s.rows.push(...op.rows);
    return "claimed";
  }
  if (op.kind === "remove" || op.kind === "withdraw") {
    const gone = new Set(op.ids);
    const removed = s.rows.filter((r) => gone.has(r.id));
    s.rows = s.rows.filter((r) => !gone.has(r.id));
    const n = removed.length;
    const outcome = op.kind === "remove" ? op.outcome : "window_ahead";
    if (n) s.counters[outcome] = (s.counters[outcome] ?? 0) + n;
    if (op.kind === "remove") for (const r of removed) s.settled[r.metric] = Math.max(s.settled[r.metric] ?? 0, endOf(r));
    else
      for (const metric of new Set(removed.map((r) => r.metric))) {
        const held = Math.max(s.settled[metric] ?? 0, ...s.rows.filter((r) => r.metric === metric).map(endOf));
        if (held > 0) s.claims[metric] = held;
        else delete s.claims[metric];
      }
    return n;
  }
  if (op.kind === "count") {
    s.counters[op.name] = (s.counters[op.name] ?? 0) + 1;
    return 1;
  }
  s.config = op.config;
  return 0;
}

/** Where the outbox lives. `apply` is atomic and durable before it resolves. */
export interface Backend {
  read(): Promise<OutboxState>;
  apply(op: Op): Promise<ClaimResult | number>;
  close(): Promise<void>;
}

export class Outbox {
  /** The state as last read or changed by this process (counters(), queued). */
  snapshot: OutboxState = emptyState();

  constructor(
    private readonly _backend: Backend,
    private readonly _maxReports: number,
    private readonly _maxBytes: number,
  ) {}

  async load(): Promise<OutboxState> {
    this.snapshot = await this._backend.read();
    return this.snapshot;
  }

  /**
   * Claim `metric`'s report of `window` (of `windowSeconds`) with its rows. Windows
   * compare by the time they cover, so a change of window length cannot reopen time
   * already claimed.
   */
  async claim(metric: string, window: number, windowSeconds: number, rows: StoredRow[]): Promise<ClaimResult> {
    const op: Op = { kind: "claim", metric, window, windowSeconds, rows, maxReports: this._maxReports, maxBytes: this._maxBytes };
    const result = (await this._backend.apply(op)) as ClaimResult;
    if (result === "claimed") {
      // a load() that finished meanwhile may hold them already
      const have = new Set(this.snapshot.rows.map((r) => r.id));
      this.snapshot.claims[metric] = Math.max(this.snapshot.claims[metric] ?? 0, (window + 1) * windowSeconds);
      this.snapshot.rows.push(...rows.filter((r) => !have.has(r.id)));
    }
    return result;
  }

  /** Delete the rows with these ids; count each row removed under `outcome`. */
  async remove(ids: readonly string[], outcome: string): Promise<number> {
    const n = (await this._backend.apply({ kind: "remove", ids, outcome })) as number;
    // mirrored by what leaves the snapshot: a load() that finished meanwhile counted them
    const gone = new Set(ids);
    const before = this.snapshot.rows.length;
    this.snapshot.rows = this.snapshot.rows.filter((r) => !gone.has(r.id));
    const left = before - this.snapshot.rows.length;
    if (left) this.snapshot.counters[outcome] = (this.snapshot.counters[outcome] ?? 0) + Math.min(left, n);
    return n;
  }

  /**
   * Delete rows whose window never began on the server (counted as `window_ahead`) and
   * move their metrics' claims back to the latest window still waiting or settled.
   */
  async withdraw(ids: readonly string[]): Promise<number> {
    const n = (await this._backend.apply({ kind: "withdraw", ids })) as number;
    await this.load(); // the claims moved: the backend's word
    return n;
  }

  /** Count one `report` call that made no report, under its status. */
  async count(name: string): Promise<void> {
    await this._backend.apply({ kind: "count", name });
    this.snapshot.counters[name] = (this.snapshot.counters[name] ?? 0) + 1;
  }

  async setConfig(config: CachedConfig): Promise<void> {
    await this._backend.apply({ kind: "config", config });
    this.snapshot.config = config;
  }

  close(): Promise<void> {
    return this._backend.close();
  }
}

/** In-memory backend: state that resets with the process (tests, tools). */
export class MemoryBackend implements Backend {
  private _state = emptyState();

  async read(): Promise<OutboxState> {
    return structuredClone(this._state);
  }

  async apply(op: Op): Promise<ClaimResult | number> {
    return applyOp(this._state, structuredClone(op));
  }

  async close(): Promise<void> {}
}
