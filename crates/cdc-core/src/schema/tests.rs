use super::*;

fn f(attnum: i16, name: &str, type_sql: &str, type_oid: u32, typmod: i32, not_null: bool) -> Field {
    Field {
        attnum,
        name: name.into(),
        type_sql: type_sql.into(),
        type_oid,
        typmod,
        not_null,
        default: None,
        missing: None,
    }
}

/// The product description's orders table.
fn orders() -> Vec<Field> {
    vec![
        f(1, "order_id", "character varying(50)", 1043, 54, true),
        f(2, "customer_id", "character varying(50)", 1043, 54, false),
        f(3, "total", "numeric(10,2)", 1700, (10 << 16 | 2) + 4, false),
        f(4, "status", "character varying(20)", 1043, 24, false),
    ]
}

fn with(mut fields: Vec<Field>, extra: Field) -> Vec<Field> {
    fields.push(extra);
    fields
}

#[test]
fn adding_a_column_with_a_default_is_fully_compatible() {
    let mut shipping = f(5, "shipping_method", "character varying(50)", 1043, 54, false);
    shipping.default = Some("'standard'::character varying".into());
    shipping.missing = Some("standard".into());
    let changes = diff(&orders(), &with(orders(), shipping));
    assert_eq!(changes.len(), 1);
    assert_eq!(
        changes[0].to_json(),
        json!({"type": "ADD_FIELD", "field": "shipping_method", "field_type": "character varying(50)",
               "required": false, "default": "standard"})
    );
    let found = issues("orders", &changes);
    assert!(found.is_empty(), "{found:?}");
    assert_eq!(compatibility(&found), "FULL");
}

#[test]
fn a_required_column_without_default_breaks_backward_with_the_seed_warning() {
    let changes = diff(&orders(), &with(orders(), f(5, "required_field", "character varying(50)", 1043, 54, true)));
    let found = issues("orders", &changes);
    assert_eq!(compatibility(&found), "FORWARD");
    assert!(violations(Mode::Forward, &found).is_empty());
    let v = violations(Mode::Full, &found);
    assert_eq!(v.len(), 1);
    let (message, detail, hint) = break_report("orders", 2, &v);
    assert_eq!(message, "Schema change is not backward compatible");
    assert_eq!(
        detail,
        "- Field 'required_field' is required but has no default\n- Existing consumers using schema v2 will fail"
    );
    assert_eq!(
        hint,
        "Options:\n1. Add default value: ALTER TABLE orders ADD COLUMN required_field character varying(50) \
         DEFAULT 'unknown'\n2. Force break: SELECT cdc_force_schema_break('orders')\n\
         3. Create new topic: SELECT cdc_create_version_topic('orders', 3)"
    );
}

#[test]
fn a_required_column_with_a_computed_default_has_no_avro_default() {
    let mut at = f(5, "created_at", "timestamp with time zone", 1184, -1, true);
    at.default = Some("now()".into());
    assert!(!at.has_default());
    // PostgreSQL's value for the older rows (attmissingval) is a constant.
    at.missing = Some("2026-12-03 10:00:00+00".into());
    assert!(at.has_default());
}

#[test]
fn literal_defaults() {
    for (expr, want) in [
        ("'standard'::character varying", Some("standard")),
        ("'it''s'::text", Some("it's")),
        ("'x::y'::text", Some("x::y")),
        ("0", Some("0")),
        ("'-1.5'::numeric", Some("-1.5")),
        ("true", Some("true")),
        ("now()", None),
        ("nextval('orders_id_seq'::regclass)", None),
        ("('a'::text || 'b'::text)", None),
    ] {
        assert_eq!(literal(expr).as_deref(), want, "{expr}");
    }
}

