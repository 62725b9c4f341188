/**
 * The Node entry point: the outbox is a file, `appDir/outbox.json`, replaced atomically
 * (written to a temporary file, fsynced, renamed, directory fsynced) on every change, and
 * the device secret is `appDir/secret` (32 CSPRNG bytes, 0600, made once). One process
 * per app directory, enforced: `appDir/outbox.lock` names the process holding it, and a
 * second live process is refused at `openReporter` (two writers of one file could each
 * claim a window and so make two reports in it); a dead holder's lock is taken over.
 */
import { constants, readFileSync, unlinkSync } from "node:fs";
import { link, mkdir, open, readFile, readdir, rename, unlink } from "node:fs/promises";
import { basename, join } from "node:path";
import { ALL_ENCODINGS } from "./encodings.js";
import { CrowdmixError } from "./errors.js";
import { type Backend, type ClaimResult, type Op, type OutboxState, Outbox, applyOp, emptyState } from "./outbox.js";
import { Reporter, type ReporterOptions } from "./reporter.js";

export * from "./common.js";

const SECRET_BYTES = 32;

async function fsyncDir(dir: string): Promise<void> {
  const fh = await open(dir, constants.O_RDONLY);
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}

async function writeDurably(path: string, data: Uint8Array | string, mode = 0o600): Promise<string> {
  const tmp = `${path}.${process.pid}.tmp`;
  const fh = await open(tmp, "w", mode);
  try {
    await fh.writeFile(data);
    await fh.sync();
  } finally {
    await fh.close();
  }
  return tmp;
}

/** The outbox document in one file. */
export class FileBackend implements Backend {
  private _state: OutboxState = emptyState();
  private _text = "";
  private _loaded = false;
  private _chain: Promise<unknown> = Promise.resolve();

  constructor(
    readonly path: string,
    private readonly _dir: string,
  ) {}

  /** The document: read from the file once, then this process's copy (the file's only writer). */
  read(): Promise<OutboxState> {
    return this._queue(async () => {
      if (!this._loaded) await this._load();
      return structuredClone(this._state);
    });
  }

  private async _load(): Promise<void> {
    // a process killed while writing leaves its temporary file: never read, removed here
    for (const name of await readdir(this._dir).catch(() => [] as string[]))
      if (name.startsWith(`${basename(this.path)}.`) && name.endsWith(".tmp")) await unlink(join(this._dir, name)).catch(() => undefined);
    let text: string;
    try {
      text = await readFile(this.path, "utf8");
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== "ENOENT") throw new CrowdmixError(`cannot read the outbox ${this.path}: ${(e as Error).message}`);
      this._loaded = true;
      return;
    }
    try {
      const s = JSON.parse(text) as OutboxState;
      if (!Array.isArray(s.rows) || typeof s.claims !== "object") throw new Error("not an outbox");
      // a document from before `settled`: its claims stand for it (never moved back)
      this._state = { ...emptyState(), ...s, settled: s.settled ?? { ...s.claims } };
      this._text = text;
    } catch (e) {
      // refuse rather than start afresh: afresh could make a second report in a window
      throw new CrowdmixError(`${this.path} is not a crowdmix outbox: ${(e as Error).message}`);
    }
    this._loaded = true;
  }

  /** Run `fn` after every earlier read and change of this outbox. */
  private _queue<T>(fn: () => Promise<T>): Promise<T> {
    const p = this._chain.then(fn, fn);
    this._chain = p.catch(() => undefined);
    return p;
  }

  apply(op: Op): Promise<ClaimResult | number> {
    return this._queue(async () => {
      if (!this._loaded) await this._load();
      const s = structuredClone(this._state);
      const out = applyOp(s, op);
      const text = JSON.stringify(s);
      if (text !== this._text) {
        const tmp = await writeDurably(this.path, text);
        await rename(tmp, this.path);
        await fsyncDir(this._dir);
        this._text = text;
        this._state = s;
      }
      return out;
    });
  }

  async close(): Promise<void> {
    await this._chain;
    const lock = join(this._dir, "outbox.lock");
    if ((await readFile(lock, "utf8").catch(() => "")) === String(process.pid)) await unlink(lock).catch(() => undefined);
  }
}

async function deviceSecret(path: string, dir: string): Promise<Uint8Array> {
  try {
    await readFile(path);
  } catch {
    const tmp = await writeDurably(path, crypto.getRandomValues(new Uint8Array(SECRET_BYTES)));
    try {
      await link(tmp, path); // fails if another process made it first: use theirs
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== "EEXIST") throw e;
    } finally {
      await unlink(tmp);
    }
    await fsyncDir(dir);
  }
  const secret = new Uint8Array(await readFile(path));
  if (secret.length !== SECRET_BYTES) throw new CrowdmixError(`${path} is not a device secret (${secret.length} bytes, expected ${SECRET_BYTES})`);
  return secret;
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** Take `appDir/outbox.lock` for this process, or throw naming the live holder. */
async function lockAppDir(appDir: string): Promise<void> {
  const path = join(appDir, "outbox.lock");
  for (let attempt = 0; attempt < 3; attempt++) {
    try {
      const fh = await open(path, "wx", 0o600);
      await fh.writeFile(String(process.pid));
      await fh.close();
      const release = (): void => {
        try {
          if (readFileSync(path, "utf8") === String(process.pid)) unlinkSync(path);
        } catch {
          // gone already
        }
      };
      process.once("exit", release);
      return;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== "EEXIST") throw e;
    }
    const holder = Number((await readFile(path, "utf8").catch(() => "")).trim());
    if (holder === process.pid) throw new CrowdmixError(`${appDir} is already open in this process (close its reporter first)`);
    if (holder > 0 && alive(holder)) throw new CrowdmixError(`${appDir} is in use by process ${holder}: one process per app directory`);
    await unlink(path).catch(() => undefined); // its holder died (kill -9): take it over
  }
  throw new CrowdmixError(`cannot take ${path}`);
}

/** Open (or create) the app directory's outbox and secret; throws CrowdmixError if unusable. */
export async function openReporter(appDir: string, options: ReporterOptions): Promise<Reporter> {
  let secret: Uint8Array;
  let outbox: Outbox;
  try {
    await mkdir(appDir, { recursive: true, mode: 0o700 });
    await lockAppDir(appDir);
    secret = await deviceSecret(join(appDir, "secret"), appDir);
    outbox = new Outbox(new FileBackend(join(appDir, "outbox.json"), appDir), options.maxReports ?? 1000, options.maxBytes ?? 1 << 20);
    await outbox.load();
  } catch (e) {
    if (e instanceof CrowdmixError) throw e;
    throw new CrowdmixError(`cannot use the app directory ${appDir}: ${(e as Error).message}`);
  }
  return new Reporter(outbox, secret, options, ALL_ENCODINGS);
}
