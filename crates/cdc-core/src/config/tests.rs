use serde_json::json;

use super::*;
use crate::types::TypeKind;

fn shape() -> TableShape {
    TableShape {
        display_name: "orders".into(),
        columns: ["order_id", "customer_id", "total", "status", "updated_at"].map(String::from).to_vec(),
        primary_key: vec!["order_id".into()],
        replica_identity_index: vec![],
        replica_identity: b'd',
        generated_columns: vec!["total_with_tax".into()],
        column_kinds: vec![TypeKind::Text, TypeKind::Text, TypeKind::Numeric, TypeKind::Text, TypeKind::TimestampTz],
    }
}

fn err(v: serde_json::Value) -> CdcError {
    parse_capture_config(&v, &shape()).unwrap_err()
}

#[test]
fn the_seed_config_parses() {
    let c = parse_capture_config(
        &json!({"include_columns": ["order_id", "customer_id", "total", "status", "updated_at"],
                "key_columns": ["order_id"], "include_before_image": true, "include_transaction_info": true,
                "capture_mode": "all_changes", "operations": ["INSERT", "update", "DELETE"]}),
        &shape(),
    )
    .unwrap();
    assert!(c.before_image && c.include_transaction_info);
    assert_eq!(c.key_columns, ["order_id"]);
    assert!(!c.operations.truncate && c.operations.update);
    // Defaults: every operation, key from the primary key.
    let d = parse_capture_config(&json!({}), &shape()).unwrap();
    assert_eq!(d.operations, Operations::ALL);
    assert_eq!(d.key_columns, ["order_id"]);
    assert!(d.includes("status"));
}

#[test]
fn unknown_keys_suggest_the_closest() {
    let e = err(json!({"include_colums": ["order_id"]}));
    assert_eq!(e.kind.sqlstate(), "22023");
    assert_eq!(e.message, "unknown key \"include_colums\" in config");
    assert_eq!(e.hint.as_deref(), Some("Did you mean \"include_columns\"?"));
    let e = err(json!({"zzz": 1}));
    assert!(e.hint.unwrap().starts_with("Valid keys: capture_mode"));
    let e = err(json!({"compliance": {"redact": true}}));
    assert_eq!(e.message, "unknown key \"redact\" in config.compliance");
}

#[test]
fn wrong_types_name_the_path() {
    assert_eq!(err(json!([])).message, "config must be a JSON object, not array");
    assert_eq!(err(json!({"operations": ["INSERT", 3]})).message, "config.operations[1] must be a string, not number");
    assert_eq!(err(json!({"operations": ["INSERT", ""]})).message, "config.operations[1] must not be an empty string");
    assert_eq!(err(json!({"filter_expression": 5})).message, "config.filter_expression must be a string, not number");
    assert_eq!(
        err(json!({"include_before_image": "yes"})).message,
        "config.include_before_image must be true or false, not string"
    );
    assert_eq!(
        err(json!({"include_columns": "order_id"})).message,
        "config.include_columns must be an array of strings, not string"
    );
    assert_eq!(err(json!({"operations": ["UPSERT"]})).message, "config.operations[0]: unknown operation \"UPSERT\"");
    assert_eq!(err(json!({"operations": []})).kind, ErrorKind::InvalidParameter);
    assert!(err(json!({"exactly_once": {"checkpoint_interval_ms": -5}}))
        .message
        .starts_with("config.exactly_once.checkpoint_interval_ms must be an integer"));
    assert_eq!(
        err(json!({"key_columns": ["order_id", "order_id"]})).message,
        "config.key_columns[1]: \"order_id\" is listed twice"
    );
}

