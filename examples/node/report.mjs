// A Node app reporting through crowdmix: one device (its app directory), a few metrics.
//
//   cd sdk/typescript && npm ci && npm run build && cd ../..
//   CROWDMIX_URL=http://127.0.0.1:7480 CROWDMIX_TOKEN=... \
//     node examples/node/report.mjs theme=dark home_page=example.com
//
// An app installed from npm imports "@crowdmix/client" (Node picks the file outbox).
import { openReporter } from "../../sdk/typescript/dist/node.js";

const url = process.env.CROWDMIX_URL ?? "http://127.0.0.1:7480";
const appDir = process.env.CROWDMIX_APP_DIR ?? ".crowdmix";
const reporter = await openReporter(appDir, { url, token: process.env.CROWDMIX_TOKEN });

for (const arg of process.argv.slice(2)) {
  const [metric, raw] = arg.split("=", 2);
  const value = /^\d+$/.test(raw) ? Number(raw) : raw; // an index for known domains
  const made = await reporter.report(metric, value);
  console.log(`${metric}: ${made ? "reported" : `not reported (${reporter.lastError})`}`);
}
const left = await reporter.flush(5000); // what is left goes out at the next start
console.log(JSON.stringify({ queued: left, counters: reporter.counters(), lastError: reporter.lastError }));
await reporter.close();
