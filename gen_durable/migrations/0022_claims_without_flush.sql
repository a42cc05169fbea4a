-- A claim commits without waiting for its WAL flush (the engine sends it with
-- `synchronous_commit` off for its own transaction: `gen_durable::store::pg::claim`), so
-- every claim's epoch must be one that no claim before it gave, even a claim a server
-- crash forgot.
--
-- A claim bumps the row's `lease_epoch`, and a worker's writes are fenced by
-- `(locked_by, lease_epoch)`. A claim whose commit had not reached the disk when the server
-- crashed is gone after recovery: the row is back at its old epoch, runnable, while the
-- worker that claimed it may still run its step. Were the epoch `old + 1`, the same node
-- claiming the row again would get the forgotten claim's epoch, and both workers would
-- pass the fence. So an epoch is now at least the statement's time in microseconds since
-- 1970 (`gd_lease_epoch`): a claim after the server's recovery gets a later one than any
-- claim before the crash, as long as the server's clock does not step back by more than
-- the time a crash and recovery take. A row claimed more than once within a microsecond
-- still gets `old + 1`.
--
-- Each function that bumps the epoch (the three claims and the hand-off) is recreated
-- from its own definition with that one expression replaced, so that the rest of each
-- stays as its last migration wrote it (0016 `gd_claim_plain`, 0020 the others);
-- `claim::body` makes the same replacement when it reads a claim from the migrations.

CREATE FUNCTION gd_lease_epoch(prior int8) RETURNS int8
LANGUAGE sql STABLE PARALLEL SAFE
AS $$ SELECT greatest(prior + 1, (extract(epoch FROM statement_timestamp()) * 1000000)::int8) $$;

DO $rewrite$
DECLARE
    f regprocedure;
    def text;
    done int := 0;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
              WHERE p.proname IN ('gd_claim', 'gd_claim_rated', 'gd_claim_plain', 'gd_handoff')
                AND pg_function_is_visible(p.oid) LOOP
        def := pg_get_functiondef(f);
        IF position('lease_epoch = i.lease_epoch + 1,' IN def) = 0 THEN
            RAISE EXCEPTION 'migration 0022: % does not bump the epoch as expected', f;
        END IF;
        EXECUTE replace(def, 'lease_epoch = i.lease_epoch + 1,',
                        'lease_epoch = gd_lease_epoch(i.lease_epoch),');
        done := done + 1;
    END LOOP;
    IF done <> 4 THEN
        RAISE EXCEPTION 'migration 0022: found % of the 4 functions that bump the epoch', done;
    END IF;
END
$rewrite$;
