"""Every built-in type family survives the trip through the worker and Kafka without loss."""
from conftest import consume


def create_type_matrix(pg, t, extra=None):
    """A table with a column of every built-in type family (and `extra` column definitions)."""
    pg.execute(f"""
      DO $$ BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_type WHERE typname = 'e2e_mood') THEN
          CREATE TYPE e2e_mood AS ENUM ('sad', 'ok', 'happy');
          CREATE DOMAIN e2e_positive AS numeric CHECK (VALUE > 0);
          CREATE TYPE e2e_address AS (street text, zip int);
        END IF;
      END $$;
      CREATE TABLE {t} (id int PRIMARY KEY, c_bool bool, c_int8 int8, c_float8 float8, c_numeric numeric,
        c_text text, c_bytea bytea, c_uuid uuid, c_jsonb jsonb, c_json json, c_date date, c_timestamp timestamp,
        c_timestamptz timestamptz, c_interval interval, c_inet inet, c_int_array int[], c_text_array text[],
        c_enum e2e_mood, c_enum_array e2e_mood[], c_domain e2e_positive, c_composite e2e_address, c_money money
        {", " + extra if extra else ""})""")


def insert_type_rows(pg, t):
    """Row 1 holds a value of every column, edge cases included; row 2 the infinities and NULLs."""
    pg.execute(f"""INSERT INTO {t} (id, c_bool, c_int8, c_float8, c_numeric, c_text, c_bytea, c_uuid, c_jsonb, c_json,
        c_date, c_timestamp, c_timestamptz, c_interval, c_inet, c_int_array, c_text_array, c_enum, c_enum_array,
        c_domain, c_composite, c_money)
        VALUES (1, true, 9223372036854775807, 'NaN', 123456789012345678901234567890.000000000001,
        'é "q" \\ 🙂', '\\x00ff10', '6ba7b810-9dad-11d1-80b4-00c04fd430c8', '{{"n": 1.0, "a": [null]}}', '[1, 2]',
        '0044-03-15 BC', '2024-03-15 14:23:45.5', '2024-03-15 10:00:00-04', '1 day 02:00:00', '::1/128',
        '{{1,NULL,3}}', '{{"a,b",NULL}}', 'ok', '{{happy,NULL}}', 7.50, ROW('Elm', 1), 5)""")
    pg.execute(f"INSERT INTO {t} (id, c_float8, c_numeric, c_timestamptz) VALUES (2, '-Infinity', 'Infinity', '-infinity')")


def test_type_coverage(pg, sinks, unique):
    t, topic = f"types_{unique}", f"types-{unique}"
    create_type_matrix(pg, t)
    pg.execute("SELECT cdc_enable(%s)", (t,))
    sinks.add(f"types_{unique}", topic)
    insert_type_rows(pg, t)
    msgs = consume(topic, 2)
    a = msgs[0]["value"]["after"]
    assert a["c_bool"] is True
    assert a["c_int8"] == 9223372036854775807
    assert a["c_float8"] == "NaN"
    assert b'"c_numeric":123456789012345678901234567890.000000000001' in msgs[0]["raw"]
    assert a["c_text"] == 'é "q" \\ 🙂'
    assert a["c_bytea"] == "AP8Q"
    assert a["c_uuid"] == "6ba7b810-9dad-11d1-80b4-00c04fd430c8"
    assert a["c_jsonb"] == {"a": [None], "n": 1.0}
    assert a["c_json"] == [1, 2]
    assert a["c_date"] == "-0043-03-15"
    assert a["c_timestamp"] == "2024-03-15T14:23:45.5"
    assert a["c_timestamptz"] == "2024-03-15T14:00:00Z", "converted to UTC"
    assert a["c_interval"] == "P1DT2H"
    assert a["c_inet"] == "::1"
    assert a["c_int_array"] == [1, None, 3]
    assert a["c_text_array"] == ["a,b", None]
    assert a["c_enum"] == "ok"
    assert a["c_enum_array"] == ["happy", None]
    assert b'"c_domain":7.50' in msgs[0]["raw"], "a domain converts as its base type"
    assert a["c_composite"] == "(Elm,1)"
    assert a["c_money"] == "$5.00"
    b = msgs[1]["value"]["after"]
    assert (b["c_float8"], b["c_numeric"], b["c_timestamptz"]) == ("-Infinity", "Infinity", "-infinity")
    assert b["c_text"] is None
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_unchanged_toast_is_never_null(pg, sinks, unique):
    full, plain, topic = f"toastf_{unique}", f"toastp_{unique}", f"toast-{unique}"
    for t in (full, plain):
        pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, title text, body text)")
        pg.execute(f"ALTER TABLE {t} ALTER COLUMN body SET STORAGE EXTERNAL")
    pg.execute("SELECT cdc_enable(%s, '{\"include_before_image\": true}')", (full,))
    pg.execute("SELECT cdc_enable(%s)", (plain,))
    sinks.add(f"toast_{unique}", topic)
    big = "".join(f"{i:08x}" for i in range(20000))  # 160 kB, stored out of line
    for t in (full, plain):
        pg.execute(f"INSERT INTO {t} VALUES (1, 'v1', %s)", (big,))
        pg.execute(f"UPDATE {t} SET title = 'v2' WHERE id = 1")
    msgs = consume(topic, 4)
    by = {(m["value"]["metadata"]["table"], m["value"]["metadata"]["operation"]): m["value"] for m in msgs}
    assert by[(full, "UPDATE")]["after"]["body"] == big
    assert by[(full, "UPDATE")]["after"]["title"] == "v2"
    assert by[(full, "UPDATE")]["diff"] == {"title": {"from": "v1", "to": "v2"}}
    u = by[(plain, "UPDATE")]
    assert "body" not in u["after"], "not carried by the WAL: left out, never null"
    assert u["metadata"]["unchanged_toast_columns"] == ["body"]
    pg.execute("SELECT cdc_disable(%s)", (full,))
    pg.execute("SELECT cdc_disable(%s)", (plain,))
