-- order_snapshot as Postgres prints it (pg_get_functiondef): the current definition, in one place.
-- Defined by 20261202000006_checkout_leaner.sql; settings changed by 20261204000015_no_jit.sql.
-- A booking test holds this file to the migrated database: change the function in a new migration, then
-- copy its new definition here.
CREATE OR REPLACE FUNCTION public.order_snapshot(p_order uuid)
 RETURNS jsonb
 LANGUAGE plpgsql
 STABLE
 SET enable_seqscan TO 'off'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
 SET jit TO 'off'
AS $function$
BEGIN
    RETURN (SELECT jsonb_build_object(
        'order_id', o.id, 'event_id', o.event_id, 'account_id', o.account_id, 'status', o.status,
        'cancel_reason', o.cancel_reason, 'total_cents', o.total_cents, 'currency', o.currency,
        'payment_due_at', o.payment_due_at, 'payment_id', o.payment_id,
        'seat_ids', (SELECT jsonb_agg(os.seat_id ORDER BY os.seat_id) FROM order_seats os WHERE os.order_id = o.id))
    FROM orders o WHERE o.id = p_order);
END;
$function$
