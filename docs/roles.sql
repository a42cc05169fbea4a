-- Least-privilege roles for gen_durable. Run once per database, as a superuser (or a role
-- with CREATEROLE that owns the database), connected to the application's database:
--
--   psql "$ADMIN_URL" -f docs/roles.sql
--
-- Then:
--   gd_migrator  runs `gen_durable migrate-schema` (it owns the schema's tables and functions);
--   gd_worker    is what engines and clients connect as: rows only (SELECT, INSERT, UPDATE,
--                DELETE on gen_durable's tables) — no DDL, no TRUNCATE, no superuser, no
--                pg_signal_backend, so it cannot drop or alter a table or end another
--                role's session;
--   gd_reader    is what the CLI's read commands (`status`, `inspect`) connect as: SELECT.
-- Set their passwords (`ALTER ROLE gd_worker PASSWORD '…'`) or use your own
-- authentication. gen_durable's tables live in the `public` schema.

CREATE ROLE gd_migrator LOGIN;
CREATE ROLE gd_worker LOGIN;
CREATE ROLE gd_reader LOGIN;

DO $$
BEGIN
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO gd_migrator, gd_worker, gd_reader',
                   current_database());
END
$$;

-- PostgreSQL 15 no longer lets every role create in `public`: the migrator may.
GRANT USAGE, CREATE ON SCHEMA public TO gd_migrator;
GRANT USAGE ON SCHEMA public TO gd_worker, gd_reader;

-- What the migrator creates is granted as it is created, now and in later migrations.
ALTER DEFAULT PRIVILEGES FOR ROLE gd_migrator IN SCHEMA public
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO gd_worker;
ALTER DEFAULT PRIVILEGES FOR ROLE gd_migrator IN SCHEMA public
    GRANT USAGE, SELECT ON SEQUENCES TO gd_worker;
ALTER DEFAULT PRIVILEGES FOR ROLE gd_migrator IN SCHEMA public
    GRANT SELECT ON TABLES TO gd_reader;

-- After the first `gen_durable migrate-schema` (as gd_migrator), take back the worker's writes
-- to sqlx's migration ledger, which the default privileges above also granted:
--
--   REVOKE INSERT, UPDATE, DELETE ON _sqlx_migrations FROM gd_worker;
