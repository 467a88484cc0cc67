//! The port of event formats other than pg_cdc's JSON: the pipeline encodes every event as JSON
//! ([`crate::envelope`]), then hands it, with the relation plan it was made under, to the sink's
//! [`EventFormat`], which re-encodes key and payload in place (the Avro format in `cdc-sinks`
//! builds the table version's schema from the plan and registers it with a schema registry).
//! A format never changes what an event says, only how it is written, so every filter,
//! transformation and redaction rule holds for every format by construction.
use std::sync::Arc;

use crate::envelope::{Event, RelationPlan};
use crate::types::TypeRegistry;

/// Why an event could not be re-encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatError {
    /// Transient (a schema registry that is down or timed out): the sink retries, nothing is lost.
    /// Otherwise an operator must act (a registry refusing a schema, a value the format cannot
    /// carry); the sink stops in state error and is retried slowly.
    pub retry: bool,
    /// What happened, without secrets.
    pub message: String,
}

impl FormatError {
    /// A transient failure.
    pub fn retry(message: impl Into<String>) -> Self {
        FormatError { retry: true, message: message.into() }
    }

    /// A failure an operator must look at.
    pub fn operator(message: impl Into<String>) -> Self {
        FormatError { retry: false, message: message.into() }
    }
}

impl std::fmt::Display for FormatError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// A table version's schema as a schema registry knows it (for `cdc_schema_history`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// The table.
    pub table_oid: u32,
    /// The version of its schema history.
    pub version: i32,
    /// The registry, as messages show it (no credentials).
    pub registry: String,
    /// The subject of the events' values.
    pub subject: String,
    /// The id the registry gave the schema.
    pub schema_id: u32,
}

/// A sink's event format: re-encodes the JSON event `event` of a change planned under `plan`.
pub trait EventFormat: Send {
    /// Replaces `event.payload` and `event.key` with their encoding in this format.
    fn encode(&mut self, plan: &Arc<RelationPlan>, types: &TypeRegistry, event: &mut Event) -> Result<(), FormatError>;

    /// The table versions whose schemas it registered (or looked up) since the last call.
    fn take_registrations(&mut self) -> Vec<Registration> {
        Vec::new()
    }
}
