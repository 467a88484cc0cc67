//! Event formats other than pg_cdc's JSON, and the schema registry client they use. The pipeline
//! hands each JSON event to the sink's format ([`cdc_core::format::EventFormat`]) with the plan of
//! its relation version; [`AvroFormat`] re-encodes it in Confluent's wire format.
//!
//! Where a table's registry comes from, first that is set: the sink's `schema_registry`, the
//! table's `schema_evolution.schema_registry`, the server setting `cdc.schema_registry`.
//!
//! Subjects: a topic per table (a topic template with `{table}`) uses the topic's subjects,
//! `<topic>-key` and `<topic>-value`; a topic several tables share uses each record's name,
//! scoped by the topic, `<topic>-<namespace>.Envelope` and `<topic>-<namespace>.Key`.
//!
//! A schema is registered when the worker first encodes an event of a table version (a new
//! relation description), never in the DDL's transaction. Before registering, the subject's
//! compatibility level is set from the table's `compatibility_mode`; a version recorded under
//! `cdc_force_schema_break` is registered with the level `NONE`, and the mode's level is put back
//! after it. With `auto_register` false the schema is only looked up, and a schema that is not
//! registered stops the sink (state error) until someone registers it.
pub mod avro;
pub mod connect_avro;
pub mod debezium;
#[cfg(test)]
mod debezium_tests;
pub(crate) mod event;
pub mod protobuf;
pub mod schema_registry;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;

use apache_avro::Schema;
use cdc_core::envelope::{Event, RelationPlan};
use cdc_core::format::{EventFormat, FormatError, Registration};
use cdc_core::types::TypeRegistry;

use self::avro::{TableSchemas, Ty};
use self::schema_registry::SchemaRegistry;
use crate::kafka::config::expand_topic;

/// How a sink names its subjects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subjects {
    /// The topic template (`{database}`, `{schema}`, `{table}`).
    pub topic: String,
    /// The database, for the template and the records' namespace.
    pub database: String,
}

impl Subjects {
    /// Whether each table has a topic of its own (the template names `{table}`).
    pub fn per_table(&self) -> bool {
        self.topic.contains("{table}")
    }

    /// The value and key subjects of a table whose records are in `namespace`; on the topic of
    /// its own of table version `topic_version` when there is one (`cdc_create_version_topic`).
    pub fn of(&self, schema: &str, table: &str, namespace: &str, topic_version: Option<i32>) -> (String, String) {
        let topic = expand_topic(&self.topic, &self.database, schema, table);
        let topic = match topic_version {
            Some(v) => cdc_core::schema::version_topic(&topic, v),
            None => topic,
        };
        if self.per_table() {
            (format!("{topic}-value"), format!("{topic}-key"))
        } else {
            (format!("{topic}-{namespace}.Envelope"), format!("{topic}-{namespace}.Key"))
        }
    }
}

/// What the format keeps of one table version.
struct Version {
    /// The plan it was made for (a new relation description makes a new one).
    plan: Arc<RelationPlan>,
    schemas: TableSchemas,
    /// The registry's id of its value schema.
    value_id: u32,
    key_subject: String,
    registry: String,
    /// Key schemas: the key's column names, its schema's id, the columns' types.
    keys: Vec<(Vec<String>, u32, Vec<Ty>)>,
}

/// The Avro format of one sink.
pub struct AvroFormat {
    subjects: Subjects,
    /// The sink's `schema_registry`.
    sink_registry: Option<String>,
    /// The server setting `cdc.schema_registry`.
    server_registry: Option<String>,
    ids: AvroIds,
    tables: HashMap<u32, Version>,
    /// Value schemas of table versions registered since the last `take_registrations`.
    registrations: Vec<Registration>,
}

impl AvroFormat {
    /// The format of a sink whose events go to `subjects`' topics.
    pub fn new(subjects: Subjects, sink_registry: Option<String>, server_registry: Option<String>) -> AvroFormat {
        AvroFormat {
            subjects,
            sink_registry,
            server_registry,
            ids: AvroIds::default(),
            tables: HashMap::new(),
            registrations: Vec::new(),
        }
    }

    /// The registry of a table: the sink's, the table's, the server's.
    fn registry_url(&self, plan: &RelationPlan) -> Result<String, FormatError> {
        let url = configured_registry(self.sink_registry.as_deref(), plan, self.server_registry.as_deref())
            .ok_or_else(|| {
                FormatError::operator(
                    "the avro format needs a schema registry, and none is set: give the sink a \"schema_registry\", \
                     the table a schema_evolution.schema_registry, or set cdc.schema_registry",
                )
            })?;
        checked_registry(&url)
    }

    /// The id of `schema` under `subject` (see [`AvroIds::id`]).
    fn id(&mut self, url: &str, subject: &str, schema: &Schema, plan: &RelationPlan) -> Result<u32, FormatError> {
        self.ids.id(url, subject, schema.canonical_form(), &json_text(schema)?, plan)
    }

