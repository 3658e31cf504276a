-- The order lifecycle's functions get the plans migration 008 gave checkout: index lookups whatever the
-- statistics say. A payment or a cancellation (transition_order and the order_snapshot it writes) scanned the
-- order tables whole six times when they had been analysed empty (the booking test
-- orders_are_looked_up_by_index_even_when_the_statistics_say_the_tables_are_empty), and every order of an
-- on-sale goes through it once it is paid.
--
-- transition_order, as in 20261202000004, with one change: it deactivates the order's seats "WHERE order_id =
-- p_order AND active IS DISTINCT FROM false" instead of "AND active". The column is NOT NULL, so the rows are the
-- same, but the old test let the planner walk the whole partial index of active seats (every seat sold) instead of
-- looking the order's seats up by order_seats_pkey.

CREATE OR REPLACE FUNCTION transition_order(p_order uuid, p_from text, p_to text, p_reason text, p_kind text)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    UPDATE orders SET status = p_to, cancel_reason = p_reason, updated_at = now(),
                      paid_at = CASE WHEN p_to = 'paid' THEN now() ELSE paid_at END
    WHERE id = p_order AND status = p_from;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_to = 'paid' THEN
        UPDATE order_seats SET expires_at = NULL WHERE order_id = p_order;
    ELSIF p_to NOT IN ('reserved', 'paid') THEN
        UPDATE order_seats SET active = false WHERE order_id = p_order AND active IS DISTINCT FROM false;
    END IF;
    INSERT INTO order_events (order_id, event_id, kind, from_status, to_status, data)
    SELECT p_order, o.event_id, p_kind, p_from, p_to, order_snapshot(p_order) FROM orders o WHERE o.id = p_order;
    RETURN true;
END;
$$ SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off;

ALTER FUNCTION order_snapshot(uuid) SET enable_seqscan = off;
ALTER FUNCTION order_snapshot(uuid) SET enable_hashjoin = off;
ALTER FUNCTION order_snapshot(uuid) SET enable_mergejoin = off;
ALTER FUNCTION expire_order(uuid) SET enable_seqscan = off;
ALTER FUNCTION expire_order(uuid) SET enable_hashjoin = off;
ALTER FUNCTION expire_order(uuid) SET enable_mergejoin = off;
ALTER FUNCTION expire_stale_orders_on(bigint, bigint[]) SET enable_seqscan = off;
ALTER FUNCTION expire_stale_orders_on(bigint, bigint[]) SET enable_hashjoin = off;
ALTER FUNCTION expire_stale_orders_on(bigint, bigint[]) SET enable_mergejoin = off;