#[test]
fn columns_must_exist() {
    let e = err(json!({"include_columns": ["order_id", "totl"]}));
    assert_eq!(e.kind.sqlstate(), "42703");
    assert_eq!(e.message, "config.include_columns[1]: column \"totl\" of table orders does not exist");
    assert_eq!(e.hint.as_deref(), Some("Did you mean \"total\"?"));
    assert_eq!(err(json!({"key_columns": ["x); DROP TABLE orders; --"]})).kind.sqlstate(), "42703");
    assert_eq!(err(json!({"partition_key": "region"})).kind.sqlstate(), "42703");
    assert_eq!(err(json!({"exclude_columns": ["nope"]})).kind.sqlstate(), "42703");
    let g = err(json!({"include_columns": ["total_with_tax"]}));
    assert_eq!(g.kind.sqlstate(), "0A000");
    assert!(g.message.contains("generated column"), "{}", g.message);
}

#[test]
fn aliases_together_are_refused() {
    let e = err(json!({"before_image": true, "include_before_image": true}));
    assert_eq!(e.kind.sqlstate(), "22023");
    let e = err(json!({"filter": "a", "filter_expression": "b"}));
    assert_eq!(e.kind.sqlstate(), "22023");
    assert!(parse_capture_config(&json!({"before_image": true}), &shape()).unwrap().before_image);
}

#[test]
fn tables_without_a_key() {
    let mut s = shape();
    s.primary_key.clear();
    let e = parse_capture_config(&json!({}), &s).unwrap_err();
    assert_eq!(e.kind.sqlstate(), "55000");
    assert!(e.hint.unwrap().contains("\"operations\": [\"INSERT\"]"));
    assert!(parse_capture_config(&json!({"operations": ["INSERT"]}), &s).is_ok());
    assert!(parse_capture_config(&json!({"operations": ["INSERT", "TRUNCATE"]}), &s).is_ok());
    assert!(parse_capture_config(&json!({"include_before_image": true}), &s).unwrap().key_columns.is_empty());
    // A primary key with REPLICA IDENTITY NOTHING identifies nothing.
    let mut nothing = shape();
    nothing.replica_identity = b'n';
    assert_eq!(parse_capture_config(&json!({}), &nothing).unwrap_err().kind.sqlstate(), "55000");
    s.replica_identity = b'i';
    s.replica_identity_index = vec!["customer_id".into()];
    assert_eq!(parse_capture_config(&json!({}), &s).unwrap().key_columns, ["customer_id"]);
}

#[test]
fn enrich_is_checked_against_the_table_and_the_lookup() {
    let e = |extra: Value| {
        let mut t = json!({"type": "enrich", "source_column": "customer_id", "lookup_table": "customers",
                           "lookup_column": "id", "add_columns": ["segment"]});
        for (k, v) in extra.as_object().unwrap() {
            t[k] = v.clone();
        }
        json!({"transformations": [t], "partition_key": "segment"})
    };
    let cfg = parse_capture_config(&e(json!({})), &shape()).unwrap();
    assert_eq!(
        cfg.enrich,
        [Enrich {
            source_column: "customer_id".into(),
            lookup_table: "customers".into(),
            lookup_column: "id".into(),
            add_columns: vec!["segment".into()]
        }]
    );
    assert_eq!(cfg.partition_key.as_deref(), Some("segment"), "partition_key may name an added column");
    assert_eq!(err(e(json!({"source_column": "nope"}))).kind.sqlstate(), "42703");
    assert_eq!(err(e(json!({"add_columns": []}))).kind.sqlstate(), "22023");
    assert_eq!(err(e(json!({"add_columns": ["status"]}))).kind.sqlstate(), "22023", "collides with a column");
    assert_eq!(err(e(json!({"add_columns": ["a", "a"]}))).kind.sqlstate(), "22023");
    assert_eq!(err(e(json!({"lookup_table": "x; DROP TABLE y"}))).kind.sqlstate(), "42602");
    assert_eq!(err(e(json!({"cache": true}))).kind.sqlstate(), "22023");
    let mut missing = e(json!({}));
    missing["transformations"][0].as_object_mut().unwrap().remove("lookup_column");
    assert_eq!(err(missing).kind.sqlstate(), "22023");

    // The lookup side: the key must be the lookup table's whole replica identity key.
    let spec = &cfg.enrich[0];
    let mut lookup = TableShape {
        display_name: "customers".into(),
        columns: vec!["id".into(), "segment".into()],
        primary_key: vec!["id".into()],
        replica_identity_index: vec![],
        replica_identity: b'd',
        generated_columns: vec![],
        column_kinds: vec![],
    };
    check_lookup("t", spec, &lookup).unwrap();
    lookup.primary_key = vec!["id".into(), "segment".into()];
    assert_eq!(check_lookup("t", spec, &lookup).unwrap_err().kind.sqlstate(), "55000");
    lookup.replica_identity = b'i';
    lookup.replica_identity_index = vec!["id".into()];
    check_lookup("t", spec, &lookup).unwrap();
    lookup.replica_identity = b'n';
    assert_eq!(check_lookup("t", spec, &lookup).unwrap_err().kind.sqlstate(), "55000");
    lookup.replica_identity = b'd';
    lookup.primary_key = vec!["id".into()];
    lookup.columns.pop();
    assert_eq!(check_lookup("t", spec, &lookup).unwrap_err().kind.sqlstate(), "42703");
}

