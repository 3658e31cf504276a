-- checkout_batch as Postgres prints it (pg_get_functiondef): the current definition, in one place.
-- Defined by 20261204000014_checkout_batch_linear.sql; settings changed by 20261204000015_no_jit.sql.
-- A booking test holds this file to the migrated database: change the function in a new migration, then
-- copy its new definition here.
CREATE OR REPLACE FUNCTION public.checkout_batch(p_event bigint, p_currency text, p_payment_window_seconds double precision, p_max_seats_per_account integer, p_orders uuid[], p_accounts text[], p_holds uuid[], p_keys text[], p_fingerprints text[], p_seat_items integer[], p_seat_ids bigint[])
 RETURNS TABLE(item integer, outcome text, order_id uuid, detail bigint, response_body jsonb, seat_id bigint, ticket_type_id bigint, price_cents bigint, status text, hold_token uuid, total_cents bigint, currency text, payment_due_at timestamp with time zone, created_at timestamp with time zone, error_state text, error_constraint text)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
 SET enable_seqscan TO 'off'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
    n integer := cardinality(p_orders);
    v_due timestamptz := now() + make_interval(secs => p_payment_window_seconds);
    v_fast boolean[];
    -- Items whose account or hold appears more than once in the batch.
    v_repeated bigint[];
    -- The new items' seats: item, seat, ticket type, price.
    v_items integer[];
    v_seats bigint[];
    v_types bigint[];
    v_prices bigint[];
    -- New items with a seat withdrawn between the check and the pricing.
    v_short integer[];
    v_item integer;
    v_state text;
    v_constraint text;
