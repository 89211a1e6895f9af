-- Reconciliation (PostgreSQL is the truth): when the broker last confirmed a
-- waiting job's message, what each look at a tenant queue found, and how many
-- deliveries each worker holds unclaimed per queue (worker/reconcile.py).

-- Set when a publish confirm clears the row's publish mark (and when a delivery
-- registers a capped job's row): a waiting row with no publish mark and a
-- published_at before a look had its message in the queue, in a worker's
-- hands, or lost.
ALTER TABLE jobs ADD COLUMN published_at timestamptz;

-- Rows already waiting on a confirmed publish count as published when they
-- last changed (before this migration the confirm time was not kept).
UPDATE jobs SET published_at = updated_at
WHERE status IN ('queued', 'retrying') AND publish_after IS NULL;

CREATE INDEX jobs_published_waiting ON jobs (queue, tenant, published_at)
    WHERE status IN ('queued', 'retrying') AND publish_after IS NULL;

-- The latest look at each (lane, tenant) queue: its ready messages and
-- consumers from a passive queue.declare, the waiting rows published before
-- the look, how many of them had no message by the count, and up to when the
-- rows that may be lost were confirmed; the next look compares against it.
-- looked_at: the pass's start (rows confirmed by then are counted); counted_at:
-- just after this queue's count (holding reports made since then cover it).
CREATE TABLE queue_looks (
    queue      text NOT NULL,
    tenant     text NOT NULL,
    looked_at  timestamptz NOT NULL,
    counted_at timestamptz,
    ready      integer,
    consumers  integer,
    waiting    integer NOT NULL,
    deficit    integer,
    suspects   timestamptz,
    PRIMARY KEY (queue, tenant)
);

-- Deliveries each worker holds unclaimed (waiting for a slot, a cap or an
-- unpaused tenant) per (lane, tenant) queue, reported every few seconds:
-- unacked, they are in no queue's ready count.
CREATE TABLE queue_holds (
    worker_id    text NOT NULL,
    queue        text NOT NULL,
    tenant       text NOT NULL,
    held         integer NOT NULL CHECK (held > 0),
    reported_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (worker_id, queue, tenant)
);

-- What each worker's consumers can hold unacked per tenant queue (its prefetch,
-- and what one of its aging sweeps keeps), reported with its holdings: a look
-- bounds a queue's unacked deliveries with the largest of the fleet.
CREATE TABLE reconcile_workers (
    worker_id    text PRIMARY KEY,
    prefetch     integer NOT NULL CHECK (prefetch >= 0),
    keep         integer NOT NULL CHECK (keep >= 0),
    reported_at  timestamptz NOT NULL DEFAULT now()
);

-- Aging sweeps (worker/aging_sweep.py), recorded as each begins: for a moment
-- a sweep holds up to ``taking`` of the queue's ready messages unacked, and a
-- look overlapping one must not count them lost.
CREATE TABLE queue_sweeps (
    worker_id   text NOT NULL,
    queue       text NOT NULL,
    tenant      text NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    taking      integer NOT NULL CHECK (taking >= 0),
    PRIMARY KEY (worker_id, queue, tenant)
);
