//! Declarative pipelines (`cdc_reconcile`, `cdc_export_spec`): the spec's form, the sinks' part of
//! the plan, and the placeholder that stands for a secret the live config keeps.
//!
//! A spec is the whole desired state of one database's capture:
//!
//! ```json
//! {"tables": [{"name": "public.orders", "config": {"operations": ["INSERT", "UPDATE"]}}],
//!  "sinks":  [{"name": "orders_kafka", "type": "kafka", "config": {"topic": "orders"}}],
//!  "force_drop": {"sinks": ["old_sink"], "tables": ["public.legacy"]}}
//! ```
//!
//! Lists, not objects keyed by name: PostgreSQL's jsonb keeps only the last of two equal keys, so
//! an object could not tell that an object was declared twice. What the spec leaves out is dropped,
//! behind the guards the shell applies (`src/api/reconcile.rs`); `force_drop` names what may be
//! dropped past them.
use std::collections::HashSet;

use cdc_core::object::{invalid, wrong_type, Obj};
use cdc_core::{CdcError, CdcResult, ErrorKind};
use serde_json::{Map, Value};

use crate::alter::{self, AlterPlan, SECRET_KEYS};
use crate::registry::{parse_config, sink_types, SinkConfig};

/// The value `cdc_export_spec` writes for a key that may hold a secret, and that `cdc_reconcile`
/// reads as "keep the live sink's value".
pub const UNCHANGED: &str = "(unchanged)";

/// A captured table the spec declares.
#[derive(Debug, Clone, PartialEq)]
pub struct TableSpec {
    /// Its JSON path (`spec.tables[2]`).
    pub path: String,
    /// Its name as SQL writes it (`orders`, `public.orders`).
    pub name: String,
    /// Its capture config (`{}` when left out).
    pub config: Value,
}

/// A sink the spec declares.
#[derive(Debug, Clone, PartialEq)]
pub struct SinkSpec {
    /// Its JSON path (`spec.sinks[0]`).
    pub path: String,
    /// Its name.
    pub name: String,
    /// Its type (`kafka`, `table`, ...).
    pub sink_type: String,
    /// Its config, secrets possibly [`UNCHANGED`].
    pub config: Value,
}

/// A spec, its form checked.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Spec {
    /// The captured tables, in the spec's order.
    pub tables: Vec<TableSpec>,
    /// The sinks, in the spec's order.
    pub sinks: Vec<SinkSpec>,
    /// Sinks that may be dropped although their slots hold undelivered changes.
    pub force_drop_sinks: Vec<String>,
    /// Tables (as SQL writes them) that may stop being captured although a sink carries them.
    pub force_drop_tables: Vec<String>,
}

/// `e` with the path and name of the spec element it is about in front of its message.
pub fn at(path: &str, name: &str, e: CdcError) -> CdcError {
    CdcError { message: format!("{path} (\"{name}\"): {}", e.message), ..e }
}

fn duplicate(path: &str, what: &str, name: &str, first: &str) -> CdcError {
    CdcError::new(ErrorKind::DuplicateObject, format!("{path}: {what} \"{name}\" is declared twice (first at {first})"))
        .hint("Declare each object once.")
}

