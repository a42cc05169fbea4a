// graphile_drain.mjs: the drain of gen_durable_bench, run by graphile-worker.
//
// Run by graphile.sh (which installs graphile-worker into GD_PEER_DIR); see README.md.
// Creates afresh the database gd_peer_graphile on DATABASE_URL's server, installs
// graphile-worker's schema, enqueues N no-op jobs, then times one worker draining them.
// Prints one JSON line on stdout; progress and errors go to stderr. Exits non-zero unless
// every job ran exactly once and the jobs table is empty at the end.

import { EventEmitter } from "node:events";
import { createRequire } from "node:module";
import path from "node:path";
import { performance } from "node:perf_hooks";

const EXPECTED_VERSION = "0.17.3";
const DB = "gd_peer_graphile";

const peerDir = process.env.GD_PEER_DIR;
if (!peerDir) {
  console.error("graphile_drain: GD_PEER_DIR is not set (run graphile.sh)");
  process.exit(2);
}
const require = createRequire(path.join(peerDir, "package.json"));
const gw = require("graphile-worker");
const gwVersion = require("graphile-worker/package.json").version;
const pg = require("pg");

function parseArgs(argv) {
  const o = {
    n: 20000,
    concurrency: 24,
    localQueue: 500,
    completeJobBatchDelay: 0,
    failJobBatchDelay: 0,
    pool: 25,
    addBatch: 5000,
    timeoutSecs: 600,
  };
  const flags = {
    "--n": "n",
    "--concurrency": "concurrency",
    "--local-queue": "localQueue",
    "--complete-batch-delay": "completeJobBatchDelay",
    "--fail-batch-delay": "failJobBatchDelay",
    "--pool": "pool",
    "--add-batch": "addBatch",
    "--timeout-secs": "timeoutSecs",
  };
  for (let i = 0; i < argv.length; i++) {
    let [k, v] = argv[i].split("=", 2);
    if (!(k in flags)) throw new Error(`unknown flag ${k} (one of ${Object.keys(flags).join(", ")})`);
    if (v === undefined) v = argv[++i];
    const x = Number(v);
    if (v === undefined || !Number.isInteger(x)) throw new Error(`${k} wants an integer, got ${v}`);
    o[flags[k]] = x;
  }
  if (o.n < 1) throw new Error("--n must be at least 1");
  return o;
}

const log = (...a) => console.error("graphile_drain:", ...a);

// graphile-worker warns (and goes on) when it ignores an option: that would be a run
// with the wrong settings, so it fails.
const warn = console.warn;
console.warn = (...a) => {
  warn(...a);
  if (String(a[0]).includes("Do not know how to convert")) {
    console.error("graphile_drain: FAILED: an option was ignored");
    process.exit(1);
  }
};

// Warnings and errors only: graphile's per-job "Completed task" info lines would be
// 20,000 console writes (NO_LOG_SUCCESS, set by graphile.sh, skips them too).
const logger = new gw.Logger(() => (level, message) => {
  if (level === "error" || level === "warning") console.error(`[graphile ${level}] ${message}`);
});

