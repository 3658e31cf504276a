-- events.catalogue_version grows whenever the event's allocations or ticket types change, so booking re-reads
-- a catalogue only when it changed (one cheap query per refresh interval instead of every seat).

ALTER TABLE events ADD COLUMN catalogue_version bigint NOT NULL DEFAULT 0;

CREATE FUNCTION bump_catalogue_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Statement-level: one UPDATE per statement and event, however many rows it touched.
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        UPDATE events SET catalogue_version = catalogue_version + 1
        WHERE id IN (SELECT DISTINCT event_id FROM new_rows);
    END IF;
    IF TG_OP IN ('DELETE', 'UPDATE') THEN
        UPDATE events SET catalogue_version = catalogue_version + 1
        WHERE id IN (SELECT DISTINCT event_id FROM old_rows);
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER seat_allocations_inserted AFTER INSERT ON seat_allocations
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION bump_catalogue_version();
CREATE TRIGGER seat_allocations_updated AFTER UPDATE ON seat_allocations
    REFERENCING NEW TABLE AS new_rows OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION bump_catalogue_version();
CREATE TRIGGER seat_allocations_deleted AFTER DELETE ON seat_allocations
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION bump_catalogue_version();
CREATE TRIGGER ticket_types_inserted AFTER INSERT ON ticket_types
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION bump_catalogue_version();
CREATE TRIGGER ticket_types_updated AFTER UPDATE ON ticket_types
    REFERENCING NEW TABLE AS new_rows OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION bump_catalogue_version();
CREATE TRIGGER ticket_types_deleted AFTER DELETE ON ticket_types
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION bump_catalogue_version();
