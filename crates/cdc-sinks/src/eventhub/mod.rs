//! The Azure Event Hubs sink: Event Hubs speaks the Kafka protocol, so this is the Kafka sink
//! (`crate::kafka`) with Event Hubs' connection settings — SASL PLAIN over TLS, user
//! `$ConnectionString`, the namespace's connection string as password, the event hub as topic.
//!
//! Event Hubs' Kafka transactions are a preview on some tiers only, so the sink is at-least-once
//! by default (`"exactly_once": true` asks for transactions). The connection string comes from the
//! config or, better, from `connection_string_file` (then it is in no SQL text, so never in
//! `pg_stat_activity` or a statement log); it is never echoed in an error or a log line.
pub mod config;

#[cfg(test)]
mod tests;
