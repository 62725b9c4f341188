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
 *   dropped them), counting each row actually removed once.
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
  counters: Record<string, number>;
  config: CachedConfig | null;
}

export const emptyState = (): OutboxState => ({ rows: [], claims: {}, counters: {}, config: null });

/** Where the document lives. `update` is atomic and durable before it resolves. */
export interface Backend {
  read(): Promise<OutboxState>;
  update<T>(fn: (s: OutboxState) => T): Promise<T>;
  close(): Promise<void>;
}

export type ClaimResult = "claimed" | "taken" | "full";

export class Outbox {
  /** The state as last read or written by this process (counters(), queued). */
  snapshot: OutboxState = emptyState();

  constructor(
    private readonly backend: Backend,
    private readonly maxReports: number,
    private readonly maxBytes: number,
  ) {}

  async load(): Promise<OutboxState> {
    this.snapshot = await this.backend.read();
    return this.snapshot;
  }

  private async update<T>(fn: (s: OutboxState) => T): Promise<T> {
    return this.backend.update((s) => {
      const out = fn(s);
      this.snapshot = s;
      return out;
    });
  }

  /**
   * Claim `metric`'s report of `window` (of `windowSeconds`) with its rows. Windows
   * compare by the time they cover, so a change of window length cannot reopen time
   * already claimed.
   */
  claim(metric: string, window: number, windowSeconds: number, rows: StoredRow[]): Promise<ClaimResult> {
    return this.update((s) => {
      const claimedUntil = s.claims[metric];
      if (claimedUntil !== undefined && window * windowSeconds < claimedUntil) return "taken";
      const bytes = s.rows.reduce((n, r) => n + r.bits.length / 2, 0) + rows.reduce((n, r) => n + r.bits.length / 2, 0);
      if (s.rows.length + rows.length > this.maxReports || bytes > this.maxBytes) return "full";
      s.claims[metric] = (window + 1) * windowSeconds;
      s.rows.push(...rows);
      return "claimed";
    });
  }

  /** Delete the rows with these ids; count each row removed under `outcome`. */
  remove(ids: readonly string[], outcome: string): Promise<number> {
    const gone = new Set(ids);
    return this.update((s) => {
      const before = s.rows.length;
      s.rows = s.rows.filter((r) => !gone.has(r.id));
      const n = before - s.rows.length;
      if (n) s.counters[outcome] = (s.counters[outcome] ?? 0) + n;
      return n;
    });
  }

  setConfig(config: CachedConfig): Promise<void> {
    return this.update((s) => {
      s.config = config;
    });
  }

  close(): Promise<void> {
    return this.backend.close();
  }
}

/** In-memory backend: state that resets with the process (tests, tools). */
export class MemoryBackend implements Backend {
  private state = emptyState();

  async read(): Promise<OutboxState> {
    return structuredClone(this.state);
  }

  async update<T>(fn: (s: OutboxState) => T): Promise<T> {
    const s = structuredClone(this.state);
    const out = fn(s);
    this.state = s;
    return out;
  }

  async close(): Promise<void> {}
}
