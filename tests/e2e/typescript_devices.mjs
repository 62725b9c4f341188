// Many devices of the TypeScript SDK in one Node process, for the end-to-end tests.
// argv[2]: a JSON job {url, token, base, devices, reports: [[metric, value]], flushMs}.
// Device i has its own app directory base/device-i; "$i" in a value becomes i. Each device
// writes base/progress (its index) after it claimed and after it flushed, so a test can
// kill -9 the process anywhere; a rerun goes on from the outboxes on disk.
import { appendFileSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { openReporter } from "../../sdk/typescript/dist/node.js";

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
for (let i = 0; i < job.devices; i++) {
  const reporter = await openReporter(join(job.base, `device-${i}`), {
    url: job.url,
    token: job.token,
    background: false,
    timeoutMs: 5000,
  });
  for (const [metric, value] of job.reports) {
    const v = typeof value === "string" && value.includes("$i") ? value.replace("$i", String(i)) : value;
    if (await reporter.report(metric, typeof v === "string" && /^\d+$/.test(v) ? Number(v) : v))
      summary.claimed[metric] = (summary.claimed[metric] ?? 0) + 1;
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
