-- The sweeper's repair pass asks every second for orders paid, refunded or cancelled after payment lately (the
-- Redis markers of paid seats never lapse by themselves, so it re-applies them): an index on just the orders
-- that were paid keeps that a lookup, not a scan of every order.
CREATE INDEX orders_paid_updated ON orders (updated_at) WHERE paid_at IS NOT NULL;
