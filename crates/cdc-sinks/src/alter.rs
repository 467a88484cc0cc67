//! Changing a sink's config in place (`cdc_alter_sink`): the new config from the current one and
//! a patch, which keys changed, and which may not change while the sink keeps its position.
//!
//! Every key that may change takes effect when the sink's worker next reads its catalog: it
//! settles and confirms what it delivered, closes the destination and opens it again with the new
//! config, from the same slot position (`worker::state::sync_sinks`). A few keys are refused: they
//! name the state the sink's guarantee rests on (its checkpoint's place, its fencing id, its
//! delivery guarantee), or apply only when a sink is added.
use cdc_core::{CdcError, CdcResult, ErrorKind};
use serde_json::{Map, Value};

use crate::registry::{parse_config, SinkConfig};

/// Why a key may not change in place, and what to do instead; `None`: it may.
pub fn refused(sink_type: &str, key: &str) -> Option<&'static str> {
    match (sink_type, key) {
        (_, "snapshot_mode") => Some(
            "snapshot_mode applies when a sink is added. For the rows of a table again, SELECT cdc_snapshot(table, sink); \
             a table added to \"tables\" is snapshotted by itself.",
        ),
        (_, "exactly_once") => Some(
            "the delivery guarantee is the sink's from its start (an exactly-once sink's checkpoints begin with it): add a \
             sink with the other guarantee, then drop this one.",
        ),
        ("kafka", "transactional_id") => Some(
            "the transactional id fences the sink's earlier producers; under another id one of them could still commit: \
             add a sink with the new id, then drop this one.",
        ),
        ("table", "table") => Some(
            "the event table holds the sink's events and its checkpoint: add a table sink with the new table, then drop \
             this one.",
        ),
        ("postgres", "state_schema") => Some(
            "the state schema holds the version of every key the sink applied; a new one would apply from nothing: add a \
             sink with the new state_schema, then drop this one.",
        ),
        _ => None,
    }
}

/// Keys whose values may hold a secret: a plan shows that they changed, never their values.
pub const SECRET_KEYS: &[&str] = &["connection_string", "connection", "properties", "headers"];

/// What `cdc_alter_sink` does.
#[derive(Debug, Clone, PartialEq)]
pub struct AlterPlan {
    /// The sink's config once altered.
    pub config: Value,
    /// It, validated.
    pub parsed: SinkConfig,
    /// The keys whose value changes (added, removed or replaced), sorted.
    pub changed: Vec<String>,
}

impl AlterPlan {
    /// The change of each changed key, `{"from": old, "to": new}` (a removed key's `to` and an added
    /// key's `from` are null), with secret values shown as `"(secret)"`.
    pub fn diff(&self, current: &Value) -> Value {
        let mut out = Map::new();
        for key in &self.changed {
            let shown = |v: Option<&Value>| match v {
                None | Some(Value::Null) => Value::Null,
                Some(_) if SECRET_KEYS.contains(&key.as_str()) => Value::String("(secret)".into()),
                Some(v) => v.clone(),
            };
            let change = serde_json::json!({"from": shown(current.get(key)), "to": shown(self.config.get(key))});
            out.insert(key.clone(), change);
        }
        Value::Object(out)
    }
}

