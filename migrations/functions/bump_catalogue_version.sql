-- bump_catalogue_version as Postgres prints it (pg_get_functiondef): the current definition, in one place.
-- Defined by 20261202000003_catalogue_version.sql.
-- A booking test holds this file to the migrated database: change the function in a new migration, then
-- copy its new definition here.
CREATE OR REPLACE FUNCTION public.bump_catalogue_version()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
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
$function$
