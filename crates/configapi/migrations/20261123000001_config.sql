-- tollgate's configuration API. Portable SQL: the same file runs on SQLite
-- and PostgreSQL (flags are 0/1 integers, JSON is text).

-- The config's revision: one more with every change.
CREATE TABLE tg_meta (
    id BIGINT PRIMARY KEY,
    revision BIGINT NOT NULL
);
INSERT INTO tg_meta (id, revision) VALUES (1, 0);

CREATE TABLE tg_namespaces (
    name TEXT PRIMARY KEY,
    ignore_configured BIGINT NOT NULL,
    allow_unconfigured BIGINT NOT NULL,
    revision BIGINT NOT NULL
);

-- One row per resource: its normalized body (JSON, in the config file's
-- shape, domain overrides and groups included), and the revision that last
-- changed it.
CREATE TABLE tg_resources (
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    body TEXT NOT NULL,
    revision BIGINT NOT NULL,
    PRIMARY KEY (namespace, name)
);

-- What was deleted, and when, for deltas: a resource, or a whole
-- namespace (name '').
CREATE TABLE tg_deleted (
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    revision BIGINT NOT NULL,
    PRIMARY KEY (namespace, name)
);

-- The audit trail: one row per change.
CREATE TABLE tg_audit (
    revision BIGINT PRIMARY KEY,
    at_ms BIGINT NOT NULL,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    target TEXT NOT NULL,
    before_json TEXT,
    after_json TEXT
);