/// The plan for patching `current` (a `sink_type` sink's config) with `patch`: each key of the
/// patch replaces the current value, a key set to null is removed, the others stay. Refuses a
/// patch that is not an object (22023), a change of a key [`refused`] names (0A000, with the
/// alternative), and a resulting config its type's parser refuses (its own errors).
pub fn plan(sink_type: &str, current: &Value, patch: &Value) -> CdcResult<AlterPlan> {
    let Some(patch) = patch.as_object() else {
        return Err(CdcError::new(ErrorKind::InvalidParameter, "config must be a JSON object of the keys to change")
            .hint("Give the keys to change, e.g. '{\"topic\": \"orders-v2\"}'; a key set to null is removed."));
    };
    let mut config = current.as_object().cloned().unwrap_or_default();
    for (key, value) in patch {
        if value.is_null() {
            config.remove(key);
        } else {
            config.insert(key.clone(), value.clone());
        }
    }
    let config = Value::Object(config);
    let mut changed: Vec<String> = patch
        .keys()
        .filter(|k| current.get(k.as_str()).filter(|v| !v.is_null()) != config.get(k.as_str()))
        .cloned()
        .collect();
    changed.sort();
    for key in &changed {
        if let Some(why) = refused(sink_type, key) {
            return Err(CdcError::new(
                ErrorKind::FeatureNotSupported,
                format!("config.{key}: a {sink_type} sink's {key} cannot change in place"),
            )
            .hint(why));
        }
    }
    let parsed = parse_config(sink_type, &config)?;
    Ok(AlterPlan { config, parsed, changed })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kafka() -> Value {
        json!({"bootstrap_servers": "k:9092", "topic": "orders", "tables": ["orders"], "properties": {"sasl.password": "p"}})
    }

    #[test]
    fn a_patch_replaces_removes_and_keeps_keys() {
        let p = plan("kafka", &kafka(), &json!({"topic": "orders-v2", "tables": null, "linger_ms": 5})).unwrap();
        assert_eq!(
            p.config,
            json!({"bootstrap_servers": "k:9092", "topic": "orders-v2", "linger_ms": 5, "properties": {"sasl.password": "p"}})
        );
        assert_eq!(p.changed, ["linger_ms", "tables", "topic"]);
        assert_eq!(
            p.diff(&kafka()),
            json!({"linger_ms": {"from": null, "to": 5}, "tables": {"from": ["orders"], "to": null},
                   "topic": {"from": "orders", "to": "orders-v2"}})
        );
    }

    #[test]
    fn the_same_values_change_nothing_and_secrets_are_never_shown() {
        let same = plan("kafka", &kafka(), &json!({"topic": "orders", "acks": null})).unwrap();
        assert!(same.changed.is_empty(), "{:?}", same.changed);
        assert_eq!(same.config, kafka());
        let p = plan("kafka", &kafka(), &json!({"properties": {"sasl.password": "q"}})).unwrap();
        assert_eq!(p.diff(&kafka()), json!({"properties": {"from": "(secret)", "to": "(secret)"}}));
        assert!(!p.diff(&kafka()).to_string().contains("\"q\""));
    }

    #[test]
    fn keys_the_guarantee_rests_on_are_refused_with_the_alternative() {
        for (sink_type, current, key, value) in [
            ("kafka", kafka(), "exactly_once", json!(false)),
            ("kafka", kafka(), "transactional_id", json!("other")),
            ("kafka", kafka(), "snapshot_mode", json!("never")),
            ("table", json!({"table": "ev"}), "table", json!("ev2")),
            ("postgres", json!({"connection": "host=x"}), "state_schema", json!("s2")),
        ] {
            let e = plan(sink_type, &current, &json!({ key: value })).unwrap_err();
            assert_eq!(e.kind.sqlstate(), "0A000", "{key}");
            assert!(e.message.contains(&format!("config.{key}")), "{}", e.message);
            assert!(e.hint.as_deref().is_some_and(|h| h.contains("add a") || h.contains("cdc_snapshot")), "{key}");
        }
        // Unchanged, a refused key is no change.
        assert!(plan("kafka", &json!({"topic": "t", "exactly_once": true}), &json!({"exactly_once": true})).is_ok());
    }

    #[test]
    fn the_new_config_is_validated_as_a_new_sinks_would_be() {
        let e = plan("kafka", &kafka(), &json!({"topci": "x"})).unwrap_err();
        assert_eq!(e.kind.sqlstate(), "22023");
        assert!(e.hint.as_deref().unwrap_or_default().contains("topic"), "{e:?}");
        let e = plan("kafka", &kafka(), &json!(["topic"])).unwrap_err();
        assert_eq!(e.kind.sqlstate(), "22023");
        assert!(plan("kafka", &kafka(), &json!({"format": "protobuf"})).is_ok());
        assert!(plan("webhook", &json!({"url": "http://h/x"}), &json!({"format": "avro"})).is_err());
    }
}
