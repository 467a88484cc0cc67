-- One column per built-in type family, with the awkward values: NaN, infinities, BC dates,
-- arrays with NULLs, enums, domains, composites.
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN positive_numeric AS numeric CHECK (VALUE > 0);
CREATE DOMAIN short_text AS text CHECK (length(VALUE) < 100);
CREATE TYPE address AS (street text, zip int);
CREATE TABLE all_types (
  id int PRIMARY KEY,
  c_bool bool, c_int2 int2, c_int4 int4, c_int8 int8, c_oid oid,
  c_float4 float4, c_float8 float8, c_numeric numeric, c_numeric_scaled numeric(12,4), c_money money,
  c_text text, c_varchar varchar(20), c_char char(5), c_name name,
  c_bytea bytea, c_uuid uuid, c_json json, c_jsonb jsonb, c_xml xml,
  c_date date, c_time time, c_timetz timetz, c_timestamp timestamp, c_timestamptz timestamptz, c_interval interval,
  c_inet inet, c_cidr cidr, c_macaddr macaddr, c_bit bit(4), c_varbit varbit,
  c_point point, c_box box, c_tsvector tsvector, c_int4range int4range, c_tstzrange tstzrange,
  c_int_array int[], c_text_array text[], c_numeric_array numeric[], c_int_matrix int[][],
  c_timestamptz_array timestamptz[], c_jsonb_array jsonb[], c_box_array box[],
  c_enum mood, c_enum_array mood[], c_domain positive_numeric, c_domain_text short_text, c_composite address,
  c_composite_array address[], c_pg_lsn pg_lsn
);
-- @capture
INSERT INTO all_types VALUES (
  1, true, -32768, 2147483647, -9223372036854775808, 4294967295,
  1.5, 3.141592653589793, 12345678901234567890.123456789, 150.0000, 12.34,
  E'multi\nline "quoted" \\ back', 'varchar', 'ab', 'a_name',
  '\xdeadbeef', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{"a": [1, 2.50, "x"]}', '{"b": {"c": null}}', '<r>x</r>',
  '2024-02-29', '14:23:45.123', '14:23:45+05:30', '2024-03-15 14:23:45.123456', '2024-03-15 14:23:45.123456+00', '1 year 2 months 3 days 04:05:06.7',
  '192.168.0.1/24', '10.0.0.0/8', '08:00:2b:01:02:03', B'1010', B'101',
  '(1.5,2)', '((0,0),(1,1))', 'a fat cat', '[1,10)', '[2024-01-01 00:00:00+00,2024-02-01 00:00:00+00)',
  '{1,NULL,3}', '{"a b",NULL,"NULL","q\"x","back\\slash"}', '{1.10,NaN,-0.5}', '{{1,2},{3,4}}',
  '{"2024-01-01 00:00:00+00",infinity}', ARRAY['{"k": 1}'::jsonb, NULL], '{(1,1),(0,0);(3,3),(2,2)}',
  'happy', '{sad,NULL,ok}', 42.50, 'short', ROW('Main St, 1', 12345),
  ARRAY[ROW('a "b"', 1)::address, NULL], '16/B374D848'
);
INSERT INTO all_types (id, c_float4, c_float8, c_numeric, c_date, c_timestamp, c_timestamptz, c_bytea, c_text)
VALUES (2, 'NaN', 'Infinity', 'NaN', '0044-03-15 BC', '0044-03-15 12:00:00 BC', '0044-03-15 12:00:00+00 BC', '\x', '');
INSERT INTO all_types (id, c_float4, c_float8, c_numeric, c_date, c_timestamp, c_timestamptz)
VALUES (3, '-Infinity', '-0', '-Infinity', 'infinity', '-infinity', 'infinity');
INSERT INTO all_types (id, c_numeric, c_date, c_timestamptz, c_int_array, c_text)
VALUES (4, 'Infinity', '4713-01-01 BC', '294276-12-31 23:59:59.999999+00', '[0:1]={7,8}', 'unicode: é 漢 🙂');
INSERT INTO all_types (id) VALUES (5);