BEGIN
    -- Every account's lock for the event, in one order for every caller (checkout_order takes the same lock;
    -- taking it again there is free).
    PERFORM pg_advisory_xact_lock(l.k)
    FROM (SELECT DISTINCT hashtextextended(a || '/' || p_event::text, 11) AS k FROM unnest(p_accounts) AS a
          ORDER BY 1) l;

    SELECT coalesce(array_agg(d.i), '{}') INTO v_repeated
    FROM (SELECT u.i, count(*) OVER (PARTITION BY u.a) AS accounts, count(*) OVER (PARTITION BY u.h) AS holds
          FROM unnest(p_accounts, p_holds) WITH ORDINALITY AS u (a, h, i)) d
    WHERE d.accounts > 1 OR d.holds > 1;

    -- Which items are plainly new, in one statement whose snapshot follows the locks. An item's key lock is
    -- tried first, as checkout_order does; an item whose key is taken by a request in flight is not new. Every
    -- item has a row in the grouping (one with no seat), so the answer has one entry per item, in item order.
    SELECT array_agg(
               pg_try_advisory_xact_lock(hashtextextended(p_accounts[b.it] || '/' || p_keys[b.it], 7))
               AND b.basket > 0
               AND b.free
               AND b.it <> ALL (v_repeated)
               AND NOT EXISTS (SELECT 1 FROM idempotency_keys k
                               WHERE k.account_id = p_accounts[b.it] AND k.key = p_keys[b.it])
               AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.hold_token = p_holds[b.it])
               AND (SELECT coalesce(sum((SELECT count(*) FILTER (WHERE os.active
                                                                 AND (os.expires_at IS NULL OR os.expires_at > now()))
                                         FROM order_seats os WHERE os.order_id = o.id)), 0)::bigint
                    FROM orders o WHERE o.event_id = p_event AND o.account_id = p_accounts[b.it]) + b.basket
                   <= p_max_seats_per_account
               ORDER BY b.it)
    INTO v_fast
    FROM (SELECT s.it, count(s.seat) AS basket,
                 -- Every seat allocated, in no active order, and in the batch once.
                 bool_and(s.seat IS NULL OR (s.once AND al.allocated AND os.taken IS NULL)) AS free
          FROM (SELECT s.it, s.seat, count(*) OVER (PARTITION BY s.seat) = 1 AS once
                FROM (SELECT x.it, x.seat FROM unnest(p_seat_items, p_seat_ids) AS x (it, seat)
                      WHERE x.it BETWEEN 1 AND n
                      UNION ALL
                      SELECT g, NULL FROM generate_series(1, n) AS g) s) s
          LEFT JOIN LATERAL (SELECT true AS allocated FROM seat_allocations al
                             WHERE al.event_id = p_event AND al.seat_id = s.seat OFFSET 0) al ON true
          LEFT JOIN LATERAL (SELECT true AS taken FROM order_seats os
                             WHERE os.event_id = p_event AND os.seat_id = s.seat AND os.active OFFSET 0) os ON true
          GROUP BY s.it) b;

    -- The new items' seats priced from their allocations, in seat order. A seat withdrawn since the check above
    -- (another snapshot) sends its item the slow way, where checkout_order names it: a basket is written whole
    -- or not at all. A withdrawal after this statement fails the insert's foreign-key check instead.
    SELECT array_agg(s.it ORDER BY s.seat) FILTER (WHERE t.id IS NOT NULL),
           array_agg(s.seat ORDER BY s.seat) FILTER (WHERE t.id IS NOT NULL),
           array_agg(al.ticket_type_id ORDER BY s.seat) FILTER (WHERE t.id IS NOT NULL),
           array_agg(t.price_cents ORDER BY s.seat) FILTER (WHERE t.id IS NOT NULL),
           coalesce(array_agg(DISTINCT s.it) FILTER (WHERE t.id IS NULL), '{}')
    INTO v_items, v_seats, v_types, v_prices, v_short
    FROM unnest(p_seat_items, p_seat_ids) AS s (it, seat)
    LEFT JOIN seat_allocations al ON al.event_id = p_event AND al.seat_id = s.seat
    LEFT JOIN ticket_types t ON t.id = al.ticket_type_id
    WHERE v_fast[s.it];
    IF cardinality(v_short) > 0 THEN
        FOREACH v_item IN ARRAY v_short LOOP
            v_fast[v_item] := false;
        END LOOP;
        SELECT array_agg(u.it ORDER BY u.seat), array_agg(u.seat ORDER BY u.seat),
               array_agg(u.ticket_type ORDER BY u.seat), array_agg(u.price ORDER BY u.seat)
        INTO v_items, v_seats, v_types, v_prices
        FROM unnest(v_items, v_seats, v_types, v_prices) AS u (it, seat, ticket_type, price)
        WHERE u.it <> ALL (v_short);
    END IF;

    -- The new items, all at once: orders, seats (in seat order, one lock order for every writer), keys and
    -- outbox rows (order_snapshot, from what is written here).
    RETURN QUERY
    WITH priced AS (
        SELECT u.it, u.seat, u.ticket_type, u.price, sum(u.price) OVER (PARTITION BY u.it)::bigint AS total
        FROM unnest(v_items, v_seats, v_types, v_prices) AS u (it, seat, ticket_type, price)
    ), o AS (
        INSERT INTO orders (id, event_id, account_id, status, hold_token, total_cents, currency, payment_due_at)
        SELECT DISTINCT ON (p.it) p_orders[p.it], p_event, p_accounts[p.it], 'reserved', p_holds[p.it], p.total,
               p_currency, v_due
        FROM priced p ORDER BY p.it
    ), s AS (
        INSERT INTO order_seats (order_id, event_id, seat_id, ticket_type_id, price_cents, expires_at)
        SELECT p_orders[p.it], p_event, p.seat, p.ticket_type, p.price, v_due FROM priced p ORDER BY p.seat
    ), k AS (
        INSERT INTO idempotency_keys (account_id, key, fingerprint, response_status, order_id)
        SELECT DISTINCT ON (p.it) p_accounts[p.it], p_keys[p.it], p_fingerprints[p.it], 201, p_orders[p.it]
        FROM priced p ORDER BY p.it
    ), e AS (
        INSERT INTO order_events (order_id, event_id, kind, from_status, to_status, data)
        SELECT p_orders[p.it], p_event, 'order.reserved', NULL, 'reserved', jsonb_build_object(
            'order_id', p_orders[p.it], 'event_id', p_event, 'account_id', p_accounts[p.it], 'status', 'reserved',
            'cancel_reason', NULL, 'total_cents', min(p.total), 'currency', p_currency::char(3),
            'payment_due_at', v_due, 'payment_id', NULL, 'seat_ids', jsonb_agg(p.seat ORDER BY p.seat))
        FROM priced p GROUP BY p.it ORDER BY p.it
    )
    SELECT p.it, 'created', p_orders[p.it], 201::bigint, NULL::jsonb, p.seat, p.ticket_type, p.price,
           'reserved'::text, p_holds[p.it], p.total, p_currency::char(3)::text, v_due, now(), NULL::text, NULL::text
    FROM priced p;

    -- Everything else, one by one, each in its own subtransaction.
    FOR i IN 1 .. n LOOP
        CONTINUE WHEN v_fast[i];
        BEGIN
            RETURN QUERY
            SELECT i, c.*, NULL::text, NULL::text
            FROM checkout_order(p_orders[i], p_event, p_accounts[i], p_holds[i],
                                ARRAY(SELECT s.seat FROM unnest(p_seat_items, p_seat_ids) WITH ORDINALITY
                                          AS s (it, seat, pos)
                                      WHERE s.it = i ORDER BY s.pos),
                                p_currency, p_payment_window_seconds, p_max_seats_per_account, p_keys[i],
                                p_fingerprints[i]) c;
        EXCEPTION WHEN unique_violation OR foreign_key_violation THEN
            GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_constraint = CONSTRAINT_NAME;
            RETURN QUERY SELECT i, 'error'::text, NULL::uuid, NULL::bigint, NULL::jsonb, NULL::bigint,
                NULL::bigint, NULL::bigint, NULL::text, NULL::uuid, NULL::bigint, NULL::text, NULL::timestamptz,
                NULL::timestamptz, v_state, v_constraint;
        END;
    END LOOP;
END;
$function$