#[test]
fn dropping_renaming_and_nullability() {
    let old = orders();
    // Drop a nullable column: compatible both ways (an old reader fills in null).
    let dropped: Vec<Field> = old.iter().filter(|c| c.name != "status").cloned().collect();
    assert_eq!(compatibility(&issues("orders", &diff(&old, &dropped))), "FULL");
    // Drop the required one: an old reader has no value for it.
    let dropped: Vec<Field> = old.iter().filter(|c| c.name != "order_id").cloned().collect();
    assert_eq!(compatibility(&issues("orders", &diff(&old, &dropped))), "BACKWARD");
    // A rename is one change, not a drop and an add (same attnum).
    let mut renamed = old.clone();
    renamed[3].name = "state".into();
    let changes = diff(&old, &renamed);
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].to_json(), json!({"type": "RENAME_FIELD", "field": "state", "from": "status"}));
    assert_eq!(compatibility(&issues("orders", &changes)), "BACKWARD");
    // SET NOT NULL breaks backward, DROP NOT NULL forward.
    let mut required = old.clone();
    required[1].not_null = true;
    assert_eq!(compatibility(&issues("orders", &diff(&old, &required))), "FORWARD");
    assert_eq!(compatibility(&issues("orders", &diff(&required, &old))), "BACKWARD");
}

#[test]
fn type_changes() {
    type Type<'a> = (&'a str, u32, i32);
    let cases: [(Type, Type, &str); 9] = [
        (("integer", 23, -1), ("bigint", 20, -1), "BACKWARD"),
        (("bigint", 20, -1), ("integer", 23, -1), "FORWARD"),
        (("real", 700, -1), ("double precision", 701, -1), "BACKWARD"),
        (("character varying(20)", 1043, 24), ("character varying(50)", 1043, 54), "FULL"),
        (("character varying(20)", 1043, 24), ("text", 25, -1), "FULL"),
        (("character varying(50)", 1043, 54), ("character varying(20)", 1043, 24), "FORWARD"),
        (("numeric(10,2)", 1700, (10 << 16 | 2) + 4), ("numeric(12,2)", 1700, (12 << 16 | 2) + 4), "FULL"),
        (("numeric(10,2)", 1700, (10 << 16 | 2) + 4), ("numeric(10,3)", 1700, (10 << 16 | 3) + 4), "NONE"),
        (("text", 25, -1), ("integer", 23, -1), "NONE"),
    ];
    for ((a, ao, am), (b, bo, bm), want) in cases {
        let old = vec![f(1, "c", a, ao, am, false)];
        let new = vec![f(1, "c", b, bo, bm, false)];
        assert_eq!(compatibility(&issues("t", &diff(&old, &new))), want, "{a} -> {b}");
    }
}

#[test]
fn modes_forbid_their_directions() {
    let changes = diff(&orders(), &with(orders(), f(5, "r", "integer", 23, -1, true)));
    let found = issues("orders", &changes);
    assert_eq!(violations(Mode::Backward, &found).len(), 1);
    assert_eq!(violations(Mode::Full, &found).len(), 1);
    assert!(violations(Mode::Forward, &found).is_empty());
    // A new encoding breaks both ways: one line, both directions named.
    let old = vec![f(1, "c", "text", 25, -1, false)];
    let new = vec![f(1, "c", "integer", 23, -1, false)];
    let found = issues("t", &diff(&old, &new));
    let (message, detail, _) = break_report("t", 1, &violations(Mode::Full, &found));
    assert_eq!(message, "Schema change is not backward or forward compatible");
    assert_eq!(detail.lines().count(), 2);
    assert!(violations(Mode::None, &found).is_empty());
    for m in ["backward", "forward", "full", "none"] {
        assert_eq!(Mode::parse(m).unwrap().as_str(), m);
    }
    assert_eq!(Mode::parse("FULL"), None);
}

#[test]
fn a_default_change_is_recorded_and_compatible() {
    let old = orders();
    let mut new = old.clone();
    new[3].default = Some("'new'::character varying".into());
    let changes = diff(&old, &new);
    assert_eq!(
        changes[0].to_json(),
        json!({"type": "CHANGE_DEFAULT", "field": "status", "from": null, "to": "'new'::character varying"})
    );
    assert_eq!(compatibility(&issues("orders", &changes)), "FULL");
}

