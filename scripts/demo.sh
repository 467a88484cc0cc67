#!/usr/bin/env bash
# The short demo `make demo` runs after `make up`: capture a table, add a Kafka sink, change rows,
# then read the events back from Kafka with an independent client (not the worker's own state), and
# ask PostgreSQL how capture is doing (cdc_metrics, cdc_status, the _cdc_offsets lag query).
# The demo's objects live in a schema of their own, cdc_demo (its table `orders`, as in the product
# description), and its sink carries only that table (`tables`): the README's examples, run next in
# `public`, neither see the demo's rows nor collide with its names. A schema cdc_demo the demo did not
# create is left alone (the demo stops).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=env.sh source-path=SCRIPTDIR
source "$here/env.sh"
topic="demo.orders.$(date +%s)"
q() { psql -X -v ON_ERROR_STOP=1 -q "$@"; }

echo "== capture the table and add a Kafka sink (topic $topic)"
q <<SQL
\o /dev/null
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS pg_cdc;
SELECT cdc_drop_sink(sink_name) FROM _cdc_sinks WHERE sink_name = 'demo_kafka';
DO \$\$
BEGIN
    IF to_regnamespace('cdc_demo') IS NOT NULL
       AND obj_description(to_regnamespace('cdc_demo'), 'pg_namespace') IS DISTINCT FROM 'pg_cdc demo' THEN
        RAISE EXCEPTION 'a schema cdc_demo exists that the demo did not create; the demo leaves it alone';
    END IF;
END \$\$;
SELECT cdc_disable(p.table_oid::regclass) FROM _cdc_publications p JOIN pg_class c ON c.oid = p.table_oid
 WHERE c.relnamespace = to_regnamespace('cdc_demo')
    -- An older demo's table, in public.
    OR c.oid = to_regclass('public.orders') AND obj_description(c.oid, 'pg_class') = 'pg_cdc demo';
DO \$\$
BEGIN
    IF obj_description(to_regclass('public.orders'), 'pg_class') = 'pg_cdc demo' THEN
        DROP TABLE public.orders;
    END IF;
END \$\$;
DROP SCHEMA IF EXISTS cdc_demo CASCADE;
CREATE SCHEMA cdc_demo;
COMMENT ON SCHEMA cdc_demo IS 'pg_cdc demo';
CREATE TABLE cdc_demo.orders (order_id text PRIMARY KEY, customer_id text, total numeric(10,2),
                              status text, updated_at timestamptz DEFAULT now(), internal_notes text);
RESET client_min_messages;
\o
SET search_path = cdc_demo, public;
-- Rows that exist before the sink: its snapshot delivers them first, as READ events.
INSERT INTO orders (order_id, customer_id, total, status)
     VALUES ('ORD-1', 'CUST-1', 20.00, 'shipped'), ('ORD-2', 'CUST-2', 35.50, 'shipped');
SELECT cdc_enable(table_name => 'cdc_demo.orders', config => '{
    "include_columns": ["order_id", "customer_id", "total", "status", "updated_at"],
    "key_columns": ["order_id"], "include_before_image": true, "include_transaction_info": true}'::jsonb) AS publication_id;
SELECT cdc_add_sink(sink_name => 'demo_kafka', sink_type => 'kafka', config => '{
    "bootstrap_servers": "$KAFKA_BOOTSTRAP", "topic": "$topic", "format": "json",
    "tables": ["cdc_demo.orders"]}'::jsonb) AS sink_id;
SQL

echo "== change rows"
q -e <<'SQL'
SET search_path = cdc_demo, public;
INSERT INTO orders (order_id, customer_id, total, status, internal_notes)
     VALUES ('ORD-12345', 'CUST-789', 150.00, 'pending', 'never published');
UPDATE orders SET status = 'confirmed' WHERE order_id = 'ORD-12345';
DELETE FROM orders WHERE order_id = 'ORD-12345';
SQL

echo "== events read back from Kafka (confluent-kafka, isolation.level=read_committed):"
echo "   the two rows that existed before the sink (READ, from its snapshot) and the three changes"
"$PG_CDC_VENV/bin/python" "$here/consume.py" --topic "$topic" --count 5 --timeout 60

echo "== a workload: 200 transactions of 10 orders"
for i in $(seq 1 200); do
  echo "INSERT INTO cdc_demo.orders (order_id, customer_id, total, status)
        SELECT 'ORD-$i-' || n, 'CUST-' || n, n * 1.5, 'pending' FROM generate_series(1, 10) n;"
done | q
"$PG_CDC_VENV/bin/python" "$here/consume.py" --topic "$topic" --count 2005 --timeout 120 --quiet

echo "== how capture is doing, from SQL (all measured by the worker)"
# Wait until the slot is confirmed past the workload, so the figures cover all of it.
for _ in $(seq 1 60); do
  [ "$(q -At -c "SELECT events_published FROM _cdc_offsets WHERE sink_name = 'demo_kafka'")" = "2005" ] && break
  sleep 0.5
done
q <<'SQL'
SELECT jsonb_pretty(cdc_metrics('cdc_demo.orders')) AS cdc_metrics;
\x on
SELECT * FROM cdc_status();
\x off
SELECT sink_name, events_published, last_timestamp, NOW() - last_timestamp AS lag
  FROM _cdc_offsets WHERE table_schema = 'cdc_demo' AND table_name = 'orders';
SQL
echo "== demo done: its objects are in the schema cdc_demo (sink demo_kafka carries only cdc_demo.orders)."
echo "   psql with 'make psql'; stop everything with 'make down'"