/// Checks a spec's form: its keys, every element's keys and types, names given once, sink types
/// that exist and their configs (each as its type's parser checks it; a secret given as
/// [`UNCHANGED`] is checked against the live value later). Errors name the element's path.
pub fn parse(spec: &Value) -> CdcResult<Spec> {
    let root = Obj::root("spec", spec)?;
    root.check_keys(&["tables", "sinks", "force_drop"])?;
    let mut out = Spec::default();
    let list = |key: &str| -> CdcResult<&Vec<Value>> {
        match root.get(key) {
            None => Ok(empty()),
            Some(Value::Array(a)) => Ok(a),
            Some(v) => Err(wrong_type(&root.child_path(key), "an array of objects", v)),
        }
    };
    let mut seen: Vec<(String, String)> = Vec::new();
    for (i, t) in list("tables")?.iter().enumerate() {
        let o = Obj::root(&format!("spec.tables[{i}]"), t)?;
        o.check_keys(&["name", "config"])?;
        let name = o.string("name")?.ok_or_else(|| invalid(format!("{}.name is missing", o.path)))?;
        let config = match o.get("config") {
            None => Value::Object(Map::new()),
            Some(c @ Value::Object(_)) => c.clone(),
            Some(v) => return Err(wrong_type(&o.child_path("config"), "a JSON object", v)),
        };
        if let Some((_, first)) = seen.iter().find(|(n, _)| n == name) {
            return Err(duplicate(&o.path, "table", name, first));
        }
        seen.push((name.to_string(), o.path.clone()));
        out.tables.push(TableSpec { path: o.path.clone(), name: name.to_string(), config });
    }
    let mut seen: Vec<(String, String)> = Vec::new();
    for (i, s) in list("sinks")?.iter().enumerate() {
        let o = Obj::root(&format!("spec.sinks[{i}]"), s)?;
        o.check_keys(&["name", "type", "config"])?;
        let name = o.string("name")?.ok_or_else(|| invalid(format!("{}.name is missing", o.path)))?;
        if name.len() > 200 {
            return Err(invalid(format!("{}.name must be 1 to 200 characters long", o.path)));
        }
        let sink_type = o.string("type")?.ok_or_else(|| invalid(format!("{}.type is missing", o.path)))?;
        if !sink_types().contains(&sink_type) {
            return Err(at(
                &o.path,
                name,
                invalid(format!("unknown sink type \"{sink_type}\""))
                    .hint(format!("Sink types: {}.", sink_types().join(", "))),
            ));
        }
        let config = match o.get("config") {
            Some(c @ Value::Object(_)) => c.clone(),
            None => return Err(invalid(format!("{}.config is missing", o.path))),
            Some(v) => return Err(wrong_type(&o.child_path("config"), "a JSON object", v)),
        };
        if let Some((_, first)) = seen.iter().find(|(n, _)| n == name) {
            return Err(duplicate(&o.path, "sink", name, first));
        }
        seen.push((name.to_string(), o.path.clone()));
        // Its form now, with each secret it keeps as a stand-in the parser accepts (the live value
        // is checked when the plan resolves it).
        parse_config(sink_type, &without_placeholders(&config)).map_err(|e| at(&o.path, name, e))?;
        out.sinks.push(SinkSpec {
            path: o.path.clone(),
            name: name.to_string(),
            sink_type: sink_type.to_string(),
            config,
        });
    }
    if let Some(f) = root.object("force_drop")? {
        f.check_keys(&["sinks", "tables"])?;
        out.force_drop_sinks = f.strings("sinks")?.unwrap_or_default();
        out.force_drop_tables = f.strings("tables")?.unwrap_or_default();
        for (i, name) in out.force_drop_sinks.iter().enumerate() {
            if out.sinks.iter().any(|s| &s.name == name) {
                return Err(invalid(format!(
                    "spec.force_drop.sinks[{i}]: sink \"{name}\" is declared in spec.sinks, so it is not dropped"
                ))
                .hint("force_drop names objects the spec leaves out; remove one of the two."));
            }
        }
        for (i, name) in out.force_drop_tables.iter().enumerate() {
            if out.tables.iter().any(|t| &t.name == name) {
                return Err(invalid(format!(
                    "spec.force_drop.tables[{i}]: table \"{name}\" is declared in spec.tables, so it is not dropped"
                ))
                .hint("force_drop names objects the spec leaves out; remove one of the two."));
            }
        }
    }
    Ok(out)
}

fn empty() -> &'static Vec<Value> {
    static EMPTY: Vec<Value> = Vec::new();
    &EMPTY
}

/// `config` without the secret keys given as [`UNCHANGED`], for a check of its other keys.
fn without_placeholders(config: &Value) -> Value {
    let mut c = config.as_object().cloned().unwrap_or_default();
    c.retain(|k, v| !(SECRET_KEYS.contains(&k.as_str()) && v.as_str() == Some(UNCHANGED)));
    // A postgres sink needs its connection, an Event Hubs sink a connection string: left out
    // here only because the live one stays, so the check stands in a value of the same form.
    for (key, stand_in) in [
        ("connection", "host=localhost dbname=stand_in"),
        ("connection_string", "Endpoint=sb://stand-in.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=s"),
    ] {
        if config.get(key).and_then(Value::as_str) == Some(UNCHANGED) {
            c.insert(key.to_string(), Value::String(stand_in.to_string()));
        }
    }
    Value::Object(c)
}

