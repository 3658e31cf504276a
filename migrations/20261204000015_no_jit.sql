-- No JIT compilation in the order functions.
--
-- Postgres compiles a plan to machine code when its estimated cost passes jit_above_cost (100,000 by default),
-- on every execution. The functions keep one generic plan per statement for a connection's life (migration
-- 006), and a generic plan's cost comes from the statistics of the moment, which a young, growing database
-- changes under them (autovacuum analyses the order tables after their first rows, and again as they grow).
-- Measured (`booking bench` with three rounds, 2026-12-04): once autovacuum had analysed the tables after the
-- first round's 50,000 orders, checkout_batch's check statement was estimated at 112,000 (the account-cap
-- count's seats per order put at 253 instead of 1), was compiled at every call (auto_explain: "JIT: Functions:
-- 59"), and took 31-53 ms instead of about 2; Postgres spent 630-690 µs per checkout instead of about 120,
-- and checkouts fell from 6,000 to 2,300 a second. A function's statement never runs long enough for
-- compiled code to pay back its compilation, so the functions turn it off for themselves, whoever calls
-- them. (booking's own connections also turn it off: see `connect_postgres`.)
--
-- ALTER FUNCTION ... SET adds to each function's settings. A later CREATE OR REPLACE of one of these
-- functions replaces its settings with its own SET clauses, so it must restate `SET jit = off`.

ALTER FUNCTION checkout_order(uuid, bigint, text, uuid, bigint[], text, double precision, integer, text, text)
    SET jit = off;
ALTER FUNCTION checkout_batch(bigint, text, double precision, integer, uuid[], text[], uuid[], text[], text[],
                              integer[], bigint[])
    SET jit = off;
ALTER FUNCTION transition_order(uuid, text, text, text, text) SET jit = off;
ALTER FUNCTION order_snapshot(uuid) SET jit = off;
ALTER FUNCTION expire_order(uuid) SET jit = off;
ALTER FUNCTION expire_stale_orders_on(bigint, bigint[]) SET jit = off;
