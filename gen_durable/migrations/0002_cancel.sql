-- Cancellation (Client::cancel): an executing instance is cancelled after its current
-- step; the flag tells the committing worker (and the reaper, and a drain) to fail it
-- with "cancelled" instead of applying the step's outcome.
ALTER TABLE gd_instances ADD COLUMN cancel_requested boolean NOT NULL DEFAULT false;
