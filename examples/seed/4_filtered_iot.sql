-- Seed example 4: Filtered CDC with Transformation.
-- As the product description writes it, but for (a) the cdc_ prefix instead of helios_cdc_, (b) local
-- endpoints (marked [local]) and (c) the setup the description leaves implicit (marked [setup]).
-- Run by tests/e2e/test_seed_examples.py against `make up`; see examples/seed/README.md.

-- [setup] A schema of its own.
CREATE SCHEMA seed_example_4;
SET search_path = seed_example_4, public;
-- [setup] The readings and the lookup table `sensors` (the description shows their columns in the
-- sample event).
CREATE TABLE sensor_readings (
    reading_id VARCHAR(50) PRIMARY KEY,
    sensor_id VARCHAR(50),
    reading_value NUMERIC(6,1),
    threshold NUMERIC(6,1),
    alert_level VARCHAR(20),
    "timestamp" TIMESTAMPTZ,
    baseline NUMERIC(6,1),
    internal_calibration NUMERIC
);
CREATE TABLE sensors (sensor_id VARCHAR(50) PRIMARY KEY, location TEXT, sensor_type TEXT, owner TEXT);
INSERT INTO sensors VALUES ('SENS-001', 'Building A, Floor 3', 'temperature', 'Facilities Team'),
                           ('SENS-002', 'Building B', 'humidity', 'Facilities Team');

-- Enable CDC with filtering and transformation
SELECT cdc_enable(
    table_name => 'sensor_readings',
    config => '{
        "capture_mode": "filtered",
        "filter_expression": "reading_value > threshold OR alert_level = ''critical''",
        "transformations": [
            {
                "type": "enrich",
                "source_column": "sensor_id",
                "lookup_table": "sensors",
                "lookup_column": "sensor_id",
                "add_columns": ["location", "sensor_type", "owner"]
            },
            {
                "type": "compute",
                "name": "deviation_pct",
                "expression": "ABS(reading_value - baseline) / baseline * 100"
            },
            {
                "type": "mask",
                "column": "internal_calibration",
                "method": "remove"
            }
        ],
        "partition_key": "sensor_type"
    }'::jsonb
);

-- Stream to analytics with transformations applied
-- [local] No bootstrap_servers: cdc.kafka_bootstrap_servers, the local broker.
SELECT cdc_add_sink('kafka_iot_alerts', 'kafka', '{
    "topic": "iot.critical-readings",
    "format": "json",
    "include_transformations": true
}'::jsonb);

-- [setup] Readings: the description's sample (over its threshold), one under it, one critical.
INSERT INTO sensor_readings VALUES
    ('READ-847293', 'SENS-001', 95.5, 80.0, 'warning', '2024-03-15 14:23:45+00', 80.0, 0.997),
    ('READ-847294', 'SENS-002', 40.0, 80.0, 'normal', '2024-03-15 14:23:46+00', 40.0, 1.002),
    ('READ-847295', 'SENS-002', 50.0, 80.0, 'critical', '2024-03-15 14:23:47+00', 40.0, 1.001);

-- Monitor filtering effectiveness
SELECT * FROM cdc_filter_metrics('sensor_readings');
