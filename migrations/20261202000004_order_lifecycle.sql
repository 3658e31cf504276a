-- The order lifecycle after checkout: a reserved order holds its seats until its payment deadline and no
-- longer, whoever tidies up; a signed webhook from the payment provider settles it; operators refund or cancel;
-- every change of state writes an outbox row in the same transaction, which a relay publishes to Redis.
--
-- Statuses: reserved -> paid | cancelled (expired, payment_failed, operator); paid -> refunded | refund_due
-- (cancelled by an operator: money to return); refund_due -> refunded. A payment that arrives after the order
-- was cancelled makes it paid when its seats are still free, and refund_due otherwise.

ALTER TABLE orders DROP CONSTRAINT orders_status_check;
ALTER TABLE orders ADD CONSTRAINT orders_status_check
    CHECK (status IN ('reserved', 'paid', 'cancelled', 'refunded', 'refund_due'));
-- Why a cancelled order was cancelled: it decides what a late payment does.
ALTER TABLE orders ADD COLUMN cancel_reason text
    CHECK (cancel_reason IN ('expired', 'payment_failed', 'operator'));
ALTER TABLE orders ADD CONSTRAINT orders_cancel_reason_iff_cancelled
    CHECK ((status = 'cancelled') = (cancel_reason IS NOT NULL));
-- The provider's payment, once the fan started paying (one per order).
ALTER TABLE orders ADD COLUMN payment_id text UNIQUE;
ALTER TABLE orders ADD COLUMN paid_at timestamptz;

-- While its order is reserved a seat is taken only until the payment deadline, copied here so that reads need
-- no join: a seat is sold when `active AND (expires_at IS NULL OR expires_at > now())`. NULL once paid.
ALTER TABLE order_seats ADD COLUMN expires_at timestamptz;
UPDATE order_seats os SET expires_at = o.payment_due_at FROM orders o WHERE o.id = os.order_id AND o.status = 'reserved';

-- The sweeper's queue: reserved orders by deadline.
CREATE INDEX orders_reserved_due ON orders (payment_due_at) WHERE status = 'reserved';

-- The outbox, and each order's history: one row per change of state (and per payment-window extension),
-- written in the transaction that made the change. The relay publishes rows whose published_at is NULL.
CREATE TABLE order_events (
    id           bigserial PRIMARY KEY,
    order_id     uuid NOT NULL REFERENCES orders (id),
    event_id     bigint NOT NULL,
    -- order.reserved, order.paid, order.cancelled, order.refund_due, order.refunded, order.extended
    kind         text NOT NULL,
    from_status  text,
    to_status    text NOT NULL,
    -- The order as it is after the change (account, seats, total, deadline, reason).
    data         jsonb NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz
);
CREATE INDEX order_events_unpublished ON order_events (id) WHERE published_at IS NULL;
CREATE INDEX order_events_order ON order_events (order_id, id);

-- Webhook deliveries already applied, by the provider's event id: a redelivery changes nothing.
CREATE TABLE payment_events (
    id          text PRIMARY KEY,
    order_id    uuid NOT NULL REFERENCES orders (id),
    kind        text NOT NULL,
    -- What the delivery did to the order (paid, cancelled, refund_due, ignored).
    outcome     text NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now()
);

-- The order as the outbox and the operator see it.
CREATE FUNCTION order_snapshot(p_order uuid) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'order_id', o.id, 'event_id', o.event_id, 'account_id', o.account_id, 'status', o.status,
        'cancel_reason', o.cancel_reason, 'total_cents', o.total_cents, 'currency', o.currency,
        'payment_due_at', o.payment_due_at, 'payment_id', o.payment_id,
        'seat_ids', (SELECT jsonb_agg(os.seat_id ORDER BY os.seat_id) FROM order_seats os WHERE os.order_id = o.id))
    FROM orders o WHERE o.id = p_order;
$$;

-- One change of state: only from `p_from`; seats leave sale when the order stops being reserved or paid; one
-- outbox row. Returns false (and writes nothing) when the order is not in `p_from` any more.
CREATE FUNCTION transition_order(p_order uuid, p_from text, p_to text, p_reason text, p_kind text)
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
        UPDATE order_seats SET active = false WHERE order_id = p_order AND active;
    END IF;
    INSERT INTO order_events (order_id, event_id, kind, from_status, to_status, data)
    SELECT p_order, o.event_id, p_kind, p_from, p_to, order_snapshot(p_order) FROM orders o WHERE o.id = p_order;
    RETURN true;
END;
$$;

-- Cancels a reserved order whose payment deadline has passed; false if it is not one (any more).
CREATE FUNCTION expire_order(p_order uuid) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM orders WHERE id = p_order AND status = 'reserved' AND payment_due_at <= now() FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    RETURN transition_order(p_order, 'reserved', 'cancelled', 'expired', 'order.cancelled');
END;
$$;

-- Frees the given seats of the event from reserved orders whose deadline passed, so a new order may take them.
CREATE FUNCTION expire_stale_orders_on(p_event bigint, p_seats bigint[]) RETURNS void LANGUAGE sql AS $$
    SELECT expire_order(o.order_id)
    FROM (SELECT DISTINCT os.order_id FROM order_seats os
          WHERE os.event_id = p_event AND os.seat_id = ANY (p_seats) AND os.active AND os.expires_at <= now()
          -- One lock order for every caller, so two checkouts freeing the same orders cannot deadlock.
          ORDER BY os.order_id) o;
$$;

-- checkout_order, as in 20261202000002 with three changes: an unpaid order past its deadline no longer takes its
-- seats (they are freed here, so correctness never waits for the sweeper), the account's cap counts only seats
-- sold now, and the new order writes its outbox row.
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
    WHERE o.event_id = p_event AND o.account_id = p_account AND os.active
      AND (os.expires_at IS NULL OR os.expires_at > now());
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

    PERFORM expire_stale_orders_on(p_event, p_seats);

    INSERT INTO orders (id, event_id, account_id, status, hold_token, total_cents, currency, payment_due_at)
    SELECT p_order, p_event, p_account, 'reserved', p_hold, sum(t.price_cents), p_currency, v_due
    FROM seat_allocations a JOIN ticket_types t ON t.id = a.ticket_type_id
    WHERE a.event_id = p_event AND a.seat_id = ANY (p_seats);

    INSERT INTO order_seats (order_id, event_id, seat_id, ticket_type_id, price_cents, expires_at)
    SELECT p_order, p_event, a.seat_id, a.ticket_type_id, t.price_cents, v_due
    FROM seat_allocations a JOIN ticket_types t ON t.id = a.ticket_type_id
    WHERE a.event_id = p_event AND a.seat_id = ANY (p_seats);

    INSERT INTO idempotency_keys (account_id, key, fingerprint, response_status, order_id)
    VALUES (p_account, p_key, p_fingerprint, 201, p_order);

    INSERT INTO order_events (order_id, event_id, kind, from_status, to_status, data)
    VALUES (p_order, p_event, 'order.reserved', NULL, 'reserved', order_snapshot(p_order));

    RETURN QUERY SELECT 'created', o.id, 201::bigint, NULL::jsonb,
        os.seat_id, os.ticket_type_id, os.price_cents, o.status, o.hold_token, o.total_cents,
        o.currency::text, o.payment_due_at, o.created_at
    FROM orders o JOIN order_seats os ON os.order_id = o.id WHERE o.id = p_order;
END;
$$;
