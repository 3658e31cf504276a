-- checkout_order as Postgres prints it (pg_get_functiondef): the current definition, in one place.
-- Defined by 20261202000010_basket_lookups.sql; settings changed by 20261204000015_no_jit.sql.
-- A booking test holds this file to the migrated database: change the function in a new migration, then
-- copy its new definition here.
CREATE OR REPLACE FUNCTION public.checkout_order(p_order uuid, p_event bigint, p_account text, p_hold uuid, p_seats bigint[], p_currency text, p_payment_window_seconds double precision, p_max_seats_per_account integer, p_key text, p_fingerprint text)
 RETURNS TABLE(outcome text, order_id uuid, detail bigint, response_body jsonb, seat_id bigint, ticket_type_id bigint, price_cents bigint, status text, hold_token uuid, total_cents bigint, currency text, payment_due_at timestamp with time zone, created_at timestamp with time zone)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
 SET enable_seqscan TO 'off'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
    v_key idempotency_keys%ROWTYPE;
    v_owned bigint;
    v_missing bigint;
    v_due timestamptz := now() + make_interval(secs => p_payment_window_seconds);
    -- The basket priced from its allocations, by seat id.
    v_seats bigint[];
    v_types bigint[];
    v_prices bigint[];
    v_total bigint;
    v_stale boolean;
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtextextended(p_account || '/' || p_key, 7)) THEN
        RETURN QUERY SELECT 'in_flight', NULL::uuid, NULL::bigint, NULL::jsonb, NULL::bigint, NULL::bigint,
            NULL::bigint, NULL::text, NULL::uuid, NULL::bigint, NULL::text, NULL::timestamptz, NULL::timestamptz;
        RETURN;
    END IF;

    SELECT * INTO v_key FROM idempotency_keys k WHERE k.account_id = p_account AND k.key = p_key;
    IF FOUND THEN
        IF v_key.fingerprint <> p_fingerprint THEN
            RETURN QUERY SELECT 'mismatch', NULL::uuid, NULL::bigint, NULL::jsonb, NULL::bigint, NULL::bigint,
                NULL::bigint, NULL::text, NULL::uuid, NULL::bigint, NULL::text, NULL::timestamptz, NULL::timestamptz;
        ELSIF v_key.order_id IS NULL THEN
            RETURN QUERY SELECT 'replay', NULL::uuid, v_key.response_status::bigint, v_key.response_body,
                NULL::bigint, NULL::bigint, NULL::bigint, NULL::text, NULL::uuid, NULL::bigint, NULL::text,
                NULL::timestamptz, NULL::timestamptz;
        ELSE
            RETURN QUERY SELECT 'replay', o.id, v_key.response_status::bigint, NULL::jsonb,
                os.seat_id, os.ticket_type_id, os.price_cents, o.status, o.hold_token, o.total_cents,
                o.currency::text, o.payment_due_at, o.created_at
            FROM orders o JOIN order_seats os ON os.order_id = o.id WHERE o.id = v_key.order_id;
        END IF;
        RETURN;
    END IF;

    -- Serialise checkouts of one account for one event, so the per-account cap cannot be raced; the count
    -- below is a later statement, so its snapshot sees every checkout of the account that committed first.
    PERFORM pg_advisory_xact_lock(hashtextextended(p_account || '/' || p_event::text, 11));

    -- The account's seats sold now, the basket priced from its allocations (by seat id), and whether a seat
    -- of it is still in a reserved order past its deadline: one statement.
    SELECT (SELECT coalesce(sum((SELECT count(*) FILTER (WHERE os.active
                                                         AND (os.expires_at IS NULL OR os.expires_at > now()))
                                 FROM order_seats os WHERE os.order_id = o.id)), 0)::bigint
            FROM orders o WHERE o.event_id = p_event AND o.account_id = p_account),
           p.seats, p.types, p.prices, p.total,
           EXISTS (SELECT 1 FROM unnest(p_seats) AS b (seat)
                   CROSS JOIN LATERAL (SELECT 1 FROM order_seats os
                                       WHERE os.event_id = p_event AND os.seat_id = b.seat AND os.active
                                         AND os.expires_at <= now() OFFSET 0) os)
    INTO v_owned, v_seats, v_types, v_prices, v_total, v_stale
    FROM (SELECT array_agg(a.seat_id ORDER BY a.seat_id) AS seats,
                 array_agg(a.ticket_type_id ORDER BY a.seat_id) AS types,
                 array_agg(t.price_cents ORDER BY a.seat_id) AS prices, sum(t.price_cents) AS total
          FROM (SELECT DISTINCT b.seat FROM unnest(p_seats) AS b (seat)) b
          CROSS JOIN LATERAL (SELECT a.seat_id, a.ticket_type_id FROM seat_allocations a
                              WHERE a.event_id = p_event AND a.seat_id = b.seat OFFSET 0) a
          JOIN ticket_types t ON t.id = a.ticket_type_id) p;
    IF v_owned + cardinality(p_seats) > p_max_seats_per_account THEN
        RETURN QUERY SELECT 'account_cap', NULL::uuid, v_owned, NULL::jsonb, NULL::bigint, NULL::bigint,
            NULL::bigint, NULL::text, NULL::uuid, NULL::bigint, NULL::text, NULL::timestamptz, NULL::timestamptz;
        RETURN;
    END IF;
    -- A basket's seats are distinct (the hold refused duplicates), so fewer priced seats means one is missing.
    IF coalesce(cardinality(v_seats), 0) < cardinality(p_seats) THEN
        SELECT s INTO v_missing FROM unnest(p_seats) AS s WHERE s <> ALL (coalesce(v_seats, '{}')) LIMIT 1;
        RETURN QUERY SELECT 'not_on_sale', NULL::uuid, v_missing, NULL::jsonb, NULL::bigint, NULL::bigint,
            NULL::bigint, NULL::text, NULL::uuid, NULL::bigint, NULL::text, NULL::timestamptz, NULL::timestamptz;
        RETURN;
    END IF;
    IF v_stale THEN
        PERFORM expire_stale_orders_on(p_event, v_seats);
    END IF;

    -- The order, its seats, the key's answer and the outbox row (order_snapshot(p_order), from what is written
    -- here), in one statement; the answer comes from the same arrays.
    RETURN QUERY
    WITH o AS (
        INSERT INTO orders (id, event_id, account_id, status, hold_token, total_cents, currency, payment_due_at)
        VALUES (p_order, p_event, p_account, 'reserved', p_hold, v_total, p_currency, v_due)
    ), s AS (
        INSERT INTO order_seats (order_id, event_id, seat_id, ticket_type_id, price_cents, expires_at)
        SELECT p_order, p_event, u.seat, u.ticket_type, u.price, v_due
        FROM unnest(v_seats, v_types, v_prices) AS u (seat, ticket_type, price)
    ), k AS (
        INSERT INTO idempotency_keys (account_id, key, fingerprint, response_status, order_id)
        VALUES (p_account, p_key, p_fingerprint, 201, p_order)
    ), e AS (
        INSERT INTO order_events (order_id, event_id, kind, from_status, to_status, data)
        VALUES (p_order, p_event, 'order.reserved', NULL, 'reserved', jsonb_build_object(
            'order_id', p_order, 'event_id', p_event, 'account_id', p_account, 'status', 'reserved',
            'cancel_reason', NULL, 'total_cents', v_total, 'currency', p_currency::char(3),
            'payment_due_at', v_due, 'payment_id', NULL, 'seat_ids', to_jsonb(v_seats)))
    )
    SELECT 'created', p_order, 201::bigint, NULL::jsonb,
        u.seat, u.ticket_type, u.price, 'reserved'::text, p_hold, v_total, p_currency::char(3)::text, v_due, now()
    FROM unnest(v_seats, v_types, v_prices) AS u (seat, ticket_type, price);
END;
$function$
