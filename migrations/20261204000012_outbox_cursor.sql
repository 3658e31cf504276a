-- The outbox relay keeps a cursor instead of marking each row published.
--
-- Marking cost every order event an UPDATE of its row after the relay published it (a new row version with the
-- whole jsonb, not HOT because the partial index on published_at changes, so two more index entries) and two row
-- locks (FOR UPDATE SKIP LOCKED, then the update): 7 of the 22 WAL records and about 40% of the WAL bytes a
-- checkout wrote (pg_waldump --stats over `booking bench`'s checkout phase, 2026-12-04), and the relay's
-- statements were 22 µs of Postgres CPU per checkout.
--
-- Now each row carries the id of the transaction that wrote it (txid, xid8: 64 bits, never wraps), and the relay
-- publishes in (txid, id) order the rows past its cursor whose transaction is older than the oldest one still
-- running (pg_snapshot_xmin of the statement's snapshot). Every transaction below that xmin has ended, so the set
-- of such rows can only grow beyond the cursor, never behind it: a row committed later has a txid at or above that
-- xmin. An order's later change is made by a transaction that started after the earlier one committed, so it has
-- a larger txid: an order's events are published in the order they happened. The cursor is one row, locked FOR
-- UPDATE SKIP LOCKED, so relays take turns; it moves in the transaction that published, so a relay that dies
-- after XADD publishes the same rows again (at least once, as before; consumers dedupe on id).
--
-- The price: a transaction that has written something and stays open (an operator's session left idle in a
-- transaction, a prepared transaction) holds the relay back until it ends. The order-writing transactions are
-- single statements.

-- Every existing row gets this migration's transaction id; rows written later get their own.
ALTER TABLE order_events ADD COLUMN txid xid8 NOT NULL DEFAULT pg_current_xact_id();

CREATE TABLE outbox_cursor (
    -- One row.
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    -- The last row published: (txid, id) of order_events.
    txid     xid8 NOT NULL,
    id       bigint NOT NULL
);

-- Rows written before this migration all share its txid, so the cursor stands just before the first of them not
-- yet published (some published ones after it may be published again: consumers dedupe on id).
INSERT INTO outbox_cursor (txid, id)
SELECT pg_current_xact_id(),
       coalesce((SELECT min(id) - 1 FROM order_events WHERE published_at IS NULL),
                (SELECT max(id) FROM order_events), 0);

-- The relay reads in (txid, id) order, and (txid, id) is unique (id is): it becomes the key. Nothing looks a row
-- up by its id alone, so the index on id goes, and an event costs one index entry fewer than before.
ALTER TABLE order_events DROP CONSTRAINT order_events_pkey, ADD PRIMARY KEY (txid, id);
DROP INDEX order_events_unpublished;
ALTER TABLE order_events DROP COLUMN published_at;
