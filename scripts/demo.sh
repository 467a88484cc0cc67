#!/usr/bin/env bash
# The short demo `make demo` runs after `make up`: capture a table, add a Kafka sink, change rows,
# then read the events back from Kafka with an independent client (not the worker's own state).
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
SELECT cdc_disable(table_name::regclass) FROM _cdc_publications WHERE table_name = 'demo_orders';
DROP TABLE IF EXISTS demo_orders;
CREATE TABLE demo_orders (order_id text PRIMARY KEY, customer_id text, total numeric(10,2),
                          status text, updated_at timestamptz DEFAULT now(), internal_notes text);
RESET client_min_messages;
\o
SELECT cdc_enable(table_name => 'demo_orders', config => '{
    "include_columns": ["order_id", "customer_id", "total", "status", "updated_at"],
    "key_columns": ["order_id"], "include_before_image": true, "include_transaction_info": true}'::jsonb) AS publication_id;
SELECT cdc_add_sink(sink_name => 'demo_kafka', sink_type => 'kafka', config => '{
    "bootstrap_servers": "$KAFKA_BOOTSTRAP", "topic": "$topic", "format": "json"}'::jsonb) AS sink_id;
SQL

echo "== change rows"
q -e <<'SQL'
INSERT INTO demo_orders (order_id, customer_id, total, status, internal_notes)
     VALUES ('ORD-12345', 'CUST-789', 150.00, 'pending', 'never published');
UPDATE demo_orders SET status = 'confirmed' WHERE order_id = 'ORD-12345';
DELETE FROM demo_orders WHERE order_id = 'ORD-12345';
SQL

echo "== events read back from Kafka (confluent-kafka, isolation.level=read_committed)"
"$PG_CDC_VENV/bin/python" "$here/consume.py" --topic "$topic" --count 3 --timeout 60

echo "== delivery progress, from SQL"
q <<'SQL'
SELECT sink_name, events_published, last_timestamp, NOW() - last_timestamp AS lag
  FROM _cdc_offsets WHERE table_name = 'demo_orders';
SELECT sink_name, state, last_error FROM _cdc_sinks WHERE sink_name = 'demo_kafka';
SQL
echo "== demo done: psql with 'make psql'; stop everything with 'make down'"
