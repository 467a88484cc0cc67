"""cdc_preview shows what the worker sends: its event_text equals the bytes Kafka received for the same
row, but for the four fields only delivery knows (the positions, the transaction id, the commit time),
over every built-in type family, for table rows and for a `sample`."""
import json
import re

from conftest import consume
from test_types import create_type_matrix, insert_type_rows

# The fields a preview cannot know before the row is committed and decoded.
DELIVERY_ONLY = re.compile(r'"(lsn|commit_lsn|transaction_id|timestamp)":("(?:[^"\\]|\\.)*"|-?[0-9.]+|null)')


def without_delivery_fields(text):
    """The event's JSON text with each delivery-only field's value replaced by a placeholder; what is
    left is compared byte for byte."""
    stripped, n = DELIVERY_ONLY.subn(lambda m: f'"{m.group(1)}":"<delivery>"', text)
    assert n > 0, f"no delivery-only field in {text[:200]}"
    return stripped


def same_text(shown, sent, what):
    """Asserts the two event texts agree but for the delivery-only fields, showing where they differ."""
    a, b = without_delivery_fields(shown), without_delivery_fields(sent)
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    assert a == b, f"{what}: preview {a[max(0, i - 80):i + 80]!r} != delivered {b[max(0, i - 80):i + 80]!r}"


def previews(pg, sql, params):
    return pg.execute(sql, params).fetchone()[0]["previews"]


def test_preview_text_is_the_delivered_event(pg, sinks, unique):
    t, topic = f"preview_{unique}", f"preview-{unique}"
    create_type_matrix(pg, t, extra="c_total numeric(10,2)")
    pg.execute("SELECT cdc_enable(%s)", (t,))
    sinks.add(f"preview_{unique}", topic, tables=[t])
    insert_type_rows(pg, t)
    sample = {"id": 3, "c_total": 1, "c_numeric": 1, "c_float8": 1.5, "c_text": "s", "c_jsonb": {"n": 1.0}}
    pg.execute(f"INSERT INTO {t} SELECT * FROM jsonb_populate_record(NULL::{t}, %s::jsonb)", (json.dumps(sample),))
    delivered = {json.loads(m["raw"])["after"]["id"]: m["raw"].decode() for m in consume(topic, 3)}

    shown = {p["row"]["id"]: p for p in previews(pg, f"SELECT cdc_preview('{t}', max_rows => 10)", ())}
    assert sorted(shown) == ["1", "2", "3"]
    for row_id, raw in delivered.items():
        p = shown[str(row_id)]
        assert p["published"] is True
        same_text(p["event_text"], raw, f"row {row_id}")
    # The jsonb event is the same text parsed by PostgreSQL: numbers keep their digits.
    event = pg.execute(
        "SELECT (p -> 'event')::text FROM jsonb_array_elements(cdc_preview(%s, max_rows => 10) -> 'previews') p "
        "WHERE p -> 'row' ->> 'id' = '1'", (t,)).fetchone()[0]
    assert '"c_domain": 7.50' in event
    assert '"c_numeric": 123456789012345678901234567890.000000000001' in event

    (p,) = previews(pg, "SELECT cdc_preview(%s, sample => %s::jsonb)", (t, json.dumps(sample)))
    same_text(p["event_text"], delivered[3], "sample")
    # The sample's {"total": 1} is written as the worker writes numeric(10,2): 1.00, never 1.0.
    assert '"c_total":1.00' in p["event_text"]
    assert p["event"]["after"]["c_total"] == 1
    assert '"c_total": 1.00' in pg.execute("SELECT (cdc_preview(%s, sample => %s::jsonb) -> 'previews' -> 0 -> 'event')::text",
                                           (t, json.dumps(sample))).fetchone()[0]
    pg.execute("SELECT cdc_disable(%s)", (t,))


def test_preview_text_control_a_changed_row_differs(pg, sinks, unique):
    """Control: the comparison sees a difference of one value (the delivered event of another row)."""
    t, topic = f"previewc_{unique}", f"previewc-{unique}"
    create_type_matrix(pg, t)
    pg.execute("SELECT cdc_enable(%s)", (t,))
    sinks.add(f"previewc_{unique}", topic, tables=[t])
    insert_type_rows(pg, t)
    delivered = {json.loads(m["raw"])["after"]["id"]: m["raw"].decode() for m in consume(topic, 2)}
    shown = {p["row"]["id"]: p for p in previews(pg, f"SELECT cdc_preview('{t}')", ())}
    assert without_delivery_fields(shown["1"]["event_text"]) != without_delivery_fields(delivered[2])
    pg.execute(f"UPDATE {t} SET c_domain = 7.5 WHERE id = 1")  # the same value, written with one digit less
    changed = previews(pg, f"SELECT cdc_preview('{t}')", ())
    assert without_delivery_fields(next(p for p in changed if p["row"]["id"] == "1")["event_text"]) \
        != without_delivery_fields(delivered[1])
    pg.execute("SELECT cdc_disable(%s)", (t,))
