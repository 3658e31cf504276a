-- Checkout plans that hold whatever the planner's statistics say.
--
-- checkout_order and checkout_batch keep one generic plan per statement for a connection's life
-- (plan_cache_mode = force_generic_plan, migration 006: re-planning every call was most of their cost). A plan
-- made while the order tables are empty or tiny by their statistics (a young database: autovacuum analyses a
-- table after its first 50 rows, and an operator may run ANALYZE at any time) scans them whole, and stays in use
-- as they grow until the next ANALYZE. Measured (`booking bench`, which now analyses its scratch schema before
-- the checkouts): checkouts fell from about 0.25 to 0.04-0.08 of pgbench, and one batch of 16 took 50 s once the
-- tables held 7,000 orders, because the account-cap count joined order_seats to orders by scanning both.
--
-- So both functions now plan as their statements are meant to run, by construction rather than by cost: every
-- lookup is an index lookup (no sequential scans, hash or merge joins, which never pay for a basket's handful of
-- point lookups), and the account-cap count is written as nested lookups (the account's orders by
-- orders_event_account, then each order's seats by order_seats_pkey), so no join order is left to guess. The
-- count is the same as before: the account's active seats for the event not past their deadline.

CREATE OR REPLACE FUNCTION checkout_order(
    p_order uuid, p_event bigint, p_account text, p_hold uuid, p_seats bigint[], p_currency text,
    p_payment_window_seconds double precision, p_max_seats_per_account integer, p_key text, p_fingerprint text
) RETURNS TABLE (
    outcome text, order_id uuid, detail bigint, response_body jsonb,
    seat_id bigint, ticket_type_id bigint, price_cents bigint,
    status text, hold_token uuid, total_cents bigint, currency text, payment_due_at timestamptz, created_at timestamptz
) LANGUAGE plpgsql AS $$
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
           EXISTS (SELECT 1 FROM order_seats os
                   WHERE os.event_id = p_event AND os.seat_id = ANY (p_seats) AND os.active
                     AND os.expires_at <= now())
    INTO v_owned, v_seats, v_types, v_prices, v_total, v_stale
    FROM (SELECT array_agg(a.seat_id ORDER BY a.seat_id) AS seats,
                 array_agg(a.ticket_type_id ORDER BY a.seat_id) AS types,
                 array_agg(t.price_cents ORDER BY a.seat_id) AS prices, sum(t.price_cents) AS total
          FROM seat_allocations a JOIN ticket_types t ON t.id = a.ticket_type_id
          WHERE a.event_id = p_event AND a.seat_id = ANY (p_seats)) p;
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
$$ SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_hashjoin = off
  SET enable_mergejoin = off;

CREATE OR REPLACE FUNCTION checkout_batch(
    p_event bigint, p_currency text, p_payment_window_seconds double precision, p_max_seats_per_account integer,
    p_orders uuid[], p_accounts text[], p_holds uuid[], p_keys text[], p_fingerprints text[],
    p_seat_items integer[], p_seat_ids bigint[]
) RETURNS TABLE (
    item integer, outcome text, order_id uuid, detail bigint, response_body jsonb,
    seat_id bigint, ticket_type_id bigint, price_cents bigint,
    status text, hold_token uuid, total_cents bigint, currency text, payment_due_at timestamptz,
    created_at timestamptz, error_state text, error_constraint text
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    n integer := cardinality(p_orders);
    v_due timestamptz := now() + make_interval(secs => p_payment_window_seconds);
    v_fast boolean[];
    -- The new items' seats: item, seat, ticket type, price.
    v_items integer[];
    v_seats bigint[];
    v_types bigint[];
    v_prices bigint[];
    -- New items with a seat withdrawn between the check and the pricing; one of them.
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

    -- Which items are plainly new, in one statement whose snapshot follows the locks. An item's key lock is
    -- tried first, as checkout_order does; an item whose key is taken by a request in flight is not new.
    SELECT array_agg(
               pg_try_advisory_xact_lock(hashtextextended(u.a || '/' || u.k, 7))
               AND b.basket > 0
               AND b.priced = b.basket
               AND NOT b.taken
               AND NOT b.shared_seat
               AND (SELECT count(*) FROM unnest(p_accounts) AS x WHERE x = u.a) = 1
               AND (SELECT count(*) FROM unnest(p_holds) AS x WHERE x = u.h) = 1
               AND NOT EXISTS (SELECT 1 FROM idempotency_keys k WHERE k.account_id = u.a AND k.key = u.k)
               AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.hold_token = u.h)
               AND (SELECT coalesce(sum((SELECT count(*) FILTER (WHERE os.active
                                                                 AND (os.expires_at IS NULL OR os.expires_at > now()))
                                         FROM order_seats os WHERE os.order_id = o.id)), 0)::bigint
                    FROM orders o WHERE o.event_id = p_event AND o.account_id = u.a) + b.basket
                   <= p_max_seats_per_account
               ORDER BY u.i)
    INTO v_fast
    FROM unnest(p_accounts, p_keys, p_holds) WITH ORDINALITY AS u (a, k, h, i)
    CROSS JOIN LATERAL (
        SELECT count(*) AS basket, count(al.seat_id) AS priced,
               coalesce(bool_or(EXISTS (SELECT 1 FROM order_seats os
                                        WHERE os.event_id = p_event AND os.seat_id = s.seat AND os.active)), false)
                   AS taken,
               coalesce(bool_or((SELECT count(*) FROM unnest(p_seat_ids) AS z WHERE z = s.seat) > 1), false)
                   AS shared_seat
        FROM unnest(p_seat_items, p_seat_ids) AS s (it, seat)
        LEFT JOIN seat_allocations al ON al.event_id = p_event AND al.seat_id = s.seat
        WHERE s.it = u.i) b;

    -- The new items' seats priced from their allocations, in seat order. A seat withdrawn since the check above
    -- (another snapshot) sends its item the slow way, where checkout_order names it: a basket is written whole
    -- or not at all. A withdrawal after this statement fails the insert's foreign-key check instead.
    SELECT array_agg(s.it ORDER BY s.seat), array_agg(s.seat ORDER BY s.seat),
           array_agg(al.ticket_type_id ORDER BY s.seat), array_agg(t.price_cents ORDER BY s.seat)
    INTO v_items, v_seats, v_types, v_prices
    FROM unnest(p_seat_items, p_seat_ids) AS s (it, seat)
    JOIN seat_allocations al ON al.event_id = p_event AND al.seat_id = s.seat
    JOIN ticket_types t ON t.id = al.ticket_type_id
    WHERE v_fast[s.it];
    SELECT coalesce(array_agg(b.it), '{}') INTO v_short
    FROM (SELECT x.it, count(*) AS basket FROM unnest(p_seat_items) AS x (it) GROUP BY x.it) b
    WHERE v_fast[b.it] AND b.basket <> (SELECT count(*) FROM unnest(v_items) AS y WHERE y = b.it);
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
$$ SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_hashjoin = off
  SET enable_mergejoin = off;
