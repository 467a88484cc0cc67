-- Values whose encoding differs between event formats (the Debezium format's oracle is
-- Debezium's own output for this workload): decimals of every shape, time and timestamp
-- precisions, zones, negative intervals, money, enums, arrays without NULL elements, ranges.
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE fmt (
  id int PRIMARY KEY,
  n numeric, n_2 numeric(6,2), n_0 numeric(5,0), m money,
  t3 time(3), t0 time(0), ts3 timestamp(3), ts0 timestamp(0), tstz3 timestamptz(3), tstz timestamptz,
  tz timetz, tz3 timetz(3), iv interval, d date, f4 float4, f8 float8,
  vc varchar(3), ch char, b1 bit(1), b9 bit(9), mac8 macaddr8,
  i8r int8range, numr numrange, dr daterange, tsr tsrange,
  e mood, moods mood[], nums numeric[], n2s numeric(4,1)[], dates date[], ts_arr timestamp[], bools bool[],
  byteas bytea[], uuids uuid[], texts varchar(5)[]
);
-- NOT NULL columns outside the key: a DELETE's old key image leaves them out (REPLICA IDENTITY DEFAULT).
CREATE TABLE req (id int PRIMARY KEY, n int NOT NULL, s text NOT NULL, d numeric(10,2) NOT NULL,
                  at timestamptz NOT NULL, ok bool NOT NULL, day date NOT NULL, b bytea NOT NULL DEFAULT '\x01');
-- @capture
INSERT INTO fmt VALUES (
  1, 100, 1.50, 12345, -12.34,
  '01:02:03.456', '01:02:03', '2024-01-01 00:00:00.5', '2024-01-01 00:00:00', '2024-01-01 00:00:00.123+00',
  '1969-12-31 23:59:59.5+00', '23:59:59.5-08', '12:00:00.123+00', '-1 year -2 days +03:00:00.25', '-infinity',
  1e30, 1e-300, 'abc', 'x', B'1', B'101010101', '08:00:2b:01:02:03:04:05',
  '[1,5)', '[1.5,2.5]', '[2024-01-01,2024-02-01)', '[2024-01-01 00:00,2024-01-02 00:00)',
  'sad', '{sad,ok}', '{1,2.50,-3}', '{1.5,-0.1}', '{2024-01-01,1999-12-31}', '{"2024-01-01 10:00:00.25"}',
  '{t,f,NULL}', '{"\\x00ff"}', '{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}', '{a,NULL}'
);
INSERT INTO fmt (id, n, n_2, n_0, m, t3, ts3, tstz, iv, d, f4, f8)
VALUES (2, 0, -0.01, 0, 0, '00:00:00', '1969-12-31 23:59:59.999', '2024-06-30 12:00:00+02', '0', '1970-01-01', '-0.5', '1e-7');
INSERT INTO fmt (id, n, n_2, m, iv, d) VALUES (3, -123.4500, 9999.99, 1234567.89, '1 mon -1 day -00:00:01', '1969-12-31');
INSERT INTO fmt (id, n, m, iv) VALUES (4, 0.000000001, -0.01, '100 years');
UPDATE fmt SET n = 1e20, e = 'happy' WHERE id = 4;
DELETE FROM fmt WHERE id = 3;
INSERT INTO req VALUES (1, 7, 'x', 1.50, '2024-01-01 00:00:00+00', true, '2024-01-01');
UPDATE req SET n = 8 WHERE id = 1;
DELETE FROM req WHERE id = 1;
