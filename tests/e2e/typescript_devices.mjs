// Many devices of the TypeScript SDK in one Node process, for the end-to-end tests.
// argv[2]: a JSON job {url, token, base, devices, reports: [[metric, value]], flushMs},
// optionally {values, coins, now, sealing}. Device i has its own app directory
// base/device-i; "$i" in a value becomes i, "$v" values[i]. `coins`: device i's encoder
// randomness is the byte stream BLAKE2b-512("<coins> <i> <block>"), block 0, 1, ... (as
// tests/e2e/test_typescript_discovery.py reads it); `now`: the devices' wall clock starts
// there (the daemons' clock). Each device writes base/progress (its index) after it
// claimed and after it flushed, so a test can kill -9 the process anywhere; a rerun goes
// on from the outboxes on disk. The summary counts what report() said, per metric.
import { appendFileSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { blake2b, openReporter } from "../../sdk/typescript/dist/node.js";

function coins(prefix) {
  let buf = new Uint8Array(0);
  let block = 0;
  return (n) => {
    while (buf.length < n) {
      const more = blake2b(new TextEncoder().encode(`${prefix} ${block++}`));
      buf = Uint8Array.from([...buf, ...more]);
    }
    const out = buf.slice(0, n);
    buf = buf.slice(n);
    return out;
  };
}

const job = JSON.parse(readFileSync(process.argv[2], "utf8"));
if (job.hangAfterAck) {
  // stop dead once the shuffler acknowledged a Submit, before the outbox hears of it:
  // the test kills the process here (the request itself is real)
  const real = globalThis.fetch;
  globalThis.fetch = async (url, init) => {
    const resp = await real(url, init);
    if (String(url).endsWith("/Submit") && resp.status === 200) {
      appendFileSync(join(job.base, "progress"), "acked\n");
      await new Promise(() => {});
    }
    return resp;
  };
}
const summary = { claimed: {}, queued: 0, delivered: 0, errors: [] };
if (job.coins !== undefined) summary.statuses = {};
const started = performance.now() / 1000;
for (let i = 0; i < job.devices; i++) {
  const reporter = await openReporter(join(job.base, `device-${i}`), {
    url: job.url,
    token: job.token,
    background: false,
    timeoutMs: 5000,
    ...(job.sealing ? { sealing: job.sealing } : {}),
    ...(job.coins !== undefined ? { randomBytes: coins(`${job.coins} ${i}`) } : {}),
    ...(job.now !== undefined ? { clock: () => job.now + performance.now() / 1000 - started } : {}),
  });
  for (const [metric, value] of job.reports) {
    let v = typeof value === "string" && value.includes("$i") ? value.replace("$i", String(i)) : value;
    if (v === "$v") v = job.values[i];
    else if (typeof v === "string" && /^\d+$/.test(v)) v = Number(v);
    if (await reporter.report(metric, v)) summary.claimed[metric] = (summary.claimed[metric] ?? 0) + 1;
    if (summary.statuses) {
      const s = (summary.statuses[metric] ??= {});
      s[reporter.lastStatus] = (s[reporter.lastStatus] ?? 0) + 1;
    }
  }
  appendFileSync(join(job.base, "progress"), `claimed ${i}\n`);
  const left = await reporter.flush(job.flushMs ?? 10000);
  if (left && reporter.lastError) summary.errors.push(reporter.lastError);
  summary.queued += left;
  summary.delivered += reporter.counters().delivered;
  appendFileSync(join(job.base, "progress"), `flushed ${i}\n`);
  await reporter.close();
}
console.log(JSON.stringify(summary));
