-- transition_order as Postgres prints it (pg_get_functiondef): the current definition, in one place.
-- Defined by 20261202000009_lifecycle_plans.sql; settings changed by 20261204000015_no_jit.sql.
-- A booking test holds this file to the migrated database: change the function in a new migration, then
-- copy its new definition here.
CREATE OR REPLACE FUNCTION public.transition_order(p_order uuid, p_from text, p_to text, p_reason text, p_kind text)
 RETURNS boolean
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
 SET jit TO 'off'
AS $function$
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
$function$
