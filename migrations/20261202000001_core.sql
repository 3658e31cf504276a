-- The venue (seats, their places on the map) belongs to the building; availability, prices and orders belong to
-- an event. A seat is on sale for an event only if a seat_allocations row exists for it.

CREATE TABLE venues (
    id         bigserial PRIMARY KEY,
    name       text NOT NULL
);

CREATE TABLE sections (
    id         bigserial PRIMARY KEY,
    venue_id   bigint NOT NULL REFERENCES venues (id) ON DELETE CASCADE,
    name       text NOT NULL,
    UNIQUE (venue_id, name)
);

CREATE TABLE seats (
    id         bigserial PRIMARY KEY,
    section_id bigint NOT NULL REFERENCES sections (id) ON DELETE CASCADE,
    row_label  text NOT NULL,
    number     integer NOT NULL CHECK (number > 0),
    x          integer NOT NULL,
    y          integer NOT NULL,
    accessible boolean NOT NULL DEFAULT false,
    -- Human name shown when a seat is refused ("Block 101 Row C Seat 12").
    label      text NOT NULL,
    UNIQUE (section_id, row_label, number)
);

CREATE TABLE events (
    id         bigserial PRIMARY KEY,
    venue_id   bigint NOT NULL REFERENCES venues (id),
    name       text NOT NULL,
    starts_at  timestamptz NOT NULL,
    currency   char(3) NOT NULL DEFAULT 'EUR',
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE ticket_types (
    id          bigserial PRIMARY KEY,
    event_id    bigint NOT NULL REFERENCES events (id) ON DELETE CASCADE,
    name        text NOT NULL,
    -- Money is integer minor units of the event's currency.
    price_cents bigint NOT NULL CHECK (price_cents >= 0),
    UNIQUE (event_id, name),
    -- Lets seat_allocations insist that its ticket type belongs to the same event.
    UNIQUE (id, event_id)
);

CREATE TABLE seat_allocations (
    event_id       bigint NOT NULL REFERENCES events (id) ON DELETE CASCADE,
    seat_id        bigint NOT NULL REFERENCES seats (id),
    ticket_type_id bigint NOT NULL,
    PRIMARY KEY (event_id, seat_id),
    FOREIGN KEY (ticket_type_id, event_id) REFERENCES ticket_types (id, event_id)
);

-- Lets a seat (or a venue) be removed without scanning every event's allocations.
CREATE INDEX seat_allocations_seat ON seat_allocations (seat_id);

-- Hot path: no foreign key from orders or order_seats to a row every checkout of the event shares (events,
-- ticket_types). Each such key takes a FOR KEY SHARE lock on that one row, and thousands of concurrent
-- checkouts turn it into a multixact hot spot that costs several times the insert itself. Integrity still
-- holds: every order seat references its (event, seat) allocation, which references the event and its
-- ticket type, and orders are only written by checkout_order together with their seats.
CREATE TABLE orders (
    id             uuid PRIMARY KEY,
    event_id       bigint NOT NULL,
    account_id     text NOT NULL,
    status         text NOT NULL CHECK (status IN ('reserved', 'paid', 'cancelled', 'refunded')),
    -- One order per hold: a second checkout of the same hold, under any idempotency key, is refused here.
    hold_token     uuid NOT NULL UNIQUE,
    total_cents    bigint NOT NULL CHECK (total_cents >= 0),
    currency       char(3) NOT NULL,
    payment_due_at timestamptz NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX orders_event_account ON orders (event_id, account_id);

CREATE TABLE order_seats (
    order_id       uuid NOT NULL REFERENCES orders (id) ON DELETE CASCADE,
    event_id       bigint NOT NULL,
    seat_id        bigint NOT NULL,
    -- The ticket type at checkout (the allocation may change later; this is what was sold).
    ticket_type_id bigint NOT NULL,
    -- The price at checkout, copied from the allocation's ticket type; never from the client.
    price_cents    bigint NOT NULL CHECK (price_cents >= 0),
    -- True while the order is reserved or paid. Kept in step with orders.status in the same transaction;
    -- a partial unique index cannot look at another table.
    active         boolean NOT NULL DEFAULT true,
    PRIMARY KEY (order_id, seat_id),
    -- Only a seat on sale for the event can be sold, and its allocation cannot vanish under an order.
    FOREIGN KEY (event_id, seat_id) REFERENCES seat_allocations (event_id, seat_id)
);

-- The guarantee: at most one active order per (event, seat), whatever Redis says. A refunded or cancelled
-- order's seats drop out of the index, so the seat can be sold again.
CREATE UNIQUE INDEX order_seats_one_active_sale ON order_seats (event_id, seat_id) WHERE active;
-- Every sale of a seat, active or not: serves the allocation foreign key and a seat's history.
CREATE INDEX order_seats_event_seat ON order_seats (event_id, seat_id);

-- The answer given to each (account, Idempotency-Key): a retry with the same key gets it again. A request in
-- flight holds a transaction-scoped advisory lock on the key instead of a row, so a crash never leaves a key
-- stuck: the lock dies with the connection.
CREATE TABLE idempotency_keys (
    account_id      text NOT NULL,
    key             text NOT NULL,
    -- What the first request asked for; the same key with another request is refused.
    fingerprint     text NOT NULL,
    response_status smallint NOT NULL,
    -- A refusal's body; NULL when the answer is an order, which is rendered from order_id.
    response_body   jsonb,
    order_id        uuid REFERENCES orders (id),
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, key),
    CHECK ((order_id IS NULL) <> (response_body IS NULL))
);
