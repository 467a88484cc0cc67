"""What a new user is told: cdc_add_sink names the tables a sink will carry and the rows its snapshot
reads first (counted in a small table, the planner's estimate in a large one), so a sink without
`tables` that snapshots every captured table is never a surprise."""
import re

import pytest

from conftest import connect, typed_sinks


@pytest.fixture
def notices(unique):
    """A connection whose NOTICEs are kept, and the table sinks added on it (dropped after the test, with
    their event tables)."""
    with connect() as conn:
        got = []
        conn.add_notice_handler(lambda d: got.append(d.message_primary))
        with typed_sinks(conn, "table") as sinks:
            yield got, sinks
        for (t,) in conn.execute("SELECT relname FROM pg_class WHERE relname LIKE %s", (f"fh\\_%{unique}\\_events",)):
            conn.execute(f"DROP TABLE IF EXISTS {t}")


def add_sink(got, sinks, name, config):
    """Adds table sink `name`; returns the NOTICEs that say what it carries."""
    got.clear()
    sinks.add(name, config)
    return [n for n in got if n.startswith(f'sink "{name}" carries')]


def test_add_sink_notice_names_the_tables_and_the_snapshot_rows(pg, notices, unique):
    got, sinks = notices
    small, big, cold = f"fh_small_{unique}", f"fh_big_{unique}", f"fh_cold_{unique}"
    for t in (small, big, cold):
        # No autovacuum: whether the cold table was analyzed must not depend on timing.
        pg.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, pad text) WITH (autovacuum_enabled = false)")
    pg.execute(f"INSERT INTO {small} SELECT g, 'x' FROM generate_series(1, 2002) g")
    for t in (big, cold):  # about 12 MiB each: estimated, not counted
        pg.execute(f"INSERT INTO {t} SELECT g, repeat('p', 200) FROM generate_series(1, 50000) g")
    pg.execute(f"ANALYZE {big}")
    for t in (small, big, cold):
        pg.execute("SELECT cdc_enable(%s)", (t,))

    (n,) = add_sink(got, sinks, f"fh_a_{unique}",
                    f'{{"table": "fh_a_{unique}_events", "tables": ["{small}"]}}')
    assert n == (f'sink "fh_a_{unique}" carries the captured tables of its config.tables: public.{small} '
                 f'(2,002 rows); its snapshot first reads 2,002 rows as READ events')

    (n,) = add_sink(got, sinks, f"fh_b_{unique}",
                    f'{{"table": "fh_b_{unique}_events", "tables": ["{big}", "{small}"]}}')
    m = re.search(rf"public\.{big} \(about ([0-9,]+) rows\)", n)
    assert m, n
    estimate = int(m.group(1).replace(",", ""))
    assert 45000 <= estimate <= 55000, f"reltuples after ANALYZE: {estimate}"
    assert f"its snapshot first reads about {estimate + 2002:,} rows" in n

    (n,) = add_sink(got, sinks, f"fh_c_{unique}",
                    f'{{"table": "fh_c_{unique}_events", "tables": ["{cold}"], "snapshot_mode": "never"}}')
    assert n == (f'sink "fh_c_{unique}" carries the captured tables of its config.tables: public.{cold} '
                 f'(not analyzed yet: rows unknown); no snapshot: it delivers the changes committed from now on')

    # A sink without `tables` says it carries every captured table, and those captured later.
    (n,) = add_sink(got, sinks, f"fh_d_{unique}", f'{{"table": "fh_d_{unique}_events", "snapshot_mode": "never"}}')
    assert n.startswith(f'sink "fh_d_{unique}" carries every captured table (config.tables unset), '
                        'and those captured later: ')
    assert f"public.{small} (2,002 rows)" in n
    sinks.drop_all()
    sinks.names.clear()
    for t in (small, big, cold):
        pg.execute(f"SELECT cdc_disable('{t}')")
        pg.execute(f"DROP TABLE {t}")
