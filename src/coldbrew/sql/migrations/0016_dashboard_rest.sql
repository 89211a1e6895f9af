-- The rest of the operable dashboard (issue #17): paused lanes, a CSRF secret every API
-- replica shares, and a trigram index for the job search's error text.
--
-- lanes: a lane's fleet-wide state (today: paused). A worker holds a paused lane's
-- deliveries unclaimed, as it holds a paused tenant's, until the lane is resumed; the
-- change is announced with the tenants' NOTIFY (tenants-changed) and re-read at every
-- resync. A lane without a row is active.
--
-- dashboard_secrets: secrets drawn once per namespace and shared by every `coldbrew api`
-- replica (the CSRF key): a form one replica signs, any other checks. The first replica
-- to start inserts it (ON CONFLICT DO NOTHING); every replica then reads the same row.
--
-- jobs_search_error: a GIN trigram index on the text the search matches (error kind,
-- message and dead reason, lower-cased), so a rare error text is found by the index
-- instead of walking a tenant's history. pg_trgm is an extension, installed once per
-- DATABASE while a namespace is a schema: it must not live in a namespace's schema
-- (dropping that namespace would drop it, and every other namespace's index with it,
-- and the other namespaces would not find its opclass on their search_path). So it is
-- created in a schema of its own, coldbrew_extensions (or used where it already is),
-- and the opclass is referenced by that schema's name; the operators LIKE uses are
-- pg_catalog's, so no search_path needs the extension's schema. A role that can create
-- neither gets one clear error naming what to run.
--
-- The index is partial (only rows with an error kind, message or dead reason: a job
-- that never failed is not in it, so its claims and completions, which do not move it
-- HOT-ly, add no GIN entry) and has fastupdate off (no pending list that every search
-- would scan until a vacuum flushes it).

CREATE TABLE lanes (
    name        text PRIMARY KEY,
    paused      boolean NOT NULL DEFAULT false,
    changed_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE dashboard_secrets (
    name        text PRIMARY KEY,
    secret      bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

DO $$
DECLARE
    ext_schema name;
BEGIN
    SELECT n.nspname INTO ext_schema
    FROM pg_extension AS e JOIN pg_namespace AS n ON n.oid = e.extnamespace
    WHERE e.extname = 'pg_trgm';
    IF ext_schema IS NULL THEN
        BEGIN
            CREATE SCHEMA IF NOT EXISTS coldbrew_extensions;
            CREATE EXTENSION IF NOT EXISTS pg_trgm SCHEMA coldbrew_extensions;
        EXCEPTION WHEN OTHERS THEN
            -- another namespace's migration may have created it meanwhile: use that one
            SELECT n.nspname INTO ext_schema
            FROM pg_extension AS e JOIN pg_namespace AS n ON n.oid = e.extnamespace
            WHERE e.extname = 'pg_trgm';
            IF ext_schema IS NULL THEN
                RAISE EXCEPTION 'coldbrew migration 0016 needs the PostgreSQL extension pg_trgm '
                    '(the dashboard''s error-text search) and could not create it: %', SQLERRM
                    USING HINT = 'as a role that may, run in this database: CREATE SCHEMA IF NOT '
                        'EXISTS coldbrew_extensions; CREATE EXTENSION pg_trgm SCHEMA '
                        'coldbrew_extensions; (Debian and Ubuntu ship it in postgresql-contrib) '
                        'then run coldbrew migrate again';
            END IF;
        END;
        SELECT n.nspname INTO ext_schema
        FROM pg_extension AS e JOIN pg_namespace AS n ON n.oid = e.extnamespace
        WHERE e.extname = 'pg_trgm';
    END IF;
    BEGIN
        EXECUTE format(
            'CREATE INDEX jobs_search_error ON jobs USING gin ('
            '(lower(coalesce(error_kind, '''') || '' '' || coalesce(error_message, '''') '
            '|| '' '' || coalesce(dead_reason, ''''))) %I.gin_trgm_ops) '
            'WITH (fastupdate = off) '
            'WHERE error_kind IS NOT NULL OR error_message IS NOT NULL OR dead_reason IS NOT NULL',
            ext_schema);
    EXCEPTION WHEN insufficient_privilege THEN
        RAISE EXCEPTION 'coldbrew migration 0016 needs the PostgreSQL extension pg_trgm '
            '(installed in schema %) and this role may not use it: %', ext_schema, SQLERRM
            USING HINT = format('as a role that may, run in this database: GRANT USAGE ON '
                'SCHEMA %I TO %I; then run coldbrew migrate again', ext_schema, current_user);
    END;
END;
$$;