/// The config a sink's export shows: every key that may hold a secret is [`UNCHANGED`].
pub fn export_config(config: &Value) -> Value {
    let mut c = config.as_object().cloned().unwrap_or_default();
    for (k, v) in c.iter_mut() {
        if SECRET_KEYS.contains(&k.as_str()) && !v.is_null() {
            *v = Value::String(UNCHANGED.to_string());
        }
    }
    Value::Object(c)
}

/// `desired` with each key given as [`UNCHANGED`] replaced by the live config's value; an error
/// when there is none (a new sink, or a key the live sink does not have).
pub fn resolve_secrets(spec: &SinkSpec, live: Option<&Value>) -> CdcResult<Value> {
    let mut c = spec.config.as_object().cloned().unwrap_or_default();
    for key in SECRET_KEYS {
        if c.get(*key).and_then(Value::as_str) != Some(UNCHANGED) {
            continue;
        }
        match live.and_then(|l| l.get(*key)).filter(|v| !v.is_null()) {
            Some(v) => {
                c.insert(key.to_string(), v.clone());
            }
            None => {
                let why = if live.is_some() { "the live sink has none" } else { "the sink does not exist yet" };
                return Err(at(
                    &spec.path,
                    &spec.name,
                    invalid(format!("config.{key} is \"{UNCHANGED}\", which keeps the live value, but {why}"))
                        .hint(format!("Give config.{key} its value.")),
                ));
            }
        }
    }
    Ok(Value::Object(c))
}

/// What reconciling does to one sink the spec declares.
#[derive(Debug, Clone, PartialEq)]
pub enum SinkAction {
    /// Added with this config (secrets resolved).
    Create {
        /// Its config.
        config: Value,
        /// It, validated.
        parsed: SinkConfig,
    },
    /// Its config changed in place: `patch` for `cdc_alter_sink`, and the plan it makes.
    Alter {
        /// The keys to set, and those to remove (null).
        patch: Value,
        /// What the patch does.
        plan: AlterPlan,
    },
    /// Nothing changes.
    Nothing {
        /// Its config, validated.
        parsed: SinkConfig,
    },
}

impl SinkAction {
    /// The sink's config once reconciled, validated.
    pub fn parsed(&self) -> &SinkConfig {
        match self {
            SinkAction::Create { parsed, .. } | SinkAction::Nothing { parsed } => parsed,
            SinkAction::Alter { plan, .. } => &plan.parsed,
        }
    }
}

/// The action for a declared sink, given the live one of that name (its type and config): create
/// it, alter the keys that differ (a key the spec leaves out is removed), or nothing. A change of
/// type, or of a key `cdc_alter_sink` refuses, is refused (0A000) with the alternative.
pub fn plan_sink(spec: &SinkSpec, live: Option<(&str, &Value)>) -> CdcResult<SinkAction> {
    let desired = resolve_secrets(spec, live.map(|(_, c)| c))?;
    let Some((live_type, live_config)) = live else {
        let parsed = parse_config(&spec.sink_type, &desired).map_err(|e| at(&spec.path, &spec.name, e))?;
        return Ok(SinkAction::Create { config: desired, parsed });
    };
    if live_type != spec.sink_type {
        return Err(at(
            &spec.path,
            &spec.name,
            CdcError::new(
                ErrorKind::FeatureNotSupported,
                format!("the sink is a {live_type} sink and the spec makes it a {} sink: a sink's type cannot change", spec.sink_type),
            )
            .hint("Declare the new sink under another name; the old one is dropped once the spec leaves it out (force_drop when its slot holds undelivered changes)."),
        ));
    }
    let mut patch = desired.as_object().cloned().unwrap_or_default();
    if let Some(live) = live_config.as_object() {
        // A key the spec leaves out is removed, unless it cannot change in place (it applies when a
        // sink is added, or the sink's guarantee rests on it): that one keeps the live value.
        for key in live.keys() {
            if !patch.contains_key(key) && alter::refused(live_type, key).is_none() {
                patch.insert(key.clone(), Value::Null);
            }
        }
    }
    let patch = Value::Object(patch);
    let plan = alter::plan(live_type, live_config, &patch).map_err(|e| at(&spec.path, &spec.name, e))?;
    if plan.changed.is_empty() {
        return Ok(SinkAction::Nothing { parsed: plan.parsed });
    }
    // Only the keys that change, for cdc_alter_sink.
    let keep: HashSet<&String> = plan.changed.iter().collect();
    let patch = Value::Object(
        patch
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, _)| keep.contains(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    );
    Ok(SinkAction::Alter { patch, plan })
}