async function main() {
  const o = parseArgs(process.argv.slice(2));
  if (gwVersion !== EXPECTED_VERSION) {
    throw new Error(`graphile-worker ${gwVersion} installed in ${peerDir}, expected ${EXPECTED_VERSION}`);
  }
  const serverUrl = process.env.DATABASE_URL || "postgres://postgres@127.0.0.1:5432/postgres";
  const u = new URL(serverUrl);
  u.pathname = "/" + DB;
  const dbUrl = u.toString();

  // Afresh every run, like gen_durable_bench's own database.
  const admin = new pg.Client({ connectionString: serverUrl });
  await admin.connect();
  await admin.query(`DROP DATABASE IF EXISTS ${DB} WITH (FORCE)`);
  await admin.query(`CREATE DATABASE ${DB}`);
  await admin.end();

  // The schema, once, before any timing.
  await gw.runMigrations({ connectionString: dbUrl, logger });

  // The backlog: N jobs in batches through add_jobs (one statement per batch).
  const tAdd = performance.now();
  const utils = await gw.makeWorkerUtils({ connectionString: dbUrl, logger });
  try {
    for (let start = 0; start < o.n; start += o.addBatch) {
      const specs = [];
      for (let i = start; i < Math.min(o.n, start + o.addBatch); i++) {
        specs.push({ identifier: "noop", payload: { i } });
      }
      await utils.addJobs(specs);
    }
  } finally {
    await utils.release();
  }
  const check = new pg.Client({ connectionString: dbUrl });
  await check.connect();
  const count = async () =>
    Number((await check.query("SELECT count(*) AS c FROM graphile_worker._private_jobs")).rows[0].c);
  // As the gen_durable drain does after its insert.
  await check.query("VACUUM ANALYZE graphile_worker._private_jobs");
  const queued = await count();
  if (queued !== o.n) throw new Error(`enqueued ${o.n} jobs, the table holds ${queued}`);
  log(`${o.n} jobs enqueued in ${((performance.now() - tAdd) / 1000).toFixed(2)} s; draining`);

  // The task: a no-op that counts each job's runs.
  const runsOf = new Uint16Array(o.n);
  let runs = 0;
  let tFirstStart = null;
  let tFirstDone = null;
  let tLastRun = null;
  let resolveAllRan;
  const allRan = new Promise((r) => (resolveAllRan = r));
  const taskList = {
    noop: async (payload) => {
      const now = performance.now();
      if (tFirstStart === null) tFirstStart = now;
      runsOf[payload.i]++;
      runs++;
      if (tFirstDone === null) tFirstDone = performance.now();
      if (runs === o.n) {
        tLastRun = performance.now();
        resolveAllRan();
      }
    },
  };
  let jobErrors = 0;
  const events = new EventEmitter();
  events.on("job:error", () => jobErrors++);

  const settings = {
    concurrentJobs: o.concurrency,
    localQueue: { size: o.localQueue },
    completeJobBatchDelay: o.completeJobBatchDelay,
    failJobBatchDelay: o.failJobBatchDelay,
    maxPoolSize: o.pool,
  };
  const deadline = setTimeout(() => {
    console.error(`graphile_drain: FAILED: not drained within ${o.timeoutSecs} s (${runs} of ${o.n} ran)`);
    process.exit(1);
  }, o.timeoutSecs * 1000);

  // (a) run() called -> the jobs table empty; (b) run() called -> the first task returned.
  const t0 = performance.now();
  const runner = await gw.run({
    // 0.17 reads these from the preset (as top-level options they are ignored, with a
    // warning, which fails this run: see console.warn above).
    preset: { worker: { connectionString: dbUrl, ...settings, logger, events } },
    noHandleSignals: true,
    taskList,
  });
  await allRan;
  const connections = Number(
    (await check.query("SELECT count(*) AS c FROM pg_stat_activity WHERE datname = $1", [DB])).rows[0].c,
  );
  // Every task has returned; the batched completions (DELETEs) may still be in flight.
  // The drain ends when the last one is committed: the table is empty.
  let polls = 0;
  while ((await count()) !== 0) {
    polls++;
    await new Promise((r) => setTimeout(r, 1));
  }
  const tEnd = performance.now();
  clearTimeout(deadline);
  await runner.stop();

  // Exactly once: every job's task ran once, no job errored, the table is empty.
  let notOnce = 0;
  for (let i = 0; i < o.n; i++) if (runsOf[i] !== 1) notOnce++;
  const left = await count();
  await check.end();
  if (runs !== o.n || notOnce !== 0 || jobErrors !== 0 || left !== 0) {
    throw new Error(
      `expected ${o.n} jobs run exactly once and an empty table: ${runs} runs, ` +
        `${notOnce} jobs not run exactly once, ${jobErrors} job errors, ${left} rows left`,
    );
  }

  const secs = (tEnd - t0) / 1000;
  const secsFirst = (tEnd - tFirstStart) / 1000;
  const r = (x, d) => Math.round(x * 10 ** d) / 10 ** d;
  console.log(
    JSON.stringify({
      scenario: "graphile_drain",
      n: o.n,
      secs: r(secs, 4),
      per_s: r(o.n / secs, 1),
      startup_ms: r(tFirstDone - t0, 1),
      // The window of gen_durable's drain: the first task started -> the last completion.
      secs_first_to_last: r(secsFirst, 4),
      per_s_first_to_last: r(o.n / secsFirst, 1),
      last_task_to_empty_ms: r(tEnd - tLastRun, 1),
      empty_polls: polls,
      connections_at_end: connections,
      settings: { ...settings, noop_task: true, NO_LOG_SUCCESS: !!process.env.NO_LOG_SUCCESS },
      checks: { runs, exactly_once: true, job_errors: jobErrors, rows_left: left },
      version: gwVersion,
      node: process.version,
    }),
  );
}

main().then(
  () => process.exit(0),
  (e) => {
    console.error(`graphile_drain: FAILED: ${e && e.stack ? e.stack : e}`);
    process.exit(1);
  },
);
