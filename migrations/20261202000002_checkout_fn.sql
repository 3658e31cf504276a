-- checkout_order: the whole Postgres side of a checkout in one statement, so it costs one round trip and one
-- commit. Called only through `store::orders::checkout`.
--
-- Steps, all inside the caller's (implicit) transaction:
--   1. try the idempotency key's advisory lock: taken by a request in flight -> 'in_flight'
--   2. the key answered before -> 'replay' (or 'mismatch' if it answered another request)
--   3. the account's advisory lock for the event, then its cap: too many seats -> 'account_cap' (detail = owned)
--   4. a seat with no allocation for the event -> 'not_on_sale' (detail = seat)
--   5. insert the order and its seats priced from their allocations, and the key's answer -> 'created'
-- A unique violation (the hold already checked out, or a seat already in an active order) is raised to the
-- caller, and the statement writes nothing.
-- Rows: one per seat of the order for 'created' and an order 'replay'; one row otherwise.

CREATE FUNCTION checkout_order(
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

    -- Serialise checkouts of one account for one event, so the per-account cap cannot be raced.
    PERFORM pg_advisory_xact_lock(hashtextextended(p_account || '/' || p_event::text, 11));
    SELECT count(*) INTO v_owned
    FROM order_seats os JOIN orders o ON o.id = os.order_id
    WHERE o.event_id = p_event AND o.account_id = p_account AND os.active;
    IF v_owned + cardinality(p_seats) > p_max_seats_per_account THEN
        RETURN QUERY SELECT 'account_cap', NULL::uuid, v_owned, NULL::jsonb, NULL::bigint, NULL::bigint,
            NULL::bigint, NULL::text, NULL::uuid, NULL::bigint, NULL::text, NULL::timestamptz, NULL::timestamptz;
        RETURN;
    END IF;

    SELECT s INTO v_missing FROM unnest(p_seats) AS s
    WHERE NOT EXISTS (SELECT 1 FROM seat_allocations a WHERE a.event_id = p_event AND a.seat_id = s)
    LIMIT 1;
    IF v_missing IS NOT NULL THEN
        RETURN QUERY SELECT 'not_on_sale', NULL::uuid, v_missing, NULL::jsonb, NULL::bigint, NULL::bigint,
            NULL::bigint, NULL::text, NULL::uuid, NULL::bigint, NULL::text, NULL::timestamptz, NULL::timestamptz;
        RETURN;
    END IF;

    INSERT INTO orders (id, event_id, account_id, status, hold_token, total_cents, currency, payment_due_at)
    SELECT p_order, p_event, p_account, 'reserved', p_hold, sum(t.price_cents), p_currency,
           now() + make_interval(secs => p_payment_window_seconds)
    FROM seat_allocations a JOIN ticket_types t ON t.id = a.ticket_type_id
    WHERE a.event_id = p_event AND a.seat_id = ANY (p_seats);

    INSERT INTO order_seats (order_id, event_id, seat_id, ticket_type_id, price_cents)
    SELECT p_order, p_event, a.seat_id, a.ticket_type_id, t.price_cents
    FROM seat_allocations a JOIN ticket_types t ON t.id = a.ticket_type_id
    WHERE a.event_id = p_event AND a.seat_id = ANY (p_seats);

    INSERT INTO idempotency_keys (account_id, key, fingerprint, response_status, order_id)
    VALUES (p_account, p_key, p_fingerprint, 201, p_order);

    RETURN QUERY SELECT 'created', o.id, 201::bigint, NULL::jsonb,
        os.seat_id, os.ticket_type_id, os.price_cents, o.status, o.hold_token, o.total_cents,
        o.currency::text, o.payment_due_at, o.created_at
    FROM orders o JOIN order_seats os ON os.order_id = o.id WHERE o.id = p_order;
END;
$$;
