-- The fleet secret: the key of every Nats-Msg-Id the service sets (worker/contract.py,
-- MessageIds). One per database, made here once, so every replica and the CLI read the same one
-- and an operator has nothing to configure. Tenants can read the docs but not this table, so
-- they cannot predict, and so cannot pre-empt, the id of another tenant's event, DLQ copy or
-- replay. 32 bytes from two version-4 UUIDs (244 random bits): gen_random_uuid() is
-- core Postgres from 13 on, no extension needed.
-- A new table: no existing one is locked.
CREATE TABLE fleet_secret (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    secret bytea NOT NULL CHECK (length(secret) >= 32)
);
INSERT INTO fleet_secret (secret)
VALUES (decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex'));