#[test]
fn fields_round_trip_through_json() {
    let mut c = f(5, "shipping_method", "character varying(50)", 1043, 54, false);
    c.default = Some("'standard'::character varying".into());
    c.missing = Some("standard".into());
    for field in [c, f(1, "id", "integer", 23, -1, true)] {
        assert_eq!(Field::from_json(&field.to_json()), Some(field));
    }
    assert_eq!(Field::from_json(&json!({"name": "x"})), None);
}

#[test]
fn expressions_follow_a_rename() {
    for (text, want) in [
        ("status != 'draft'", Some("state != 'draft'")),
        ("STATUS = 'x' AND Status <> 'y'", Some("state = 'x' AND state <> 'y'")),
        ("\"status\" = 'status'", Some("state = 'status'")),
        ("lower(status) = 'a'\n  OR status IS NULL", Some("lower(state) = 'a'\n  OR state IS NULL")),
        // A function of that name, a quoted other spelling, and a qualified name are not the column.
        ("status(1) > 0", None),
        ("\"Status\" = 1", None),
        ("t.status = 1", None),
        ("amount > 10", None),
    ] {
        assert_eq!(rename_in_expression(text, "status", "state").as_deref(), want, "{text}");
    }
    // The new name is quoted when it must be.
    assert_eq!(rename_in_expression("status = 1", "status", "Order State").as_deref(), Some("\"Order State\" = 1"));
    assert_eq!(rename_in_expression("status = 1", "status", "order").as_deref(), Some("\"order\" = 1"));
    assert_eq!(rename_in_expression("total * 2", "total", "total_v2").as_deref(), Some("total_v2 * 2"));
}

#[test]
fn configs_follow_a_rename() {
    let config = json!({
        "include_columns": ["id", "email", "status"],
        "key_columns": ["id"],
        "partition_key": "email",
        "compliance": {"redact_pii": true, "pii_columns": ["email"]},
        "filter": "email IS NOT NULL",
        "regional_routing": {"routing_column": "email", "routes": {"email": ["s"]}},
        "transformations": [{"type": "mask", "column": "email", "method": "hash"},
                            {"type": "compute", "name": "domain", "expression": "split_part(email, '@', 2)"},
                            {"type": "enrich", "source_column": "email", "lookup_table": "people",
                             "lookup_column": "email", "add_columns": ["email_verified"]}]
    });
    let renamed = rename_in_config(&config, "email", "mail").unwrap();
    assert_eq!(
        renamed,
        json!({
            "include_columns": ["id", "mail", "status"],
            "key_columns": ["id"],
            "partition_key": "mail",
            "compliance": {"redact_pii": true, "pii_columns": ["mail"]},
            "filter": "mail IS NOT NULL",
            // The routes' values are the column's values, not column names: unchanged.
            "regional_routing": {"routing_column": "mail", "routes": {"email": ["s"]}},
            "transformations": [{"type": "mask", "column": "mail", "method": "hash"},
                                {"type": "compute", "name": "domain", "expression": "split_part(mail, '@', 2)"},
                                // The lookup table's columns are another table's: unchanged.
                                {"type": "enrich", "source_column": "mail", "lookup_table": "people",
                                 "lookup_column": "email", "add_columns": ["email_verified"]}]
        })
    );
    assert_eq!(rename_in_config(&config, "amount", "total"), None);
}

fn lsn(n: u64) -> crate::Lsn {
    crate::Lsn(n)
}

