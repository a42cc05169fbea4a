-- Leases that write no WAL: an unlogged table, emptied by a server crash or lost in a
-- failover. Losing it is safe: every claimed row is claimable again at once, and the
-- worker that held a lost lease cannot commit (its lease row is gone; an epoch is the
-- clock in µs, never given twice, as v1's `gd_lease_epoch`). A claim takes a lease only
-- while the row is locked, and only where there is none: an expired lease is the
-- reaper's to delete.
CREATE UNLOGGED TABLE p_leases (
    id         bigint      PRIMARY KEY,
    epoch      bigint      NOT NULL,
    locked_by  text        NOT NULL,
    expires_at timestamptz NOT NULL
);
