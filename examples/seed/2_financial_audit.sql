-- Seed example 2: Financial Transaction Audit Stream.
-- As the product description writes it, but for (a) the cdc_ prefix instead of helios_cdc_, (b) local
-- endpoints (marked [local]) and (c) the setup the description leaves implicit (marked [setup]).
-- Run by tests/e2e/test_seed_examples.py against `make up`; see examples/seed/README.md.

-- [setup] A schema of its own.
CREATE SCHEMA seed_example_2;
SET search_path = seed_example_2, public;
-- [setup] The table (the description shows its columns in the sample event).
CREATE TABLE transactions (
    transaction_id VARCHAR(50) PRIMARY KEY,
    account_id VARCHAR(50),
    account_number VARCHAR(50),
    ssn VARCHAR(11),
    amount DECIMAL(12,2),
    transaction_type VARCHAR(30),
    beneficiary_account VARCHAR(50),
    "timestamp" TIMESTAMPTZ DEFAULT now()
);
-- [setup] The key PII tokenization uses, made once per cluster (a key made before is kept).
SELECT cdc_create_tokenization_key()
 WHERE current_setting('cdc.tokenization_key_file') = '' AND pg_stat_file('pg_cdc_token.key', true) IS NULL;
-- [setup] The Kinesis stream, created the way an operator would.
\! scripts/kinesis.sh create-stream transactions-fraud-ml

-- Enable CDC with compliance features
SELECT cdc_enable(
    table_name => 'transactions',
    config => '{
        "capture_mode": "full_audit",
        "operations": ["INSERT", "UPDATE", "DELETE"],
        "include_before_image": true,
        "include_user_context": true,
        "include_query_text": false,
        "compliance": {
            "redact_pii": true,
            "pii_columns": ["ssn", "account_number"],
            "redaction_method": "tokenize",
            "audit_retention_days": 2555
        },
        "exactly_once": {
            "enabled": true,
            "checkpoint_interval_ms": 1000
        }
    }'::jsonb
);

-- Stream to compliance and fraud systems
-- [local] No bootstrap_servers: cdc.kafka_bootstrap_servers, the local broker; format avro registers with
-- cdc.schema_registry, which the run sets to the local registry.
SELECT cdc_add_sink('kafka_compliance', 'kafka', '{
    "topic": "transactions.audit",
    "format": "avro",
    "exactly_once": true,
    "transactional_id": "helios-cdc-compliance"
}'::jsonb);

-- [local] No region: cdc.aws_region; the endpoint is the local server's (cdc.kinesis_endpoint).
SELECT cdc_add_sink('kinesis_fraud_ml', 'kinesis', '{
    "stream_name": "transactions-fraud-ml",
    "format": "json",
    "partition_key": "account_id"
}'::jsonb);

-- [setup] A transaction to stream, as a teller system would write it.
SET application_name = 'teller_system';
INSERT INTO transactions (transaction_id, account_id, account_number, ssn, amount, transaction_type, beneficiary_account)
     VALUES ('TXN-847293', 'ACC-1', '1234567890', '123-45-6789', 15000.00, 'wire_transfer', '5678901234');
RESET application_name;

-- Exactly-once delivery verification
SELECT * FROM cdc_delivery_status('kafka_compliance');
