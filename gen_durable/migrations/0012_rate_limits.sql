-- Rate limits (README, "Flow control"): at most R steps per second of one key, with a
-- burst, as token buckets refilled lazily from the database clock.
--
-- A rate-limited row names its limit and key (`rate_limit`, `rate_key`), its weight, and
-- the step the limit applies to (`rate_step`): every execution of that step pays — its
-- first, a replay, a re-run after a lost lease — and no other step does, so an outcome
-- that moves the row on leaves the limit behind without writing it.
-- The claim that picks it takes its tokens (admission), in the pick's order, from the
-- key's bucket. A row whose tokens are not there yet is not refused: it reserves them —
-- the bucket goes below zero by its weight — and becomes eligible at the instant its
-- tokens are due (`rate_paid`, `eligible_at`), so it never spins and no row behind it
-- takes tokens it is owed. A paid row is claimed without another admission, and the
-- claim that runs it clears `rate_paid` (a replay of the step pays again).

-- The limits, written by the engines that declare them at start (the last start wins) or
-- by `Client::set_rate_limit`; read by every admission.
CREATE TABLE gd_rate_limits (
    name       text             PRIMARY KEY,
    per_second double precision NOT NULL,
    burst      double precision NOT NULL,
    updated_at timestamptz      NOT NULL DEFAULT now(),
    CONSTRAINT gd_rate_limits_name_length CHECK (octet_length(name) BETWEEN 1 AND 255),
    CONSTRAINT gd_rate_limits_rate CHECK (per_second > 0 AND per_second <= 1e9),
    CONSTRAINT gd_rate_limits_burst CHECK (burst >= 1 AND burst <= 1e9)
);

-- One bucket per (limit, key), minted by the first admission of the key (full, minus what
-- it took). `tokens` at `at`; the tokens at t are least(burst, tokens + (t - at) × rate).
-- Negative: tokens reserved by rows waiting for them. The collector deletes a bucket once
-- it is full again (nothing reserved, idle long enough to refill).
CREATE TABLE gd_buckets (
    name   text             NOT NULL REFERENCES gd_rate_limits (name) ON DELETE CASCADE,
    key    text             NOT NULL,
    tokens double precision NOT NULL,
    at     timestamptz      NOT NULL,
    PRIMARY KEY (name, key)
);

ALTER TABLE gd_instances
    ADD COLUMN rate_limit  text,
    ADD COLUMN rate_key    text,
    ADD COLUMN rate_weight double precision,
    ADD COLUMN rate_step   text,
    ADD COLUMN rate_paid   boolean NOT NULL DEFAULT false;

ALTER TABLE gd_instances ADD CONSTRAINT gd_instances_rate_limit_fk
    FOREIGN KEY (rate_limit) REFERENCES gd_rate_limits (name) NOT VALID;

ALTER TABLE gd_instances ADD CONSTRAINT gd_instances_rate CHECK (
    rate_limit IS NULL
    OR (rate_key IS NOT NULL AND octet_length(rate_key) <= 1024 AND rate_step IS NOT NULL
        AND rate_weight > 0 AND rate_weight <= 1e9)
) NOT VALID;

-- Rows waiting for reserved tokens, by when they are due: a picker that found nothing to
-- run sleeps until the first of them instead of a whole poll interval (one probe). Only
-- such rows have an entry.
CREATE INDEX gd_instances_rate_due ON gd_instances (queue, eligible_at)
    WHERE status = 'runnable' AND rate_paid;

-- The weight an insert stores: as given when it fits its limit's burst (or the limit is
-- unknown: the foreign key then refuses the row), negated when it does not, so that the
-- row's check refuses it — a weight above the burst could never be admitted.
CREATE FUNCTION gd_rate_weight(p_limit text, p_weight double precision)
RETURNS double precision LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN l.burst IS NULL OR p_weight <= l.burst THEN p_weight ELSE -p_weight END
      FROM (SELECT (SELECT burst FROM gd_rate_limits WHERE name = p_limit) AS burst) l
$$;
