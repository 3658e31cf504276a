-- expire_order as Postgres prints it (pg_get_functiondef): the current definition, in one place.
-- Defined by 20261202000004_order_lifecycle.sql; settings changed by 20261204000015_no_jit.sql.
-- A booking test holds this file to the migrated database: change the function in a new migration, then
-- copy its new definition here.
CREATE OR REPLACE FUNCTION public.expire_order(p_order uuid)
 RETURNS boolean
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
 SET jit TO 'off'
AS $function$
BEGIN
    PERFORM 1 FROM orders WHERE id = p_order AND status = 'reserved' AND payment_due_at <= now() FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    RETURN transition_order(p_order, 'reserved', 'cancelled', 'expired', 'order.cancelled');
END;
$function$
