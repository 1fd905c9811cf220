// A no-op task that records (due, received) for each job; flushed to a file every 50 ms.
// Run at graphile-worker's own settings for throughput, those of its performance page
// (https://worker.graphile.org/docs/performance): 24 concurrent jobs, a pool of 25, a local queue
// of 500 and job completions and failures batched with no delay.
const fs = require("fs");
const { run, Logger } = require("graphile-worker");
// Warnings and errors only: at its default level it writes a line for every job it completes,
// a cost the service's replicas (logging warnings only in the benchmarks) do not pay.
const logger = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") console.error(message);
});
const out = process.argv[2];
let buf = [];
const flush = () => { if (buf.length) { fs.appendFileSync(out, buf.join("")); buf = []; } };
const now = () => (performance.timeOrigin + performance.now()) / 1000;
async function main() {
  const runner = await run({
    connectionString: process.env.PEER_DATABASE_URL,
    noHandleSignals: false,
    logger,
    preset: {
      worker: {
        concurrentJobs: 24,
        maxPoolSize: 25,
        localQueue: { size: 500 },
        completeJobBatchDelay: 0,
        failJobBatchDelay: 0,
      },
    },
    taskList: { noop: async (payload) => { buf.push(`${payload.d} ${now()}\n`); } },
  });
  setInterval(flush, 50);
  fs.writeFileSync(out + ".ready", "");
  await runner.promise;
  flush();
}
process.on("exit", flush);
main().catch((e) => { console.error(e); process.exit(1); });
