-- Which database this is: set once to a random value by the API, and sent
-- with every delta, so a limiting server notices a database that was
-- replaced or restored (its revisions no longer follow the server's view).
ALTER TABLE tg_meta ADD COLUMN instance TEXT NOT NULL DEFAULT '';
