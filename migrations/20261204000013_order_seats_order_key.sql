-- The order's seats name their order without a foreign key, as its idempotency key and its outbox rows have since
-- migration 011.
--
-- The key was an after-row trigger on every seat a checkout wrote: it looked the order up again (inserted by the
-- same statement a moment before) and locked it FOR KEY SHARE, which wrote a lock record to the WAL: one of a
-- one-seat checkout's 16 WAL records (pg_waldump over `booking bench`'s checkout phase, 2026-12-04).
--
-- What it guarded still holds by construction: order seats are written only by checkout_order and
-- checkout_batch, in the statement that inserts their order, and nothing deletes orders (the cascade never ran).
-- An order seat without its order would be a seat the uniqueness guarantee counts as sold to nobody; the tests'
-- invariant check (after every concurrency test) looks for one, and for an order without seats.

ALTER TABLE order_seats DROP CONSTRAINT order_seats_order_id_fkey;
