#!/usr/bin/env bash
# The short demo `make demo` runs after `make up`: capture a table, add a Kafka sink, change rows,
# then read the events back from Kafka with an independent client (not the worker's own state), and
# ask PostgreSQL how capture is doing (cdc_metrics, cdc_status, the _cdc_offsets lag query).
# The demo's table is `orders`, as in the product description; an `orders` table the demo did not
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
    IF to_regclass('public.orders') IS NOT NULL
       AND obj_description(to_regclass('public.orders'), 'pg_class') IS DISTINCT FROM 'pg_cdc demo' THEN
        RAISE EXCEPTION 'a table public.orders exists that the demo did not create; the demo leaves it alone';
    END IF;
END \$\$;
SELECT cdc_disable(table_name::regclass) FROM _cdc_publications WHERE table_name = 'orders';
DROP TABLE IF EXISTS public.orders;
CREATE TABLE public.orders (order_id text PRIMARY KEY, customer_id text, total numeric(10,2),
                            status text, updated_at timestamptz DEFAULT now(), internal_notes text);
COMMENT ON TABLE public.orders IS 'pg_cdc demo';
RESET client_min_messages;
\o
-- Rows that exist before the sink: its snapshot delivers them first, as READ events.
INSERT INTO orders (order_id, customer_id, total, status)
     VALUES ('ORD-1', 'CUST-1', 20.00, 'shipped'), ('ORD-2', 'CUST-2', 35.50, 'shipped');
SELECT cdc_enable(table_name => 'orders', config => '{
    "include_columns": ["order_id", "customer_id", "total", "status", "updated_at"],
    "key_columns": ["order_id"], "include_before_image": true, "include_transaction_info": true}'::jsonb) AS publication_id;
SELECT cdc_add_sink(sink_name => 'demo_kafka', sink_type => 'kafka', config => '{
    "bootstrap_servers": "$KAFKA_BOOTSTRAP", "topic": "$topic", "format": "json"}'::jsonb) AS sink_id;
SQL

echo "== change rows"
q -e <<'SQL'
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
  echo "INSERT INTO orders (order_id, customer_id, total, status)
        SELECT 'ORD-$i-' || n, 'CUST-' || n, n * 1.5, 'pending' FROM generate_series(1, 10) n;"
done | q
"$PG_CDC_VENV/bin/python" "$here/consume.py" --topic "$topic" --count 2005 --timeout 120 --quiet

echo "== how capture is doing, from SQL (all measured by the worker)"
# Wait until the slot is confirmed past the workload, so the figures cover all of it.
for _ in $(seq 1 60); do
  [ "$(q -At -c "SELECT events_published FROM _cdc_offsets WHERE table_name = 'orders'")" = "2005" ] && break
  sleep 0.5
done
q <<'SQL'
SELECT jsonb_pretty(cdc_metrics('orders')) AS cdc_metrics;
\x on
SELECT * FROM cdc_status();
\x off
SELECT sink_name, events_published, last_timestamp, NOW() - last_timestamp AS lag
  FROM _cdc_offsets WHERE table_name = 'orders';
SQL
echo "== demo done: psql with 'make psql'; stop everything with 'make down'"
