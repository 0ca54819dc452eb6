-- A namespace's ETag: the revision of the last change to it or to any of
-- its resources (created, changed or deleted), so a write made against a
-- namespace as it was read (If-Match) is refused when anything in it
-- changed since. `revision` keeps meaning the last change of its flags
-- (what deltas send).
ALTER TABLE tg_namespaces ADD COLUMN changed BIGINT NOT NULL DEFAULT 0;
UPDATE tg_namespaces SET changed = revision;
UPDATE tg_namespaces SET changed =
    (SELECT MAX(r.revision) FROM tg_resources r WHERE r.namespace = tg_namespaces.name)
  WHERE changed <
    (SELECT MAX(r.revision) FROM tg_resources r WHERE r.namespace = tg_namespaces.name);
UPDATE tg_namespaces SET changed =
    (SELECT MAX(d.revision) FROM tg_deleted d WHERE d.namespace = tg_namespaces.name AND d.name <> '')
  WHERE changed <
    (SELECT MAX(d.revision) FROM tg_deleted d WHERE d.namespace = tg_namespaces.name AND d.name <> '');
