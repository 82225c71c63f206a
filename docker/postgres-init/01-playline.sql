-- Runs once, when the PostgreSQL volume is first initialised: playline's own database
-- (receipts, sheet rows, fleet pacing), apart from Temporal's.
CREATE USER playline WITH PASSWORD 'playline';
CREATE DATABASE playline OWNER playline;
