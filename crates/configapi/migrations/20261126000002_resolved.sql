-- Domain overrides that inherit (issue 22): `body` keeps what the API
-- answers, each refining override holding only the fields it changes;
-- `resolved` keeps what limiting servers enforce, every override resolved
-- against its resource (deltas send it). Overrides stored before this
-- migration were written out whole, `algorithm` included: they are
-- replacing overrides, still valid, and resolve to exactly what they
-- stored, so `resolved` starts as a copy of `body`. Such an override
-- inherits once it is written again without `algorithm`.
ALTER TABLE tg_resources ADD COLUMN resolved TEXT NOT NULL DEFAULT '';
UPDATE tg_resources SET resolved = body;
