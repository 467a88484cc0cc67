-- A large value left unchanged by an UPDATE: pgoutput sends it as "unchanged TOAST" ('u').
-- With REPLICA IDENTITY FULL the old row carries it and the event has the full value; without,
-- the event lists the column in metadata.unchanged_toast_columns and leaves it out of "after".
CREATE TABLE docs_full (id int PRIMARY KEY, title text, body text);
ALTER TABLE docs_full ALTER COLUMN body SET STORAGE EXTERNAL;
ALTER TABLE docs_full REPLICA IDENTITY FULL;
CREATE TABLE docs_default (id int PRIMARY KEY, title text, body text);
ALTER TABLE docs_default ALTER COLUMN body SET STORAGE EXTERNAL;
-- @capture
INSERT INTO docs_full SELECT 1, 'v1', string_agg(md5(i::text), '') FROM generate_series(1, 300) i;
INSERT INTO docs_default SELECT 1, 'v1', string_agg(md5(i::text), '') FROM generate_series(1, 300) i;
UPDATE docs_full SET title = 'v2' WHERE id = 1;
UPDATE docs_default SET title = 'v2' WHERE id = 1;
DELETE FROM docs_full WHERE id = 1;