#[test]
fn off_values_are_accepted() {
    let ok = json!({"include_query_text": false, "include_user_context": false, "transformations": [],
                    "compliance": {"redact_pii": false}, "schema_evolution": {}});
    assert!(parse_capture_config(&ok, &shape()).is_ok());
    assert_eq!(err(json!({"capture_mode": "everything"})).kind.sqlstate(), "22023");
}

#[test]
fn schema_evolution() {
    use crate::schema::Mode;
    // The product description's block.
    let c = parse_capture_config(
        &json!({"schema_evolution": {"enabled": true, "compatibility_mode": "full",
                                     "schema_registry": "http://schema-registry:8081/", "auto_register": true}}),
        &shape(),
    )
    .unwrap();
    assert_eq!(
        c.schema_evolution,
        SchemaEvolution {
            mode: Mode::Full,
            enforce: false,
            schema_registry: Some("http://schema-registry:8081".into()),
            auto_register: true
        }
    );
    // Without the block: backward, warned about.
    assert_eq!(parse_capture_config(&json!({}), &shape()).unwrap().schema_evolution, SchemaEvolution::default());
    let off = parse_capture_config(&json!({"schema_evolution": {"enabled": false}}), &shape()).unwrap();
    assert_eq!(off.schema_evolution.mode, Mode::None);
    let enforced = parse_capture_config(&json!({"schema_evolution": {"enforce": true}}), &shape()).unwrap();
    assert!(enforced.schema_evolution.enforce);
    assert_eq!(enforced.schema_evolution.mode, Mode::Backward);
    for bad in [
        json!({"schema_evolution": {"compatibility_mode": "FULL"}}),
        json!({"schema_evolution": {"compatibility_mode": "transitive"}}),
        json!({"schema_evolution": {"schema_registry": "schema-registry:8081"}}),
        json!({"schema_evolution": {"enabled": false, "enforce": true}}),
        json!({"schema_evolution": {"compatibility_mode": "none", "enforce": true}}),
        json!({"schema_evolution": {"enforce": "yes"}}),
        json!({"schema_evolution": {"compatability_mode": "full"}}),
    ] {
        assert_eq!(err(bad.clone()).kind.sqlstate(), "22023", "{bad}");
    }
}

