-- The expiry decision of each occurrence with an expireAfter (docs/CONTRACT.md, Expiry): whether it
-- fires or expires, recorded the first time a replica comes to publish it and committed before
-- it publishes anything. A claim rolled back after its PubAck (its replica died before the
-- commit) leaves no other trace; the next claim of that occurrence reads the decision here and
-- keeps it, so a DueTimeReached that went out is sent again under its id, never followed by an
-- ExpiredOccurrence of the same id. Keyed by the occurrence's event id (its dueAt, not a
-- window's planned instant). A row goes once its timer no longer holds that occurrence
-- (sql/queries/upkeep.sql, delete_decided). A new table: no lock on anything the old release uses.
CREATE TABLE timer_expiry (
    tenant_id       text        NOT NULL,
    service_call_id text        NOT NULL,
    due_at          timestamptz NOT NULL,
    expired         boolean     NOT NULL,
    decided_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, service_call_id, due_at)
);