#[test]
fn a_relation_of_any_version_finds_the_names_of_now() {
    let v1 = vec![f(1, "id", "integer", 23, -1, true), f(2, "email", "text", 25, -1, false)];
    let mut v2 = v1.clone();
    v2[1].name = "mail".into();
    let mut v3 = v2.clone();
    v3.push(f(3, "note", "text", 25, -1, false));
    let h = History::new(vec![(lsn(300), v3), (lsn(100), v1), (lsn(200), v2)]);
    // A change written under version 1 (after it, before the rename) names "email": it is "mail" now.
    assert_eq!(h.aliases(lsn(150), &["id", "email"]), Ok(vec![None, Some("mail".into())]));
    // Under version 2 and 3 the names are those of now.
    assert_eq!(h.aliases(lsn(250), &["id", "mail"]), Ok(vec![]));
    assert_eq!(h.aliases(lsn(350), &["id", "mail", "note"]), Ok(vec![]));
    // Older than the history: taken as it is.
    assert_eq!(h.aliases(lsn(50), &["id", "whatever"]), Ok(vec![]));
    // A column the version in force lacks: the history is behind the stream (read it again).
    assert_eq!(h.aliases(lsn(350), &["id", "mail", "note", "extra"]), Err(Behind { column: "extra".into() }));
    assert_eq!(h.aliases(lsn(150), &["id", "mail"]), Err(Behind { column: "mail".into() }));
    // A column dropped since keeps its name.
    let mut v4 = h.versions.last().unwrap().fields.clone();
    v4.retain(|c| c.name != "mail");
    let mut versions = h.versions.clone();
    versions.push(Version { lsn: lsn(400), number: 4, forced: true, own_topic: false, fields: v4 });
    let h = History::from_versions(versions);
    assert_eq!(h.aliases(lsn(150), &["id", "email"]), Ok(vec![]));
    // The version in force at a change: the last recorded before it.
    assert_eq!(h.version_at(lsn(50)), None);
    assert_eq!(h.version_at(lsn(150)).map(|v| v.number), Some(1));
    assert_eq!(h.version_at(lsn(400)).map(|v| v.number), Some(3));
    assert_eq!(h.version_at(lsn(401)).map(|v| (v.number, v.forced)), Some((4, true)));
    assert!(History::default().aliases(lsn(1), &["x"]).unwrap().is_empty());
}

#[test]
fn a_version_with_a_topic_of_its_own_takes_the_versions_after_it_along() {
    let fields = orders();
    let v = |n: i32, own_topic: bool| Version {
        lsn: lsn(n as u64 * 100),
        number: n,
        forced: false,
        own_topic,
        fields: fields.clone(),
    };
    let h = History::from_versions(vec![v(1, false), v(2, false), v(3, true), v(4, false), v(5, true), v(6, false)]);
    assert_eq!(h.topic_version_at(lsn(50)), None, "older than the history");
    assert_eq!(h.topic_version_at(lsn(150)), None);
    assert_eq!(h.topic_version_at(lsn(250)), None);
    assert_eq!(h.topic_version_at(lsn(300)), None, "a change at the DDL's own position is older than it");
    assert_eq!(h.topic_version_at(lsn(301)), Some(3));
    assert_eq!(h.topic_version_at(lsn(450)), Some(3), "a later compatible version stays on its topic");
    assert_eq!(h.topic_version_at(lsn(550)), Some(5));
    assert_eq!(h.topic_version_at(lsn(9999)), Some(5));
    assert!(!h.behind(6, lsn(650)) && h.behind(7, lsn(650)), "version 7's message after what was read");
    assert!(!h.behind(7, lsn(550)), "a history started again after the message is not behind it");
    assert!(!History::default().behind(2, lsn(1)));
    assert_eq!(version_topic("cdc.shop.public.orders", 3), "cdc.shop.public.orders.v3");
    assert_eq!(parse_version_message(b"16384 3"), Some((16384, 3)));
    assert_eq!(parse_version_message(b"16384"), None);
    assert_eq!(parse_version_message(b"x 3"), None);
    assert_eq!(
        topic_segments(&[(1, false), (2, false), (3, true), (4, false)]),
        vec![(None, vec![1, 2]), (Some(3), vec![3, 4])]
    );
    assert_eq!(topic_segments(&[(1, false)]), vec![(None, vec![1])]);
}

