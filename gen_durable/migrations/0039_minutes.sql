-- The collector's per-minute rollup of finished instances, for the dashboard's charts over
-- hours and days (schema.sql says what each column holds).
CREATE TABLE gd_minutes (
    minute  timestamptz NOT NULL,
    queue   text        NOT NULL,
    done    bigint      NOT NULL,
    failed  bigint      NOT NULL,
    took_ms bigint[]    NOT NULL,
    PRIMARY KEY (queue, minute)
);

-- The collector forgets minutes by age, across queues.
CREATE INDEX gd_minutes_minute ON gd_minutes (minute);