#[test]
fn compliance_and_masks() {
    use crate::redact::Method;
    let c = parse_capture_config(
        &json!({"compliance": {"redact_pii": true, "pii_columns": ["customer_id", "status"], "audit_retention_days": 2555},
                "transformations": [{"type": "mask", "column": "total", "method": "remove"},
                                    {"type": "mask", "column": "updated_at", "method": "hash"}]}),
        &shape(),
    )
    .unwrap();
    assert_eq!(c.redaction("customer_id"), Some(Method::Tokenize), "tokenize is the default method");
    assert_eq!(c.redaction("updated_at"), Some(Method::Hash));
    assert!(!c.includes("total") && c.includes("status"), "remove leaves the column out");
    assert_eq!(c.compliance.as_ref().unwrap().audit_retention_days, Some(2555));
    // Off: listed columns are not touched.
    let off = parse_capture_config(&json!({"compliance": {"redact_pii": false, "pii_columns": ["status"]}}), &shape());
    assert!(off.unwrap().redactions.is_empty());

    let bad = [
        (json!({"compliance": {"redact_pii": true}}), "22023", "lists no column"),
        (json!({"compliance": {"redact_pii": true, "pii_columns": ["ssn"]}}), "42703", "\"ssn\""),
        (
            json!({"compliance": {"redact_pii": true, "pii_columns": ["status"], "redaction_method": "encrypt"}}),
            "22023",
            "unknown method",
        ),
        (json!({"transformations": [{"type": "mask", "column": "status"}]}), "22023", "method is required"),
        (
            json!({"transformations": [{"type": "mask", "column": "status", "method": "hash", "extra": 1}]}),
            "22023",
            "unknown key",
        ),
        (
            json!({"transformations": [{"type": "mask", "column": "order_id", "method": "remove"}]}),
            "22023",
            "message key",
        ),
        (json!({"transformations": [{"type": "mask", "column": "order_id", "method": "redact"}]}), "22023", "same key"),
        (
            json!({"partition_key": "status", "transformations": [{"type": "mask", "column": "status", "method": "remove"}]}),
            "22023",
            "message key",
        ),
        (
            json!({"compliance": {"redact_pii": true, "pii_columns": ["status"]},
                "transformations": [{"type": "mask", "column": "status", "method": "hash"}]}),
            "22023",
            "one method per column",
        ),
        (json!({"transformations": [{"type": "pivot"}]}), "22023", "unknown transformation"),
        (json!({"transformations": [{"column": "status"}]}), "22023", "type is required"),
        (json!({"transformations": {"type": "mask"}}), "22023", "must be an array"),
    ];
    for (cfg, state, text) in bad {
        let e = err(cfg.clone());
        assert_eq!(e.kind.sqlstate(), state, "{cfg}: {e}");
        assert!(e.message.contains(text), "{cfg}: {}", e.message);
    }
    // Hiding a key column with tokenize keeps the key usable.
    let tok = json!({"transformations": [{"type": "mask", "column": "order_id", "method": "tokenize"}]});
    assert!(parse_capture_config(&tok, &shape()).is_ok());
}

#[test]
fn capture_modes() {
    let audit = parse_capture_config(&json!({"capture_mode": "full_audit"}), &shape()).unwrap();
    assert_eq!(audit.mode, CaptureMode::FullAudit);
    assert!(audit.before_image && audit.include_transaction_info, "an audit has before images and transaction info");
    for (cfg, text) in [
        (json!({"capture_mode": "full_audit", "exclude_columns": ["status"]}), "leaves columns out"),
        (json!({"capture_mode": "full_audit", "operations": ["INSERT"]}), "INSERT, UPDATE and DELETE"),
        (json!({"capture_mode": "full_audit", "include_before_image": false}), "before image"),
        (json!({"capture_mode": "full_audit", "filter": "status <> 'x'"}), "drops changes"),
        (json!({"capture_mode": "filtered"}), "needs a filter"),
    ] {
        let e = err(cfg.clone());
        assert_eq!(e.kind.sqlstate(), "22023", "{cfg}");
        assert!(e.message.contains(text), "{cfg}: {}", e.message);
    }
    assert!(parse_capture_config(
        &json!({"capture_mode": "full_audit", "operations": ["INSERT", "UPDATE", "DELETE", "TRUNCATE"]}),
        &shape()
    )
    .is_ok());
}

