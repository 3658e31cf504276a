-- expire_stale_orders_on as Postgres prints it (pg_get_functiondef): the current definition, in one place.
-- Defined by 20261202000010_basket_lookups.sql; settings changed by 20261204000015_no_jit.sql.
-- A booking test holds this file to the migrated database: change the function in a new migration, then
-- copy its new definition here.
CREATE OR REPLACE FUNCTION public.expire_stale_orders_on(p_event bigint, p_seats bigint[])
 RETURNS void
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
 SET jit TO 'off'
AS $function$
BEGIN
    PERFORM expire_order(o.order_id)
    FROM (SELECT DISTINCT os.order_id FROM unnest(p_seats) AS b (seat)
          CROSS JOIN LATERAL (SELECT os.order_id FROM order_seats os
                              WHERE os.event_id = p_event AND os.seat_id = b.seat AND os.active
                                AND os.expires_at <= now() OFFSET 0) os
          -- One lock order for every caller, so two checkouts freeing the same orders cannot deadlock.
          ORDER BY os.order_id) o;
END;
$function$
