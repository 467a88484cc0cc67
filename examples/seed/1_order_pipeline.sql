-- Seed example 1: Real-Time Order Processing Pipeline.
-- As the product description writes it, but for (a) the cdc_ prefix instead of helios_cdc_, (b) local
-- endpoints (marked [local]) and (c) the setup the description leaves implicit (marked [setup]).
-- Run by tests/e2e/test_seed_examples.py against `make up`; see examples/seed/README.md.

-- [setup] A schema of its own, so examples 1 and 3 can both have a table `orders`.
CREATE SCHEMA seed_example_1;
SET search_path = seed_example_1, public;
-- [setup] The table (the description shows its columns in the sample event).
CREATE TABLE orders (
    order_id VARCHAR(50) PRIMARY KEY,
    customer_id VARCHAR(50),
    total DECIMAL(10,2),
    status VARCHAR(20),
    customer_region VARCHAR(20)
);
-- [setup] The Kinesis stream, created the way an operator would, before the sink writes to it.
\! scripts/kinesis.sh create-stream orders-fraud-detection

-- Enable CDC on orders table with full configuration
SELECT cdc_enable(
    table_name => 'orders',
    config => '{
        "capture_mode": "all_changes",
        "operations": ["INSERT", "UPDATE", "DELETE"],
        "include_before_image": true,
        "include_transaction_info": true,
        "partition_key": "customer_region"
    }'::jsonb
);

-- Add multiple sinks for different consumers
-- [local] kafka:9092 is the local broker 127.0.0.1:9092; format avro registers with cdc.schema_registry,
-- which the run sets to the local registry.
SELECT cdc_add_sink('kafka_fulfillment', 'kafka', '{
    "bootstrap_servers": "127.0.0.1:9092",
    "topic": "orders.fulfillment",
    "format": "avro"
}'::jsonb);

SELECT cdc_add_sink('kafka_analytics', 'kafka', '{
    "bootstrap_servers": "127.0.0.1:9092",
    "topic": "orders.analytics",
    "format": "json"
}'::jsonb);

-- [local] The Kinesis endpoint is the local server's (cdc.kinesis_endpoint, set by `make up`).
SELECT cdc_add_sink('kinesis_fraud', 'kinesis', '{
    "stream_name": "orders-fraud-detection",
    "region": "us-east-1",
    "format": "json"
}'::jsonb);

-- [setup] The change of the description's sample event.
INSERT INTO orders VALUES ('ORD-12345', 'CUST-789', 150.00, 'pending', 'us-east');
UPDATE orders SET status = 'confirmed' WHERE order_id = 'ORD-12345';

-- Monitor CDC performance
SELECT * FROM cdc_metrics('orders');

-- Query CDC stream status
SELECT
    sink_name,
    events_published,
    last_timestamp,
    NOW() - last_timestamp as lag
FROM _cdc_offsets
WHERE table_name = 'orders';