    fn version(&mut self, plan: &Arc<RelationPlan>, types: &TypeRegistry) -> Result<&mut Version, FormatError> {
        let oid = plan.relation.oid;
        if !self.tables.get(&oid).is_some_and(|v| Arc::ptr_eq(&v.plan, plan)) {
            let schemas = avro::table_schemas(plan, types, &self.subjects.database).map_err(FormatError::operator)?;
            let schema = avro::parse_schema(&schemas.value).map_err(FormatError::operator)?;
            let url = self.registry_url(plan)?;
            let (value_subject, key_subject) =
                self.subjects.of(&plan.relation.namespace, &plan.relation.name, &schemas.namespace, plan.topic_version);
            let id = self.id(&url, &value_subject, &schema, plan)?;
            if let Some((version, _)) = plan.schema_version {
                self.registrations.push(Registration {
                    table_oid: oid,
                    version,
                    registry: schema_registry::label(&url),
                    subject: value_subject.clone(),
                    schema_id: id,
                });
            }
            self.tables.insert(
                oid,
                Version { plan: plan.clone(), schemas, value_id: id, key_subject, registry: url, keys: Vec::new() },
            );
        }
        Ok(self.tables.get_mut(&oid).expect("inserted above"))
    }

    fn key(&mut self, plan: &Arc<RelationPlan>, types: &TypeRegistry, key: &[u8]) -> Result<Vec<u8>, FormatError> {
        let parsed = avro::Key::parse(key).map_err(FormatError::operator)?;
        let version = self.version(plan, types)?;
        let position = match version.keys.iter().position(|(names, _, _)| parsed.has_names(names)) {
            Some(p) => p,
            None => {
                let names = parsed.names();
                let refs: Vec<&str> = names.iter().map(String::as_str).collect();
                let (json, tys) = version.schemas.key_schema(&refs).map_err(FormatError::operator)?;
                let schema = avro::parse_schema(&json).map_err(FormatError::operator)?;
                let (url, subject) = (version.registry.clone(), version.key_subject.clone());
                let id = self.id(&url, &subject, &schema, plan)?;
                let version = self.tables.get_mut(&plan.relation.oid).expect("made above");
                version.keys.push((names, id, tys));
                version.keys.len() - 1
            }
        };
        let version = self.tables.get(&plan.relation.oid).expect("made above");
        let (_, id, tys) = &version.keys[position];
        avro::frame(*id, |out| parsed.write(tys, out)).map_err(FormatError::operator)
    }
}

impl EventFormat for AvroFormat {
    fn encode(&mut self, plan: &Arc<RelationPlan>, types: &TypeRegistry, event: &mut Event) -> Result<(), FormatError> {
        let version = self.version(plan, types)?;
        let payload = avro::frame(version.value_id, |out| version.schemas.write_value(&event.payload, out))
            .map_err(FormatError::operator)?;
        let key = match &event.key {
            Some(k) => Some(self.key(plan, types, k)?),
            None => None,
        };
        event.payload = payload;
        event.key = key;
        Ok(())
    }

    fn take_registrations(&mut self) -> Vec<Registration> {
        std::mem::take(&mut self.registrations)
    }
}

/// The ids registries gave Avro schemas, for this worker's life.
#[derive(Default)]
pub(crate) struct AvroIds {
    registries: HashMap<String, SchemaRegistry>,
    /// By (registry, subject, the schema as cached: its canonical form, or its whole text when
    /// its properties matter).
    ids: HashMap<(String, String, String), u32>,
}

impl AvroIds {
    /// The id of the Avro schema `text` under `subject`, cached by `cache_text`: registered (or
    /// looked up, without `auto_register`) once per worker, the subject's compatibility level set
    /// from the table's mode first (`NONE` for a version `cdc_force_schema_break` let through).
    pub(crate) fn id(
        &mut self,
        url: &str,
        subject: &str,
        cache_text: String,
        text: &str,
        plan: &RelationPlan,
    ) -> Result<u32, FormatError> {
        let cache_key = (url.to_string(), subject.to_string(), cache_text);
        if let Some(id) = self.ids.get(&cache_key) {
            return Ok(*id);
        }
        let registry = self.registries.entry(url.to_string()).or_insert_with(|| SchemaRegistry::new(url));
        let evolution = &plan.config.schema_evolution;
        let id = if evolution.auto_register {
            let mode = schema_registry::level(evolution.mode);
            let forced = plan.schema_version.is_some_and(|(_, forced)| forced);
            registry.set_compatibility(subject, if forced { "NONE" } else { mode })?;
            let id = registry.register(subject, text);
            if forced {
                registry.set_compatibility(subject, mode)?;
            }
            id?
        } else {
            registry.lookup(subject, text)?.ok_or_else(|| {
                FormatError::operator(format!(
                    "schema registry {}: the schema of this table version is not registered under subject {subject}, \
                     and the table's schema_evolution.auto_register is false: register it, or set auto_register to true",
                    registry.label()
                ))
            })?
        };
        self.ids.insert(cache_key, id);
        Ok(id)
    }
}

/// The registry a table's events use, first that is set: the sink's, the table's
/// `schema_evolution.schema_registry`, the server setting.
fn configured_registry(sink: Option<&str>, plan: &RelationPlan, server: Option<&str>) -> Option<String> {
    sink.or(plan.config.schema_evolution.schema_registry.as_deref()).or(server).map(str::to_string)
}

/// A registry URL checked as `cdc.schema_registry` is (the sink's and the table's were checked
/// when they were set).
fn checked_registry(url: &str) -> Result<String, FormatError> {
    cdc_core::config::registry_url("cdc.schema_registry", url).map_err(|e| FormatError::operator(e.message))
}

/// A schema's JSON text, as registered.
fn json_text(schema: &Schema) -> Result<String, FormatError> {
    serde_json::to_string(schema).map_err(|e| FormatError::operator(format!("cannot write its Avro schema: {e}")))
}
