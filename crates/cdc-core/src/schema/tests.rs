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
         DEFAULT 'unknown'\n2. Force break: SELECT cdc_force_schema_break('orders')"
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