#[test]
fn filters_and_computed_columns_are_checked_against_the_table() {
    let c = parse_capture_config(
        &json!({"capture_mode": "filtered", "filter": " status != 'draft' ",
                "transformations": [{"type": "compute", "name": "total_cents", "expression": "total * 100"}]}),
        &shape(),
    )
    .unwrap();
    assert_eq!(c.filter.as_deref(), Some("status != 'draft'"));
    assert_eq!(c.computed, [("total_cents".to_string(), "total * 100".to_string())]);
    for (cfg, state, text) in [
        (json!({"filter": "status = 'a' AND"}), "42601", "config.filter: "),
        (json!({"filter_expression": "x = 1; DROP TABLE orders"}), "42601", "config.filter_expression: "),
        (json!({"filter": "statuss = 'a'"}), "42703", "statuss"),
        (json!({"filter": "total > (SELECT 1)"}), "0A000", "subquer"),
        (json!({"filter": "count(*) > 1"}), "42803", "aggregate"),
        (json!({"filter": "random() > 0.5"}), "42P17", "immutable"),
        (json!({"filter": "other.status = 'a'"}), "42P01", "other"),
        (json!({"filter": "status > 5"}), "42883", "text > integer"),
        (json!({"filter": "total + 1"}), "42804", "boolean"),
        (json!({"capture_mode": "full_audit", "filter": "total > 1"}), "22023", "full_audit"),
        (
            json!({"transformations": [{"type": "compute", "name": "status", "expression": "1"}]}),
            "22023",
            "already a column",
        ),
        (json!({"transformations": [{"type": "compute", "name": "x"}]}), "22023", "expression is required"),
        (json!({"transformations": [{"type": "compute", "name": "x", "expression": "nope + 1"}]}), "42703", "nope"),
        (
            json!({"compliance": {"redact_pii": true, "pii_columns": ["customer_id"]},
                "transformations": [{"type": "compute", "name": "x", "expression": "upper(customer_id)"}]}),
            "22023",
            "hidden",
        ),
    ] {
        let e = err(cfg.clone());
        assert_eq!(e.kind.sqlstate(), state, "{cfg}: {e}");
        assert!(e.message.contains(text), "{cfg}: {}", e.message);
    }
}

#[test]
fn stored_configs_skip_table_checks() {
    let c = parse_stored_capture_config(&json!({"include_columns": ["gone"]}), vec!["id".into()]).unwrap();
    assert_eq!(c.key_columns, ["id"]);
}

#[test]
fn qualified_names() {
    for ok in ["orders", "public.orders", "db.public.orders", "\"Mixed Case\"", "s.\"a\"\"b\"", "é_t$1", "_x"] {
        assert!(is_qualified_name(ok), "{ok}");
    }
    for bad in ["", "o1; drop table o1", "a..b", ".a", "a.", "\"\"", "\"open", "1abc", "a b", "a.b.c.d"] {
        assert!(!is_qualified_name(bad), "{bad}");
    }
}

#[test]
fn exactly_once_in_the_capture_config() {
    // The seed's block, as written: recorded, and it bounds the delivery unit.
    let c = parse_capture_config(&json!({"exactly_once": {"enabled": true, "checkpoint_interval_ms": 1000}}), &shape())
        .unwrap();
    assert_eq!(c.checkpoint_interval_ms, Some(1000));
    assert!(c.exactly_once_required);
    // Turning it off cannot take effect on a table: refused, and the hint names the sink setting.
    let e = err(json!({"exactly_once": {"enabled": false, "checkpoint_interval_ms": 1000}}));
    assert_eq!(e.kind.sqlstate(), "22023");
    assert!(e.message.starts_with("config.exactly_once.enabled = false cannot take effect"), "{}", e.message);
    assert!(e.hint.as_deref().unwrap_or_default().contains("\"exactly_once\": false"), "{:?}", e.hint);
    assert_eq!(err(json!({"exactly_once": {"checkpoint_interval_ms": 0}})).kind.sqlstate(), "22023");
    assert_eq!(err(json!({"exactly_once": {"checkpiont_interval_ms": 10}})).kind.sqlstate(), "22023");
}

#[test]
fn the_smallest_checkpoint_interval_wins() {
    let with = |ms: Option<u32>| {
        let mut c = CaptureConfig::with_key(vec![]);
        c.checkpoint_interval_ms = ms;
        c
    };
    let (a, b, none) = (with(Some(1000)), with(Some(250)), with(None));
    assert_eq!(checkpoint_interval(None, [&a, &b, &none]), Some(250));
    assert_eq!(checkpoint_interval(Some(100), [&a, &b]), Some(100));
    assert_eq!(checkpoint_interval(Some(5000), [&a]), Some(1000));
    assert_eq!(checkpoint_interval(None, [&none]), None);
}

