-- Least-privilege roles for leasestore. Apply after the migrations, as the
-- tables' owner or a superuser, in every database that holds the schema:
--
--     psql "$DATABASE_URL" -v ON_ERROR_STOP=1 -f db/roles.sql
--
-- then give each service its own login role:
--
--     CREATE ROLE billing_worker LOGIN PASSWORD '...' IN ROLE leasestore_processor;
--     CREATE ROLE ops_cli        LOGIN PASSWORD '...' IN ROLE leasestore_operator;
--
-- The file is idempotent: run it again after every migration. It revokes
-- what it does not grant, so a rerun also narrows privileges an earlier
-- version granted. It runs in one transaction, so live processors never see
-- a moment without their privileges.
--
-- leasestore_processor (NOLOGIN) holds what Store and Processor calls need:
--   * USAGE on schema public;
--   * SELECT on both tables: claim, get, list, stats read every column;
--   * INSERT on both tables: Enqueue, EnqueueTx and EnqueueCopy (services
--     enqueue in the transaction that changes their data);
--   * UPDATE on the lease and outcome columns only (attempts, the attempt
--     history, included): claim, renew, release, complete, fail,
--     dead-letter and requeue. Message content (id, type,
--     payload, headers, tenant, idempotency key, topic, created_at) is not
--     updatable: a processor cannot rewrite a message or move it to another
--     tenant (nor to another ordering key);
--   * SELECT, INSERT, UPDATE and DELETE on the ordering keys' tables, and
--     SELECT on leasestore_queue_settings and leasestore_paused.
-- No DELETE: deleting rows is Purge, a retention job run by an operator,
-- not by processors; a processor that could delete could also make a
-- message vanish without a terminal state. No TRUNCATE, REFERENCES or
-- TRIGGER, no access to leasestore_db_version, and no CREATE on the schema (the
-- PostgreSQL 15 default for PUBLIC; this file does not change PUBLIC).
-- LISTEN needs no privilege. The insert trigger's WHEN clause reads the
-- signal's sequences (SELECT, granted below and to PUBLIC by migration
-- 00014; without it each insert calls the trigger's function instead), and
-- that function (leasestore_signal_work, migration 00009) is SECURITY
-- DEFINER: it needs no other grant.
--
-- VACUUM: on PostgreSQL 17 and later leasestore_processor gets MAINTAIN on
-- the four queue tables, so that processors run their vacuum policy
-- (processor.VacuumPolicy) without the tables' owner's rights. Before 17
-- only the owner may VACUUM: processors see that they may not, say so once
-- (info) and leave the tables to autovacuum; run them as the owner, or set
-- VacuumPolicy.Disabled (docs/operations.md, Vacuum).
--
-- leasestore_operator (NOLOGIN) is a processor that may also DELETE, for
-- Purge (leasectl purge), set strict ordering (leasectl ordering), and
-- pause and resume claims (leasectl pause|resume). It
-- still cannot TRUNCATE, ALTER or DROP.

BEGIN;

DO $roles$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['leasestore_processor', 'leasestore_operator'] LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL; -- created by a concurrent run of this file in another database
            END;
        END IF;
    END LOOP;
    IF NOT pg_catalog.pg_has_role('leasestore_operator', 'leasestore_processor', 'MEMBER') THEN
        BEGIN
            GRANT leasestore_processor TO leasestore_operator;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;
        END;
    END IF;
END
$roles$;

GRANT USAGE ON SCHEMA public TO leasestore_processor;

-- Start from nothing on the tables, then grant: a rerun converges.
REVOKE ALL ON inbox_messages, outbox_messages FROM leasestore_processor, leasestore_operator;

GRANT SELECT, INSERT ON inbox_messages, outbox_messages TO leasestore_processor;

GRANT UPDATE (status, visible_after, lease_owner, lease_expires_at, lease_generation, outcome_generation, outcome,
              attempt_count, last_attempted_at, last_error, completed_at, dead_lettered_at, attempts, key_seq)
    ON inbox_messages TO leasestore_processor;
GRANT UPDATE (status, visible_after, lease_owner, lease_expires_at, lease_generation, outcome_generation, outcome,
              attempt_count, last_attempted_at, last_error, published_at, dead_lettered_at, attempts, key_seq)
    ON outbox_messages TO leasestore_processor;

-- Ordering keys (migration 00010): enqueues, outcome writes and requeues
-- keep the key rows (insert, update, and delete a key's row when its last
-- message finishes); every write reads the queue's strict_ordering, which
-- only an operator changes.
REVOKE ALL ON inbox_ordering_keys, outbox_ordering_keys, leasestore_queue_settings
    FROM leasestore_processor, leasestore_operator;
GRANT SELECT, INSERT, UPDATE, DELETE ON inbox_ordering_keys, outbox_ordering_keys TO leasestore_processor;
GRANT SELECT ON leasestore_queue_settings TO leasestore_processor;
GRANT INSERT, UPDATE ON leasestore_queue_settings TO leasestore_operator;

GRANT DELETE ON inbox_messages, outbox_messages TO leasestore_operator;

-- Pauses (migration 00015): every claim reads them; only an operator
-- pauses (INSERT) and resumes (DELETE). Skipped on a schema before 00015.
DO $paused$
BEGIN
    IF to_regclass('leasestore_paused') IS NOT NULL THEN
        REVOKE ALL ON leasestore_paused FROM leasestore_processor, leasestore_operator;
        GRANT SELECT ON leasestore_paused TO leasestore_processor;
        GRANT INSERT, DELETE ON leasestore_paused TO leasestore_operator;
    END IF;
END
$paused$;

-- The work signal (migration 00014): the insert trigger's WHEN clause reads
-- the signal's sequences as the inserting role. 00014 grants SELECT to
-- PUBLIC; granted here too, so that a REVOKE from PUBLIC or a restore
-- without privileges does not make every insert call the trigger function.
GRANT SELECT ON SEQUENCE inbox_messages_work_signal, outbox_messages_work_signal TO leasestore_processor;

-- VACUUM rights (see above): MAINTAIN exists from PostgreSQL 17 on.
DO $maintain$
BEGIN
    IF pg_catalog.current_setting('server_version_num')::integer >= 170000 THEN
        EXECUTE 'GRANT MAINTAIN ON inbox_messages, outbox_messages, inbox_ordering_keys, outbox_ordering_keys TO leasestore_processor';
    END IF;
END
$maintain$;

COMMIT;
