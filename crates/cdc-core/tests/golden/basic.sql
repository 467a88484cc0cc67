-- Row changes of a table with a primary key and REPLICA IDENTITY FULL (before images on).
CREATE TABLE orders (order_id text PRIMARY KEY, customer_id text, total numeric(10,2), status text,
                     customer_region text, internal_notes text);
ALTER TABLE orders REPLICA IDENTITY FULL;
-- A table without before images: updates carry no old row, deletes the key only.
CREATE TABLE plain (id int PRIMARY KEY, v text);
-- @capture
INSERT INTO orders VALUES ('ORD-12345', 'CUST-789', 150.00, 'pending', 'us-east', 'do not publish');
UPDATE orders SET status = 'confirmed' WHERE order_id = 'ORD-12345';
BEGIN;
INSERT INTO orders VALUES ('ORD-2', 'CUST-1', 10.50, 'pending', 'eu-west', NULL);
INSERT INTO orders VALUES ('ORD-3', 'CUST-2', 0.01, 'draft', 'eu-west', NULL);
SAVEPOINT s1;
INSERT INTO orders VALUES ('ORD-ROLLED-BACK', 'CUST-3', 1, 'x', 'x', NULL);
ROLLBACK TO SAVEPOINT s1;
UPDATE orders SET order_id = 'ORD-3B' WHERE order_id = 'ORD-3';
COMMIT;
BEGIN;
INSERT INTO orders VALUES ('ORD-ABORTED', 'CUST-4', 1, 'x', 'x', NULL);
ROLLBACK;
DELETE FROM orders WHERE order_id = 'ORD-2';
INSERT INTO plain VALUES (1, 'one');
UPDATE plain SET v = 'uno' WHERE id = 1;
UPDATE plain SET id = 2 WHERE id = 1;
DELETE FROM plain WHERE id = 2;
TRUNCATE plain, orders RESTART IDENTITY;
