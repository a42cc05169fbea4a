-- Queues an operator paused cluster-wide (`gen_durable pause QUEUE`, `Client::pause_queue`):
-- every node's pick skips a queue that has a row here (one primary-key probe per claim),
-- so a pause is durable and honored within one poll interval; deleting the row resumes it.
-- Rows already claimed finish their step.
CREATE TABLE gd_queue_pauses (
    queue      text        PRIMARY KEY,
    paused_at  timestamptz NOT NULL DEFAULT now(),
    -- Who paused it and why, as the operator said (shown by `status` and `explain`).
    reason     text
);
