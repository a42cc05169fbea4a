// graphile_sql.mjs: graphile-worker's own claim and completion statements, for gd_proto.
//
// Run by gd_proto with GD_PEER_DIR set (graphile.sh --install-only installs graphile-worker
// there). Installs graphile-worker's schema into DATABASE_URL with its own migrations, then
// prints one JSON line: the text of the statement its worker pool sends to fetch a batch of
// jobs (`batchGetJobs`, as a pool with a local queue of BATCH jobs sends it) and the one it
// sends to complete a batch (`batchCompleteJobs`), taken by calling those functions of the
// installed package with a client that records the text instead of sending it.
import { createRequire } from "node:module";
import path from "node:path";

const peerDir = process.env.GD_PEER_DIR;
const url = process.env.DATABASE_URL;
const batch = Number(process.env.BATCH ?? "100");
if (!peerDir || !url) {
  console.error("graphile_sql: GD_PEER_DIR and DATABASE_URL must be set");
  process.exit(2);
}
const require = createRequire(path.join(peerDir, "package.json"));
const gw = require("graphile-worker");
const { batchGetJobs } = require("graphile-worker/dist/sql/getJobs.js");
const { batchCompleteJobs } = require("graphile-worker/dist/sql/completeJobs.js");
const version = require("graphile-worker/package.json").version;

const quiet = new gw.Logger(() => (level, message) => {
  if (level === "error" || level === "warning") console.error(`[graphile ${level}] ${message}`);
});
await gw.runMigrations({ connectionString: url, logger: quiet });

const sent = [];
const client = {
  query: async (q) => {
    sent.push(q.text);
    return { rows: [{ id: 1, identifier: "noop", job_queue_id: null }] };
  },
};
const withPgClient = async (cb) => cb(client);
withPgClient.withRetries = withPgClient;
const options = {
  escapedWorkerSchema: '"graphile_worker"',
  workerSchema: "graphile_worker",
  resolvedPreset: { worker: { preparedStatements: true, useNodeTime: false } },
  logger: quiet,
};
await batchGetJobs(options, withPgClient, { noop: async () => {} }, "pool", [], batch);
const getJobs = sent[sent.length - 1];
await batchCompleteJobs(options, withPgClient, "pool", [
  { id: 1, job_queue_id: null },
  { id: 2, job_queue_id: null },
]);
const completeJobs = sent[sent.length - 1];
console.log(JSON.stringify({ version, get_jobs: getJobs, complete_jobs: completeJobs }));