fn resolve(t: &str) -> Option<(u32, i32, String)> {
    match t.to_lowercase().as_str() {
        "varchar(10)" => Some((1043, 14, "character varying(10)".into())),
        "varchar(50)" => Some((1043, 54, "character varying(50)".into())),
        "int" | "integer" => Some((23, -1, "integer".into())),
        "bigint" => Some((20, -1, "bigint".into())),
        "text" => Some((25, -1, "text".into())),
        _ => None,
    }
}

#[test]
fn a_proposed_change_is_applied_to_the_columns_of_now() {
    let now = orders();
    // The product description's check: a required field without default.
    let after = propose(&now, "ADD COLUMN priority VARCHAR(10) NOT NULL", &resolve).unwrap();
    let changes = diff(&now, &after);
    assert_eq!(
        changes[0].to_json(),
        json!({"type": "ADD_FIELD", "field": "priority", "field_type": "character varying(10)", "required": true})
    );
    let found = issues("orders", &changes);
    assert_eq!(found[0].title, "Required field without default");
    assert_eq!(
        found[0].fix,
        "Add default value: ALTER TABLE orders ADD COLUMN priority character varying(10) DEFAULT 'unknown'"
    );
    // With a default it passes.
    let after = propose(&now, "ADD COLUMN priority VARCHAR(10) DEFAULT 'normal' NOT NULL", &resolve).unwrap();
    assert!(issues("orders", &diff(&now, &after)).is_empty());
    assert_eq!(after[4].default_value().as_deref(), Some("normal"));
    // Several at once, every kind.
    let after = propose(
        &now,
        "DROP COLUMN customer_id, RENAME COLUMN status TO state, ALTER COLUMN total SET NOT NULL, \
         ALTER COLUMN \"order_id\" TYPE text, ADD COLUMN n int",
        &resolve,
    )
    .unwrap();
    let kinds: Vec<Value> = diff(&now, &after).iter().map(|c| c.to_json()["type"].clone()).collect();
    assert_eq!(kinds, ["DROP_FIELD", "CHANGE_TYPE", "SET_REQUIRED", "RENAME_FIELD", "ADD_FIELD"]);
    assert_eq!(after.last().unwrap().attnum, 5, "a new column's attnum follows the last one");
}

#[test]
fn a_proposed_change_that_is_not_a_column_change_is_refused() {
    let now = orders();
    let state = |change: &str| propose(&now, change, &resolve).unwrap_err().kind.sqlstate();
    assert_eq!(state("ADD CONSTRAINT c CHECK (total > 0)"), "22023");
    assert_eq!(state("RENAME TO other"), "22023");
    assert_eq!(state("ADD COLUMN x int; DROP TABLE orders"), "22023");
    assert_eq!(state("ADD COLUMN g int GENERATED ALWAYS AS (1) STORED"), "22023");
    assert_eq!(state("ADD COLUM x int"), "42601");
    assert_eq!(state("DROP COLUMN nope"), "42703");
    assert_eq!(state("ADD COLUMN x widget"), "42704");
    assert_eq!(state("ADD COLUMN status text"), "22023");
}

#[test]
fn a_consumer_reads_the_version_of_its_last_event_and_knows_if_it_can_go_on() {
    let v = [(1, lsn(100), None), (2, lsn(200), Some("FULL")), (3, lsn(300), Some("BACKWARD"))];
    // Its last event was written under version 1: versions 2 (FULL) and 3 (BACKWARD only) follow;
    // an old schema cannot read version 3's events.
    assert_eq!(reader_status(&v, lsn(150)), Some((1, false)));
    assert_eq!(reader_status(&v, lsn(250)), Some((2, false)));
    assert_eq!(reader_status(&v, lsn(350)), Some((3, true)));
    // Older than the history: the first version.
    assert_eq!(reader_status(&v, lsn(50)), Some((1, false)));
    let forward = [(1, lsn(100), None), (2, lsn(200), Some("FORWARD"))];
    assert_eq!(reader_status(&forward, lsn(150)), Some((1, true)));
    assert_eq!(reader_status(&[], lsn(1)), None);
}
