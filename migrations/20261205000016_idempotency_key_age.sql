-- Keys are forgotten after a day (booking's sweeper deletes them in batches, oldest first): the index finds
-- them without reading the table.
CREATE INDEX idempotency_keys_created_at ON idempotency_keys (created_at);
