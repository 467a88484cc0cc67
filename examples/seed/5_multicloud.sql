-- Seed example 5: Multi-Cloud CDC Federation.
-- As the product description writes it, but for (a) the cdc_ prefix instead of helios_cdc_, (b) local
-- endpoints (marked [local]) and (c) the setup the description leaves implicit (marked [setup]).
-- Run by tests/e2e/test_seed_examples.py against `make up`; see examples/seed/README.md.

-- [setup] A schema of its own, and the table (the description names its routing column).
CREATE SCHEMA seed_example_5;
SET search_path = seed_example_5, public;
CREATE TABLE global_customers (customer_id INT PRIMARY KEY, name TEXT, customer_region TEXT);
-- [setup] Customers that exist before the sinks: each sink gets its routes' rows as its snapshot.
INSERT INTO global_customers VALUES (1, 'Ana', 'americas'), (2, 'Bo', 'europe'), (3, 'Chen', 'asia');
-- [setup] The Kinesis stream and the Pub/Sub topic (with a subscription for its reader), created the
-- way an operator would, before the sinks write to them.
\! scripts/kinesis.sh create-stream customers-americas
\! scripts/pubsub.sh create-topic helios-analytics customers-asia customers-asia-reader
-- [local] The Event Hubs namespace is the local SASL_SSL listener (scripts/kafka.sh): its connection
-- string and the CA of its certificate, read by psql from the files that script writes.
\set eventhub_connection `cat "${PG_CDC_RUN:-/var/tmp/pg_cdc}/kafka/eventhub.connection"`
\set eventhub_ca `echo "${PG_CDC_RUN:-/var/tmp/pg_cdc}/kafka/tls/ca.pem"`
\set eventhub_servers `echo "${KAFKA_HOST:-127.0.0.1}:${KAFKA_SASL_PORT:-9094}"`

-- Enable multi-cloud CDC
SELECT cdc_enable_multicloud(
    table_name => 'global_customers',
    config => '{
        "regional_routing": {
            "enabled": true,
            "routing_column": "customer_region",
            "routes": {
                "americas": ["aws_kinesis", "azure_eventhub"],
                "europe": ["azure_eventhub", "gcp_pubsub"],
                "asia": ["gcp_pubsub", "aws_kinesis"]
            }
        }
    }'::jsonb
);

-- Configure multi-cloud sinks
-- [local] The Kinesis endpoint is the local server's (cdc.kinesis_endpoint, set by `make up`).
SELECT cdc_add_sink('aws_kinesis', 'kinesis', '{
    "stream_name": "customers-americas",
    "region": "us-east-1"
}'::jsonb);

-- [local] "connection_string": "..." is the local listener's, with its address and CA.
SELECT cdc_add_sink('azure_eventhub', 'eventhub', '{
    "namespace": "helios-cdc",
    "eventhub": "customers-europe",
    "connection_string": "..."
}'::jsonb || jsonb_build_object('connection_string', :'eventhub_connection',
                                'bootstrap_servers', :'eventhub_servers',
                                'properties', jsonb_build_object('ssl.ca.location', :'eventhub_ca')));

-- [local] The Pub/Sub endpoint is Google's fake server (cdc.pubsub_endpoint, set by `make up`).
SELECT cdc_add_sink('gcp_pubsub', 'pubsub', '{
    "project": "helios-analytics",
    "topic": "customers-asia"
}'::jsonb);

-- [setup] Changes: a new customer in Europe, and one who moves from the Americas to Asia.
INSERT INTO global_customers VALUES (4, 'Dana', 'europe');
UPDATE global_customers SET customer_region = 'asia' WHERE customer_id = 1;

-- Monitor multi-cloud delivery
SELECT * FROM cdc_multicloud_status();
