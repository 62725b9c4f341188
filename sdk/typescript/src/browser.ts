/**
 * The browser side of every browser entry point: the outbox and the device secret live in
 * IndexedDB (one database per app, `IdbBackend`), and the reporter sends what waits with
 * `fetch` keepalive when the page is hidden or goes away.
 */
import { CrowdmixError } from "./errors.js";
import { type Backend, type CachedConfig, type ClaimResult, type Op, type OutboxState, Outbox, type StoredRow, emptyState, endOf } from "./outbox.js";
import type { Encoding } from "./config.js";
import { Reporter, type ReporterOptions } from "./reporter.js";

const ROWS = "rows"; // one record per report, keyed by report id, `seq` = claim order
const META = "meta"; // "claim:<metric>", "settled:<metric>", "counters", "config", "bytes", "seq", "secret"

function promised<T>(req: IDBRequest<T>): Promise<T> {
  return new Promise((resolve, reject) => {
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error);
  });
}

type Row = StoredRow & { seq: number };

/**
 * The outbox in IndexedDB, a record per report and per claim, so a claim writes what it
 * adds and nothing else. Every change is one readwrite transaction over both stores with
 * strict durability (committed to disk before it resolves); tabs of one app share it.
 */
export class IdbBackend implements Backend {
  constructor(private readonly db: IDBDatabase) {}

  static async open(name: string): Promise<IdbBackend> {
    // version 2: "settled:<metric>" records (Outbox.withdraw moves a claim back to them)
    const req = indexedDB.open(name, 2);
    req.onupgradeneeded = (e) => {
      if (e.oldVersion < 1) {
        req.result.createObjectStore(ROWS, { keyPath: "id" });
        req.result.createObjectStore(META);
      } else if (e.oldVersion < 2) {
        // a database from before: its claims stand for the settled windows (never moved back)
        const meta = req.transaction!.objectStore(META);
        const cursor = meta.openCursor();
        cursor.onsuccess = () => {
          const c = cursor.result;
          if (!c) return;
          const k = String(c.key);
          if (k.startsWith("claim:")) meta.put(c.value, `settled:${k.slice(6)}`);
          c.continue();
        };
      }
    };
    return new IdbBackend(await promised(req));
  }

  private tx<T>(mode: IDBTransactionMode, fn: (rows: IDBObjectStore, meta: IDBObjectStore) => Promise<T>): Promise<T> {
    const t = this.db.transaction([ROWS, META], mode, { durability: "strict" });
    const done = new Promise<void>((resolve, reject) => {
      t.oncomplete = () => resolve();
      t.onabort = t.onerror = () => reject(t.error ?? new Error("IndexedDB transaction aborted"));
    });
    return fn(t.objectStore(ROWS), t.objectStore(META)).then(async (out) => {
      await done;
      return out;
    });
  }

  read(): Promise<OutboxState> {
    return this.tx("readonly", async (rows, meta) => {
      const s = emptyState();
      s.rows = ((await promised(rows.getAll())) as Row[]).sort((a, b) => a.seq - b.seq);
      const keys = (await promised(meta.getAllKeys())) as string[];
      const values = await promised(meta.getAll());
      keys.forEach((k, i) => {
        if (k.startsWith("claim:")) s.claims[k.slice(6)] = values[i] as number;
        else if (k.startsWith("settled:")) s.settled[k.slice(8)] = values[i] as number;
        else if (k === "counters") s.counters = values[i] as Record<string, number>;
        else if (k === "config") s.config = values[i] as CachedConfig;
      });
      return s;
    });
  }