#[test]
fn tokenizing_configs_are_known() {
    let tok = parse_capture_config(&json!({"compliance": {"redact_pii": true, "pii_columns": ["status"]}}), &shape());
    assert!(tok.unwrap().tokenizes(), "tokenize is the default method");
    let mask = parse_capture_config(
        &json!({"transformations": [{"type": "mask", "column": "status", "method": "tokenize"}]}),
        &shape(),
    );
    assert!(mask.unwrap().tokenizes());
    let hash = parse_capture_config(
        &json!({"compliance": {"redact_pii": true, "pii_columns": ["status"], "redaction_method": "hash"}}),
        &shape(),
    );
    assert!(!hash.unwrap().tokenizes());
}

#[test]
fn full_audit_needs_insert_update_and_delete_whatever_the_list_looks_like() {
    for ops in [json!(["INSERT", "UPDATE", "TRUNCATE"]), json!(["insert", "INSERT", "UPDATE"]), json!(["INSERT"])] {
        let e = err(json!({"capture_mode": "full_audit", "operations": ops}));
        assert!(e.message.contains("must include INSERT, UPDATE and DELETE"), "{ops}: {}", e.message);
    }
    let ok = json!({"capture_mode": "full_audit", "operations": ["delete", "UPDATE", "insert", "TRUNCATE"]});
    assert!(parse_capture_config(&ok, &shape()).is_ok());
}

#[test]
fn pii_columns_need_a_word_on_redact_pii() {
    let e = err(json!({"compliance": {"pii_columns": ["status"]}}));
    assert_eq!(e.kind.sqlstate(), "22023");
    assert!(e.hint.as_deref().unwrap_or_default().contains("\"redact_pii\": true"));
    // A config recorded by an earlier version keeps its meaning (listed, not hidden).
    let stored = parse_stored_capture_config(&json!({"compliance": {"pii_columns": ["status"]}}), vec![]).unwrap();
    assert!(stored.redactions.is_empty());
}

#[test]
fn a_computed_column_may_not_read_a_column_left_out_of_the_images() {
    let e = err(json!({"exclude_columns": ["status"],
                       "transformations": [{"type": "compute", "name": "s", "expression": "upper(status)"}]}));
    assert!(e.message.contains("column \"status\" is hidden by the config"), "{}", e.message);
    let e = err(json!({"include_columns": ["order_id", "total"],
                       "transformations": [{"type": "compute", "name": "s", "expression": "upper(status)"}]}));
    assert!(e.message.contains("column \"status\" is hidden by the config"), "{}", e.message);
    assert!(parse_capture_config(
        &json!({"include_columns": ["order_id", "status"],
                "transformations": [{"type": "compute", "name": "s", "expression": "upper(status)"}]}),
        &shape()
    )
    .is_ok());
}

#[test]
fn key_columns_outside_the_replica_identity_need_before_images() {
    let e = err(json!({"key_columns": ["customer_id"]}));
    assert_eq!(e.kind.sqlstate(), "55000");
    assert!(e.message.contains("not part of the replica identity of orders"), "{}", e.message);
    for ok in [
        json!({"key_columns": ["customer_id"], "include_before_image": true}),
        json!({"key_columns": ["customer_id"], "operations": ["INSERT"]}),
        json!({"key_columns": ["order_id"]}),
    ] {
        assert!(parse_capture_config(&ok, &shape()).is_ok(), "{ok}");
    }
}

#[test]
fn a_table_without_identity_may_capture_truncates_alone() {
    let mut keyless = shape();
    keyless.primary_key.clear();
    assert!(parse_capture_config(&json!({"operations": ["TRUNCATE"]}), &keyless).is_ok());
    assert!(parse_capture_config(&json!({"operations": ["INSERT", "TRUNCATE"]}), &keyless).is_ok());
    assert_eq!(
        parse_capture_config(&json!({"operations": ["DELETE"]}), &keyless).unwrap_err().kind.sqlstate(),
        "55000"
    );
}
