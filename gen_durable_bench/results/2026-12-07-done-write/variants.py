"""Writes the three schema experiments of this run into the directory given ($1):
base.sql (the schema as it is, plus an empty gd_finished so every variant has the same
tables), finished.sql (a plain row's `done` moves it into gd_finished: a delete and an
insert, the `Lwd` design of phase 1) and deleted.sql (a plain row's `done` deletes it,
`Lw`). Each replaces the 22-argument gd_commit_outcomes of gen_durable/sql/commit.sql,
read as it is in the checkout, changing only its `shut` CTE. Run from the repository's
root."""
import sys

out = sys.argv[1]
src = open("gen_durable/sql/commit.sql").read()
start = src.index("CREATE OR REPLACE FUNCTION gd_commit_outcomes(")
start = src.index("CREATE OR REPLACE FUNCTION gd_commit_outcomes(", start + 1) \
    if "p_keyed" not in src[start:src.index("$$;", start)] else start
fn = src[start:src.index("$$;", start) + 3]
cols = ("id,fsm,fsm_version,step,status,state,result,awaits,await_deadline,queue,priority,"
        "partition_key,eligible_at,attempt,reaps,max_reaps,last_error,locked_by,lease_epoch,"
        "lease_expires_at,parent_id,children_pending,unique_key,unique_scope,inserted_at,"
        "updated_at,cancel_requested,gate,gate_slot,rate_limit,rate_key,rate_weight,rate_step,"
        "rate_paid,ready_seq").split(",")
over = {
    "step": "coalesce(p_steps[width_bucket(g.id, p_ids)], g.step)",
    "state": "coalesce(p_states[width_bucket(g.id, p_ids)], g.state)",
    "result": "p_results[width_bucket(g.id, p_ids)]",
    "last_error": "p_errors[width_bucket(g.id, p_ids)]",
    "status": "'done'::gd_status",
    "awaits": "'{}'::text[]",
    "await_deadline": "NULL::timestamptz",
    "updated_at": "t",
    "ready_seq": "NULL::int8",
}
s0 = fn.index("    ), shut AS (")
s1 = fn.index("    ), appended AS (")
body = fn[s0:s1].split("UPDATE gd_instances i", 1)[1]
where = body[body.index("         WHERE i.id = ANY (closed)"):body.index("        RETURNING")]
gone = f"    ), shut_gone AS (\n        DELETE FROM gd_instances i\n{where}        RETURNING i.*\n"
moved = gone + f"""    ), shut AS (
        INSERT INTO gd_finished ({",".join(cols)})
        SELECT {", ".join(over.get(c, "g." + c) for c in cols)}
          FROM shut_gone g
        RETURNING gd_finished.id, gd_finished.status, gd_finished.parent_id,
                  gd_finished.queue, false AS ahead
"""
deleted = gone + """    ), shut AS (
        SELECT g.id, 'done'::gd_status AS status, g.parent_id, g.queue, false AS ahead
          FROM shut_gone g
"""
table = """DROP TABLE IF EXISTS gd_finished;
CREATE TABLE gd_finished (LIKE gd_instances INCLUDING DEFAULTS INCLUDING GENERATED);
ALTER TABLE gd_finished ADD PRIMARY KEY (id);
CREATE INDEX ON gd_finished (finished_at);
"""
open(f"{out}/base.sql", "w").write(table)
open(f"{out}/finished.sql", "w").write(table + fn[:s0] + moved + fn[s1:] + "\n")
open(f"{out}/deleted.sql", "w").write(table + fn[:s0] + deleted + fn[s1:] + "\n")
