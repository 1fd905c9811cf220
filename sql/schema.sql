-- The schema sql/migrations builds, generated (`make schema`): read it, never edit it.
-- timers.claimed_at holds the recurrence reference, not when the row was claimed (read as
-- recurrence_ref; docs/SQL.md, record_fired): its name is older than its use.

CREATE FUNCTION public.timer_label_terms(tenant_id text, labels jsonb) RETURNS text[]
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT array_agg(tenant_id || ':' || key || '=' || value) FROM jsonb_each_text(labels) $$;

CREATE FUNCTION public.timers_count_inserted() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    INSERT INTO tenant_pending (tenant_id, pending)
    SELECT tenant_id, count(*) FROM new_rows WHERE state IN ('Scheduled', 'Paused') GROUP BY tenant_id;
    RETURN NULL;
END
$$;

CREATE FUNCTION public.timers_count_revived() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    INSERT INTO tenant_pending (tenant_id, pending) VALUES (NEW.tenant_id, 1);
    RETURN NULL;
END
$$;

CREATE TABLE public.fleet_secret (
    only_row boolean DEFAULT true NOT NULL,
    secret bytea NOT NULL,
    CONSTRAINT fleet_secret_only_row_check CHECK (only_row),
    CONSTRAINT fleet_secret_secret_check CHECK ((length(secret) >= 32))
);

CREATE TABLE public.paused_tenants (
    tenant_id text NOT NULL,
    paused_at timestamp with time zone,
    command_seq bigint,
    command_stored_at timestamp with time zone
);

CREATE TABLE public.tenant_pending (
    tenant_id text NOT NULL,
    pending bigint NOT NULL
)
WITH (autovacuum_vacuum_scale_factor='0.01', autovacuum_vacuum_cost_delay='1');

CREATE TABLE public.timer_expiry (
    tenant_id text NOT NULL,
    service_call_id text NOT NULL,
    due_at timestamp with time zone NOT NULL,
    expired boolean NOT NULL,
    decided_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE SEQUENCE public.timer_lease_token
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 100;

CREATE TABLE public.timer_schema_version (
    version integer NOT NULL,
    name text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE public.timer_stats (
    minute timestamp with time zone NOT NULL,
    worker_id text NOT NULL,
    fired bigint DEFAULT 0 NOT NULL,
    rejected bigint DEFAULT 0 NOT NULL,
    overdue bigint DEFAULT 0 NOT NULL,
    lateness_le double precision[] NOT NULL,
    lateness bigint[] NOT NULL,
    written_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE public.timers (
    tenant_id text NOT NULL,
    service_call_id text NOT NULL,
    state text NOT NULL,
    due_at timestamp with time zone,
    registered_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    reached_at timestamp with time zone,
    correlation_id text,
    command_ts bigint,
    lease_owner text,
    lease_token bigint,
    lease_expires_at timestamp with time zone,
    attempts integer DEFAULT 0 NOT NULL,
    last_error text,
    repeat_every text,
    repeat_times integer,
    repeat_timezone text,
    anchor_due_at timestamp with time zone,
    occurrence_index integer DEFAULT 0 NOT NULL,
    fired_count integer DEFAULT 0 NOT NULL,
    claimed_at timestamp with time zone,
    carried_headers jsonb,
    command_seq bigint,
    deferred_seqs bigint[],
    command_stored_at timestamp with time zone,
    repeat_cron text,
    repeat_until timestamp with time zone,
    data jsonb,
    paused_at timestamp with time zone,
    control_seq bigint,
    control_stored_at timestamp with time zone,
    fire_window text,
    nominal_due_at timestamp with time zone,
    expire_after text,
    repeat_catchup text,
    caught_up integer,
    labels jsonb,
    CONSTRAINT timers_check CHECK (((due_at IS NOT NULL) OR (state = 'Cancelled'::text))),
    CONSTRAINT timers_state_check CHECK ((state = ANY (ARRAY['Scheduled'::text, 'Paused'::text, 'Reached'::text, 'Cancelled'::text, 'Expired'::text])))
)
WITH (autovacuum_vacuum_scale_factor='0.01', autovacuum_vacuum_insert_scale_factor='0.01', autovacuum_analyze_scale_factor='0.02', fillfactor='50', autovacuum_vacuum_cost_delay='5');

ALTER TABLE ONLY public.fleet_secret
    ADD CONSTRAINT fleet_secret_pkey PRIMARY KEY (only_row);

ALTER TABLE ONLY public.paused_tenants
    ADD CONSTRAINT paused_tenants_pkey PRIMARY KEY (tenant_id);

ALTER TABLE ONLY public.timer_expiry
    ADD CONSTRAINT timer_expiry_pkey PRIMARY KEY (tenant_id, service_call_id, due_at);

ALTER TABLE ONLY public.timer_schema_version
    ADD CONSTRAINT timer_schema_version_pkey PRIMARY KEY (version);

ALTER TABLE ONLY public.timer_stats
    ADD CONSTRAINT timer_stats_pkey PRIMARY KEY (minute, worker_id);

ALTER TABLE ONLY public.timers
    ADD CONSTRAINT timers_pkey PRIMARY KEY (tenant_id, service_call_id);

CREATE INDEX tenant_pending_tenant ON public.tenant_pending USING btree (tenant_id) INCLUDE (pending);

CREATE INDEX timers_correlation ON public.timers USING btree (correlation_id) WHERE (correlation_id IS NOT NULL);

CREATE INDEX timers_done ON public.timers USING btree (updated_at) WHERE ((state <> 'Scheduled'::text) AND (state <> 'Paused'::text));

CREATE INDEX timers_due ON public.timers USING btree (due_at) WHERE (state = 'Scheduled'::text);

CREATE INDEX timers_labels ON public.timers USING gin (public.timer_label_terms(tenant_id, labels)) WHERE (labels IS NOT NULL);

CREATE INDEX timers_paused ON public.timers USING btree (tenant_id, service_call_id) WHERE (state = 'Paused'::text);

CREATE STATISTICS public.timers_label_terms ON public.timer_label_terms(tenant_id, labels) FROM public.timers;

CREATE TRIGGER timers_pending_insert AFTER INSERT ON public.timers REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION public.timers_count_inserted();

CREATE TRIGGER timers_pending_revive AFTER UPDATE ON public.timers FOR EACH ROW WHEN (((old.state <> ALL (ARRAY['Scheduled'::text, 'Paused'::text])) AND (new.state = ANY (ARRAY['Scheduled'::text, 'Paused'::text])))) EXECUTE FUNCTION public.timers_count_revived();
