/**
 * The browser side of every browser entry point: the outbox and the device secret live in
 * IndexedDB (one database per app, `IdbBackend`), and the reporter sends what waits with
 * `fetch` keepalive when the page is hidden or goes away.
 */
import { CrowdmixError } from "./errors.js";
import { type Backend, type ClaimResult, type Op, type OutboxState, Outbox, type StoredRow, applyOp, emptyState } from "./outbox.js";
import type { Encoding } from "./config.js";
import { Reporter, type ReporterOptions } from "./reporter.js";

const ROWS = "rows"; // one record per report, keyed by report id, `seq` = claim order
const META = "meta"; // "claims", "settled", "counters", "config", "secret"
const DOCUMENT = ["claims", "settled", "counters", "config"] as const; // OutboxState's fields but its rows

function promised<T>(req: IDBRequest<T>): Promise<T> {
  return new Promise((resolve, reject) => {
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error);
  });
}

type Row = StoredRow & { seq?: number };

/**
 * The outbox in IndexedDB, a record per report, so a claim writes the rows it adds and
 * no other row. Every change is one readwrite transaction over both stores with strict
 * durability (committed to disk before it resolves) that reads the state, applies the
 * change as `applyOp` does to the in-memory document, and writes what it changed; tabs
 * of one app share it.
 */
export class IdbBackend implements Backend {
  constructor(private readonly _db: IDBDatabase) {}

  static open(name: string): Promise<IdbBackend> {
    return new Promise((resolve, reject) => {
      // version 3: the layout above. No release wrote an older one: one found (a development
      // build's) is recreated empty rather than read as this layout
      const req = indexedDB.open(name, 3);
      let blocked = false;
      req.onupgradeneeded = () => {
        const db = req.result;
        for (const s of Array.from(db.objectStoreNames)) db.deleteObjectStore(s);
        db.createObjectStore(ROWS, { keyPath: "id" });
        db.createObjectStore(META);
      };
      // a tab of an older build keeps it open: fail now rather than wait for that tab to close
      req.onblocked = () => {
        blocked = true;
        reject(new Error("an older version of the database is open in another tab"));
      };
      req.onerror = () => reject(req.error);
      req.onsuccess = () => {
        const db = req.result;
        if (blocked) return db.close(); // opened after open() failed: nobody holds it
        db.onversionchange = () => db.close(); // a newer build's tab upgrades it; calls here reject from now on
        resolve(new IdbBackend(db));
      };
    });
  }

  private async _tx<T>(mode: IDBTransactionMode, fn: (rows: IDBObjectStore, meta: IDBObjectStore) => Promise<T>): Promise<T> {
    const t = this._db.transaction([ROWS, META], mode, { durability: "strict" });
    const done = new Promise<void>((resolve, reject) => {
      t.oncomplete = () => resolve();
      t.onabort = t.onerror = () => reject(t.error ?? new Error("IndexedDB transaction aborted"));
    });
    done.catch(() => undefined); // awaited below, or moot once fn failed
    try {
      const out = await fn(t.objectStore(ROWS), t.objectStore(META));
      await done;
      return out;
    } catch (e) {
      try {
        t.abort(); // a change that failed half-way commits none of its writes
      } catch {
        // already aborted or committed
      }
      throw e;
    }
  }

  private async _state(rows: IDBObjectStore, meta: IDBObjectStore): Promise<OutboxState> {
    // every read at once: one round trip to the database
    const [all, ...doc] = await Promise.all([promised(rows.getAll()), ...DOCUMENT.map((k) => promised(meta.get(k)))]);
    const s = emptyState() as unknown as Record<string, unknown>;
    DOCUMENT.forEach((k, i) => (s[k] = doc[i] ?? s[k]));
    s.rows = (all as Row[]).sort((a, b) => a.seq! - b.seq!);
    return s as unknown as OutboxState;
  }

  read(): Promise<OutboxState> {
    return this._tx("readonly", (rows, meta) => this._state(rows, meta));
  }

  apply(op: Op): Promise<ClaimResult | number> {
    return this._tx("readwrite", async (rows, meta) => {
      const s = await this._state(rows, meta);
      const before = new Set(s.rows.map((r) => r.id));
      let seq = ((s.rows.at(-1) as Row | undefined)?.seq ?? 0) + 1;
      const out = applyOp(s, op);
      const after = new Set(s.rows.map((r) => r.id));
      for (const id of before) if (!after.has(id)) rows.delete(id);
      for (const r of s.rows) if (!before.has(r.id)) rows.put({ ...r, seq: seq++ });
      for (const k of DOCUMENT) meta.put(s[k], k);
      return out;
    });
  }

  /** The device secret: made once (32 CSPRNG bytes) in the same database. */
  secret(): Promise<Uint8Array> {
    return this._tx("readwrite", async (_rows, meta) => {
      let secret = (await promised(meta.get("secret"))) as Uint8Array | undefined;
      if (!(secret instanceof Uint8Array) || secret.length !== 32) {
        secret = crypto.getRandomValues(new Uint8Array(32));
        meta.put(secret, "secret");
      }
      return secret;
    });
  }

  async close(): Promise<void> {
    this._db.close();
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