  apply(op: Op): Promise<ClaimResult | number> {
    return this.tx("readwrite", async (rows, meta) => {
      const get = async <T>(k: string, d: T): Promise<T> => ((await promised(meta.get(k))) as T | undefined) ?? d;
      if (op.kind === "claim") {
        // every read at once: one round trip to the database, not four
        const [bytes, claimedUntil, count, seq0] = await Promise.all([
          get("bytes", 0),
          get<number | undefined>(`claim:${op.metric}`, undefined),
          promised(rows.count()),
          get("seq", 0),
        ]);
        if (claimedUntil !== undefined && op.window * op.windowSeconds < claimedUntil) return "taken";
        const adding = op.rows.reduce((n, r) => n + r.bits.length / 2, 0);
        if (count + op.rows.length > op.maxReports || bytes + adding > op.maxBytes) return "full";
        let seq = seq0;
        for (const r of op.rows) rows.put({ ...r, seq: seq++ });
        meta.put(seq, "seq");
        meta.put(bytes + adding, "bytes");
        meta.put((op.window + 1) * op.windowSeconds, `claim:${op.metric}`);
        return "claimed";
      }
      const bytes = await get("bytes", 0);
      if (op.kind === "remove" || op.kind === "withdraw") {
        const removed: Row[] = [];
        let freed = 0;
        for (const id of op.ids) {
          const r = (await promised(rows.get(id))) as Row | undefined;
          if (!r) continue;
          rows.delete(id);
          removed.push(r);
          freed += r.bits.length / 2;
        }
        const n = removed.length;
        if (n) {
          const outcome = op.kind === "remove" ? op.outcome : "window_ahead";
          const counters = await get<Record<string, number>>("counters", {});
          counters[outcome] = (counters[outcome] ?? 0) + n;
          meta.put(counters, "counters");
          meta.put(bytes - freed, "bytes");
        }
        const metrics = new Set(removed.map((r) => r.metric));
        if (op.kind === "remove")
          for (const m of metrics) {
            const end = Math.max(...removed.filter((r) => r.metric === m).map(endOf));
            if (end > (await get(`settled:${m}`, 0))) meta.put(end, `settled:${m}`);
          }
        else if (metrics.size) {
          const left = (await promised(rows.getAll())) as Row[];
          for (const m of metrics) {
            const held = Math.max(await get(`settled:${m}`, 0), ...left.filter((r) => r.metric === m).map(endOf));
            if (held > 0) meta.put(held, `claim:${m}`);
            else meta.delete(`claim:${m}`);
          }
        }
        return n;
      }
      if (op.kind === "count") {
        const counters = await get<Record<string, number>>("counters", {});
        counters[op.name] = (counters[op.name] ?? 0) + 1;
        meta.put(counters, "counters");
        return 1;
      }
      meta.put(op.config, "config");
      return 0;
    });
  }

  /** The device secret: made once (32 CSPRNG bytes) in the same database. */
  secret(): Promise<Uint8Array> {
    return this.tx("readwrite", async (_rows, meta) => {
      let secret = (await promised(meta.get("secret"))) as Uint8Array | undefined;
      if (!(secret instanceof Uint8Array) || secret.length !== 32) {
        secret = crypto.getRandomValues(new Uint8Array(32));
        meta.put(secret, "secret");
      }
      return secret;
    });
  }

  async close(): Promise<void> {
    this.db.close();
  }
}

/** The options of a browser's `openReporter`: `name` is the IndexedDB database (default "crowdmix"). */
export type BrowserReporterOptions = ReporterOptions & { name?: string };

/**
 * Open the app's outbox (IndexedDB database `name`, default "crowdmix") and start a
 * reporter of `encodings` that also sends on `pagehide` and when the page is hidden.
 */
export async function openBrowserReporter(options: BrowserReporterOptions, encodings: readonly Encoding[]): Promise<Reporter> {
  let backend: IdbBackend;
  let secret: Uint8Array;
  const outbox = await (async () => {
    try {
      backend = await IdbBackend.open(options.name ?? "crowdmix");
      secret = await backend.secret();
      const o = new Outbox(backend, options.maxReports ?? 1000, options.maxBytes ?? 1 << 20);
      await o.load();
      return o;
    } catch (e) {
      throw new CrowdmixError(`cannot open the outbox in IndexedDB: ${(e as Error).message}`);
    }
  })();
  const reporter = new Reporter(outbox, secret!, options, encodings);
  const report = reporter.report.bind(reporter);
  reporter.report = async (metric, value) => {
    const ok = await report(metric, value);
    if (ok) void reporter.prepareForUnload();
    return ok;
  };
  if (typeof addEventListener === "function") {
    addEventListener("pagehide", () => reporter.sendBeforeUnload());
    if (typeof document !== "undefined")
      document.addEventListener("visibilitychange", () => {
        if (document.visibilityState === "hidden") reporter.sendBeforeUnload();
      });
  }
  return reporter;
}
