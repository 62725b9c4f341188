/**
 * The browser entry point: the outbox and the device secret live in IndexedDB (one
 * database per app; every change one readwrite transaction with strict durability, so
 * tabs of one app share one outbox and claim atomically), and the reporter sends what
 * waits with `fetch` keepalive when the page is hidden or goes away.
 */
import { CrowdmixError } from "./errors.js";
import { type Backend, type OutboxState, Outbox, emptyState } from "./outbox.js";
import { Reporter, type ReporterOptions } from "./reporter.js";

export * from "./common.js";

const STORE = "outbox";

function promised<T>(req: IDBRequest<T>): Promise<T> {
  return new Promise((resolve, reject) => {
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error);
  });
}

/** The outbox document as one IndexedDB record. */
export class IdbBackend implements Backend {
  constructor(private readonly db: IDBDatabase) {}

  static async open(name: string): Promise<IdbBackend> {
    const req = indexedDB.open(name, 1);
    req.onupgradeneeded = () => req.result.createObjectStore(STORE);
    return new IdbBackend(await promised(req));
  }

  private tx<T>(mode: IDBTransactionMode, fn: (s: IDBObjectStore) => Promise<T>): Promise<T> {
    const t = this.db.transaction(STORE, mode, { durability: "strict" });
    const done = new Promise<void>((resolve, reject) => {
      t.oncomplete = () => resolve();
      t.onabort = t.onerror = () => reject(t.error ?? new Error("IndexedDB transaction aborted"));
    });
    return fn(t.objectStore(STORE)).then(async (out) => {
      await done;
      return out;
    });
  }

  async read(): Promise<OutboxState> {
    return this.tx("readonly", async (s) => ({ ...emptyState(), ...((await promised(s.get("state"))) as OutboxState | undefined) }));
  }

  update<T>(fn: (s: OutboxState) => T): Promise<T> {
    return this.tx("readwrite", async (store) => {
      const s: OutboxState = { ...emptyState(), ...((await promised(store.get("state"))) as OutboxState | undefined) };
      const out = fn(s);
      store.put(s, "state");
      return out;
    });
  }

  /** The device secret: made once (32 CSPRNG bytes) in the same database. */
  secret(): Promise<Uint8Array> {
    return this.tx("readwrite", async (store) => {
      let secret = (await promised(store.get("secret"))) as Uint8Array | undefined;
      if (!(secret instanceof Uint8Array) || secret.length !== 32) {
        secret = crypto.getRandomValues(new Uint8Array(32));
        store.put(secret, "secret");
      }
      return secret;
    });
  }

  async close(): Promise<void> {
    this.db.close();
  }
}

/**
 * Open the app's outbox (IndexedDB database `name`, default "crowdmix") and start a
 * reporter that also sends on `pagehide` and when the page is hidden.
 */
export async function openReporter(options: ReporterOptions & { name?: string }): Promise<Reporter> {
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
  const reporter = new Reporter(outbox, secret!, options);
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
