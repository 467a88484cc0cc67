-- Seed example 4: readings enriched from the sensors lookup table, with lookup changes
-- interleaved so each reading must see the sensor row as of its own commit.
CREATE TABLE sensors (sensor_id text PRIMARY KEY, location text, sensor_type text, owner text);
CREATE TABLE sensor_readings (reading_id int PRIMARY KEY, sensor_id text, reading_value numeric,
                              threshold numeric, baseline numeric, alert_level text,
                              internal_calibration text);
-- @capture
INSERT INTO sensors VALUES ('TEMP-001', 'Building A, Floor 3', 'temperature', 'Facilities Team');
INSERT INTO sensor_readings VALUES (1, 'TEMP-001', 95.5, 90, 80, 'warning', 'cal-7');
UPDATE sensors SET owner = 'Operations' WHERE sensor_id = 'TEMP-001';
INSERT INTO sensor_readings VALUES (2, 'TEMP-001', 96, 90, 80, 'warning', 'cal-7');
BEGIN;
INSERT INTO sensor_readings VALUES (3, 'TEMP-001', 97, 90, 80, 'critical', 'cal-7');
UPDATE sensors SET location = 'Building B' WHERE sensor_id = 'TEMP-001';
COMMIT;
UPDATE sensors SET sensor_id = 'TEMP-002' WHERE sensor_id = 'TEMP-001';
INSERT INTO sensor_readings VALUES (4, 'TEMP-001', 98, 90, 80, 'critical', 'cal-7');
INSERT INTO sensor_readings VALUES (5, 'TEMP-002', 98, 90, 80, 'critical', 'cal-7');
DELETE FROM sensor_readings WHERE reading_id = 5;
TRUNCATE sensors;
INSERT INTO sensor_readings VALUES (6, 'TEMP-002', 99, 90, 80, 'critical', 'cal-7');