/// The top-level keys of two capture configs that differ, `{key: {"from", "to"}}` (a key missing on
/// one side is null there).
pub fn config_diff(from: &Value, to: &Value) -> Value {
    let (empty_a, empty_b) = (Map::new(), Map::new());
    let a = from.as_object().unwrap_or(&empty_a);
    let b = to.as_object().unwrap_or(&empty_b);
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut out = Map::new();
    for k in keys {
        let (x, y) = (a.get(k).filter(|v| !v.is_null()), b.get(k).filter(|v| !v.is_null()));
        if x != y {
            out.insert(
                k.clone(),
                serde_json::json!({"from": x.cloned().unwrap_or(Value::Null), "to": y.cloned().unwrap_or(Value::Null)}),
            );
        }
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(v: Value) -> CdcError {
        parse(&v).unwrap_err()
    }

    #[test]
    fn a_spec_parses_with_defaults() {
        let s = parse(&json!({
            "tables": [{"name": "public.orders"}, {"name": "items", "config": {"operations": ["INSERT"]}}],
            "sinks": [{"name": "t", "type": "table", "config": {"table": "ev"}}],
            "force_drop": {"sinks": ["old"]}
        }))
        .unwrap();
        assert_eq!(s.tables[0].config, json!({}));
        assert_eq!(s.tables[1].path, "spec.tables[1]");
        assert_eq!(s.sinks[0].sink_type, "table");
        assert_eq!(s.force_drop_sinks, vec!["old".to_string()]);
        assert_eq!(parse(&json!({})).unwrap(), Spec::default());
    }

    #[test]
    fn bad_input_names_its_path() {
        let e = err(json!({"tables": [], "sink": []}));
        assert_eq!(e.kind, ErrorKind::InvalidParameter);
        assert!(e.message.contains("unknown key \"sink\" in spec"), "{}", e.message);
        assert_eq!(e.hint.as_deref(), Some("Did you mean \"sinks\"?"));
        let e = err(json!({"sinks": [{"name": "a", "type": "table", "config": {"table": "x"}, "confg": {}}]}));
        assert!(e.message.contains("unknown key \"confg\" in spec.sinks[0]"), "{}", e.message);
        let e = err(json!({"sinks": [{"name": "a", "type": "kafak", "config": {}}]}));
        assert!(e.message.starts_with("spec.sinks[0] (\"a\"): unknown sink type \"kafak\""), "{}", e.message);
        let e = err(json!({"sinks": [{"name": "a", "type": "kafka", "config": {"topic": "t", "linger": 1}}]}));
        assert_eq!(e.kind, ErrorKind::InvalidParameter);
        assert!(e.message.starts_with("spec.sinks[0] (\"a\"): "), "{}", e.message);
        let e = err(json!({"tables": [{"config": {}}]}));
        assert!(e.message.contains("spec.tables[0].name is missing"), "{}", e.message);
        let e = err(json!({"tables": {"orders": {}}}));
        assert!(e.message.contains("spec.tables must be an array of objects"), "{}", e.message);
    }

    #[test]
    fn two_objects_with_one_name_are_refused() {
        let e = err(json!({"tables": [{"name": "orders"}, {"name": "items"}, {"name": "orders"}]}));
        assert_eq!(e.kind, ErrorKind::DuplicateObject);
        assert!(e.message.contains("spec.tables[2]: table \"orders\" is declared twice (first at spec.tables[0])"));
        let t = json!({"name": "s", "type": "table", "config": {"table": "e"}});
        let e = err(json!({"sinks": [t.clone(), t]}));
        assert_eq!(e.kind, ErrorKind::DuplicateObject);
        assert!(e.message.contains("spec.sinks[1]: sink \"s\""), "{}", e.message);
    }

    #[test]
    fn force_drop_of_a_declared_object_is_refused() {
        let e = err(json!({"tables": [{"name": "a"}], "force_drop": {"tables": ["a"]}}));
        assert!(e.message.contains("spec.force_drop.tables[0]"), "{}", e.message);
    }

    #[test]
    fn export_hides_secrets_and_reconcile_keeps_them() {
        let live = json!({"topic": "t", "properties": {"sasl.password": "p"}});
        let exported = export_config(&live);
        assert_eq!(exported, json!({"topic": "t", "properties": UNCHANGED}));
        let spec =
            SinkSpec { path: "spec.sinks[0]".into(), name: "k".into(), sink_type: "kafka".into(), config: exported };
        assert_eq!(resolve_secrets(&spec, Some(&live)).unwrap(), live);
        assert!(matches!(plan_sink(&spec, Some(("kafka", &live))).unwrap(), SinkAction::Nothing { .. }));
        let e = resolve_secrets(&spec, None).unwrap_err();
        assert!(e.message.contains("config.properties is \"(unchanged)\""), "{}", e.message);
        assert!(e.message.contains("does not exist yet"), "{}", e.message);
        let e = resolve_secrets(&spec, Some(&json!({"topic": "t"}))).unwrap_err();
        assert!(e.message.contains("the live sink has none"), "{}", e.message);
    }

    #[test]
    fn a_placeholder_connection_passes_the_form_check() {
        let s = parse(&json!({"sinks": [{"name": "p", "type": "postgres", "config": {"connection": UNCHANGED}}]}));
        assert!(s.is_ok(), "{s:?}");
    }

    #[test]
    fn a_sink_is_created_altered_or_left() {
        let spec = |config: Value| SinkSpec {
            path: "spec.sinks[0]".into(),
            name: "k".into(),
            sink_type: "kafka".into(),
            config,
        };
        let live = json!({"topic": "t", "linger_ms": 5});
        assert!(matches!(plan_sink(&spec(live.clone()), None).unwrap(), SinkAction::Create { .. }));
        assert!(matches!(plan_sink(&spec(live.clone()), Some(("kafka", &live))).unwrap(), SinkAction::Nothing { .. }));
        match plan_sink(&spec(json!({"topic": "t2"})), Some(("kafka", &live))).unwrap() {
            SinkAction::Alter { patch, plan } => {
                assert_eq!(patch, json!({"topic": "t2", "linger_ms": null}));
                assert_eq!(plan.changed, vec!["linger_ms".to_string(), "topic".to_string()]);
                assert_eq!(plan.config, json!({"topic": "t2"}));
            }
            other => panic!("{other:?}"),
        }
        // Left out, a key that cannot change in place keeps its live value.
        let once = json!({"topic": "t", "exactly_once": true, "snapshot_mode": "never"});
        assert!(matches!(
            plan_sink(&spec(json!({"topic": "t"})), Some(("kafka", &once))).unwrap(),
            SinkAction::Nothing { .. }
        ));
        let e = plan_sink(&spec(json!({"topic": "t", "exactly_once": false})), Some(("kafka", &live))).unwrap_err();
        assert_eq!(e.kind, ErrorKind::FeatureNotSupported);
        assert!(e.message.starts_with("spec.sinks[0] (\"k\"): config.exactly_once"), "{}", e.message);
        let e = plan_sink(&spec(live.clone()), Some(("table", &json!({"table": "x"})))).unwrap_err();
        assert_eq!(e.kind, ErrorKind::FeatureNotSupported);
        assert!(e.message.contains("type cannot change"), "{}", e.message);
    }

    #[test]
    fn config_diff_names_the_keys_that_differ() {
        let d = config_diff(&json!({"a": 1, "b": [1], "c": null}), &json!({"b": [1, 2], "d": true}));
        assert_eq!(
            d,
            json!({"a": {"from": 1, "to": null}, "b": {"from": [1], "to": [1, 2]}, "d": {"from": null, "to": true}})
        );
        assert_eq!(config_diff(&json!({"a": 1}), &json!({"a": 1})), json!({}));
    }
}
