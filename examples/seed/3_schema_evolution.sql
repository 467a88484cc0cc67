-- Seed example 3: Schema Evolution Without Breaking Consumers.
-- As the product description writes it, but for (a) the cdc_ prefix instead of helios_cdc_, (b) local
-- endpoints (marked [local]) and (c) the setup the description leaves implicit (marked [setup]).
-- Run by tests/e2e/test_seed_examples.py against `make up`; see examples/seed/README.md.

-- [setup] A schema of its own, so examples 1 and 3 can both have a table `orders`.
CREATE SCHEMA seed_example_3;
SET search_path = seed_example_3, public;

-- Original schema
CREATE TABLE orders (
    order_id VARCHAR(50) PRIMARY KEY,
    customer_id VARCHAR(50),
    total DECIMAL(10,2),
    status VARCHAR(20)
);

-- Enable CDC with schema evolution support
-- [local] schema-registry:8081 is the local registry 127.0.0.1:8081.
SELECT cdc_enable('orders', '{
    "schema_evolution": {
        "enabled": true,
        "compatibility_mode": "full",
        "schema_registry": "http://127.0.0.1:8081",
        "auto_register": true
    }
}'::jsonb);

-- Add new column (backward compatible)
ALTER TABLE orders ADD COLUMN shipping_method VARCHAR(50) DEFAULT 'standard';

-- CDC automatically handles schema evolution
SELECT * FROM cdc_schema_history('orders');

-- Breaking change protection
-- [setup] The table is empty here: PostgreSQL itself refuses a NOT NULL column without a default on a
-- table with rows, before pg_cdc could warn.
ALTER TABLE orders ADD COLUMN required_field VARCHAR(50) NOT NULL;

-- Schema compatibility check
SELECT * FROM cdc_check_compatibility(
    table_name => 'orders',
    proposed_change => 'ADD COLUMN priority VARCHAR(10) NOT NULL'
);
