//! `regional_routing` (`cdc_enable_multicloud`): each row of a table goes only to the sinks of the
//! route its routing column names.
//!
//! A route is a value of the routing column (its text output, as pgoutput carries it) and the sinks
//! it goes to; `default_route` names the route of rows whose value is none of them (or NULL).
//! Routing takes effect at a WAL position, `routing_lsn`: the LSN of the transactional message the
//! enabling call wrote while it held a SHARE lock on the table, so every change of the table is
//! either before it (delivered as without routing) or after the call committed (routed). Every
//! sink decides by the same rule on the same stream, so restarts and re-reads route alike.
//!
//! For one sink, a change is judged on the route of its before image (a full one: routing sets
//! REPLICA IDENTITY FULL) and of its after image:
//!
//! | change | before in a route of the sink | after in one | published to the sink as |
//! |---|---|---|---|
//! | INSERT, snapshot READ | | yes | itself |
//! | UPDATE | yes | yes | UPDATE |
//! | UPDATE | yes | no | DELETE of the before image (the row left the sink's routes) |
//! | UPDATE | no | yes | INSERT of the after image (it entered them) |
//! | DELETE | yes (or no full before image) | | DELETE |
//! | TRUNCATE | | | TRUNCATE, to every sink of any route |
//!
//! An event's route is the one of the image it carries (the after image; a DELETE's before image).
use std::collections::HashMap;
use std::sync::Arc;

use crate::decode::TupleValue;
use crate::error::CdcResult;
use crate::lsn::Lsn;
use crate::object::{invalid, wrong_type, Obj};

/// The prefix of the transactional logical message a routing change writes (its content: the
/// table's OID in decimal). A worker whose catalog copy has an older `routing_lsn` for the table
/// reads the catalog again before it goes past it.
pub const ROUTING_MESSAGE_PREFIX: &str = "pg_cdc_routing";

/// Keys of `regional_routing`.
pub const ROUTING_KEYS: &[&str] = &["enabled", "routing_column", "routes", "default_route"];

/// A validated, enabled `regional_routing` block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routing {
    /// `routing_column`: the column whose value picks the route.
    pub column: String,
    /// `routes`: each route (a value of the column) and its sinks, in the order of the values.
    pub routes: Vec<(String, Vec<String>)>,
    /// `default_route`: the route of rows whose value names no route (or is NULL); without one,
    /// those rows go to no sink.
    pub default_route: Option<String>,
}

impl Routing {
    /// Every sink a route names, once each, in the order of the routes.
    pub fn sinks(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for (_, sinks) in &self.routes {
            for s in sinks {
                if !out.contains(&s.as_str()) {
                    out.push(s);
                }
            }
        }
        out
    }
}

/// Parses `regional_routing`: `None` when it is absent or `"enabled": false`. `check_column`
/// checks the routing column against the table (when the table is known).
pub fn parse(o: Option<Obj<'_>>, check_column: impl Fn(&str, &str) -> CdcResult<()>) -> CdcResult<Option<Routing>> {
    let Some(o) = o else { return Ok(None) };
    o.check_keys(ROUTING_KEYS)?;
    if o.bool("enabled")? == Some(false) {
        return Ok(None);
    }
    let column = o
        .string("routing_column")?
        .ok_or_else(|| {
            invalid(format!("{} is required", o.child_path("routing_column")))
                .hint("Name the column whose value picks the route, e.g. \"routing_column\": \"customer_region\".")
        })?
        .to_string();
    check_column(&o.child_path("routing_column"), &column)?;
    let routes_path = o.child_path("routes");
    let map = match o.get("routes") {
        Some(serde_json::Value::Object(m)) if !m.is_empty() => m,
        Some(serde_json::Value::Object(_)) | None => {
            return Err(invalid(format!("{routes_path} must name at least one route"))
                .hint("Map values of the routing column to sinks: \"routes\": {\"europe\": [\"eu_sink\"]}."))
        }
        Some(v) => return Err(wrong_type(&routes_path, "a JSON object", v)),
    };
    let parent = Obj { path: routes_path.clone(), map };
    let mut routes = Vec::with_capacity(map.len());
    for value in map.keys() {
        let sinks = parent.strings(value)?.unwrap_or_default();
        if sinks.is_empty() {
            return Err(invalid(format!("{routes_path}.{value} must list at least one sink")));
        }
        routes.push((value.clone(), sinks));
    }
    let default_route = o.string("default_route")?.map(str::to_string);
    if let Some(d) = &default_route {
        if !routes.iter().any(|(v, _)| v == d) {
            return Err(invalid(format!("{}: \"{d}\" is not one of the routes", o.child_path("default_route")))
                .hint(format!("Routes: {}.", routes.iter().map(|(v, _)| v.as_str()).collect::<Vec<_>>().join(", "))));
        }
    }
    Ok(Some(Routing { column, routes, default_route }))
}

/// One sink's view of a table's routing, bound to a relation version.
#[derive(Debug, Clone)]
pub struct RoutePlan {
    /// Index of the routing column in the relation.
    column: usize,
    /// Routing applies to changes after this position (see the module's documentation).
    pub since: Lsn,
    /// The route names (the column's values), in order.
    names: Vec<Arc<str>>,
    /// Route index by value.
    by_value: HashMap<Box<[u8]>, usize>,
    /// The default route's index.
    default: Option<usize>,
    /// Per route: whether this sink is one of its sinks.
    mine: Vec<bool>,
}

impl RoutePlan {
    /// `sink`'s plan for a routing whose column is at `column` in the relation, in force after
    /// `since`.
    pub fn new(routing: &Routing, sink: &str, column: usize, since: Lsn) -> RoutePlan {
        let names: Vec<Arc<str>> = routing.routes.iter().map(|(v, _)| Arc::from(v.as_str())).collect();
        let by_value = routing.routes.iter().enumerate().map(|(i, (v, _))| (v.as_bytes().into(), i)).collect();
        let default = routing.default_route.as_ref().and_then(|d| routing.routes.iter().position(|(v, _)| v == d));
        let mine = routing.routes.iter().map(|(_, sinks)| sinks.iter().any(|s| s == sink)).collect();
        RoutePlan { column, since, names, by_value, default, mine }
    }

    /// Whether a change at `lsn` is routed (after the routing took effect).
    pub fn applies(&self, lsn: Lsn) -> bool {
        lsn > self.since
    }

    /// The route of a row image, if any; `fallback` gives the value an UPDATE left out (an
    /// unchanged TOAST value: the before image's).
    pub fn route_of(&self, row: &[TupleValue<'_>], fallback: Option<&[TupleValue<'_>]>) -> Option<usize> {
        let v = match row.get(self.column) {
            Some(TupleValue::UnchangedToast) => fallback.and_then(|f| f.get(self.column)),
            v => v,
        };
        match v {
            Some(TupleValue::Text(t)) => self.by_value.get(*t).copied().or(self.default),
            _ => self.default,
        }
    }

    /// Whether this sink is one of the route's sinks.
    pub fn carries(&self, route: Option<usize>) -> bool {
        route.is_some_and(|r| self.mine[r])
    }

    /// Whether this sink is in any route (it gets the table's TRUNCATEs).
    pub fn in_any(&self) -> bool {
        self.mine.iter().any(|&m| m)
    }

    /// A route's name.
    pub fn name(&self, route: usize) -> Arc<str> {
        self.names[route].clone()
    }
}

/// One sink's delivered events of one route (a `_cdc_route_offsets` row of the routing in force).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteCountRow {
    /// The sink.
    pub sink: String,
    /// The route.
    pub route: String,
    /// Events delivered since the routing took effect.
    pub events: u64,
    /// Commit to acknowledgement of the last delivered transaction with an event of the route.
    pub lag_ms: Option<u64>,
}

/// What `cdc_multicloud_status` needs of a sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkView {
    /// `_cdc_sinks.state`.
    pub state: String,
    /// WAL its slot has not confirmed, bytes.
    pub lag_bytes: Option<i64>,
}

/// A sink's status in `cdc_multicloud_status`: `healthy` while it runs (or snapshots),
/// `waiting_for_sink` when no sink of that name exists (not added yet, or dropped), else its state.
fn sink_status(view: Option<&SinkView>) -> String {
    match view.map(|v| v.state.as_str()) {
        None => "waiting_for_sink".into(),
        Some("running" | "snapshotting") => "healthy".into(),
        Some(other) => other.into(),
    }
}

/// One routed table's `cdc_multicloud_status` document (see the SQL reference for each figure).
pub fn status_json(
    table: &str,
    routing_lsn: &str,
    routing: &Routing,
    counts: &[RouteCountRow],
    sink: impl Fn(&str) -> Option<SinkView>,
) -> serde_json::Value {
    use serde_json::{json, Map, Value};
    let mut regions = Map::new();
    let (mut divergence, mut max_lag, mut all_healthy) = (0u64, None::<u64>, true);
    for (route, sinks) in &routing.routes {
        let of = |s: &str| counts.iter().find(|c| c.sink == s && &c.route == route);
        let most = sinks.iter().filter_map(|s| of(s)).map(|c| c.events).max().unwrap_or(0);
        let mut per_sink = Map::new();
        for s in sinks {
            let view = sink(s);
            let status = sink_status(view.as_ref());
            all_healthy &= status == "healthy";
            let c = of(s);
            let events = c.map_or(0, |c| c.events);
            divergence += most - events;
            let lag = c.and_then(|c| c.lag_ms);
            if let Some(l) = lag {
                max_lag = Some(max_lag.map_or(l, |m| m.max(l)));
            }
            per_sink.insert(
                s.clone(),
                json!({
                    "status": status,
                    "lag_ms": lag,
                    "lag_bytes": view.and_then(|v| v.lag_bytes),
                    "event_count": events,
                }),
            );
        }
        regions.insert(route.clone(), json!({"event_count": most, "sinks": Value::Object(per_sink)}));
    }
    let sync_status = match (all_healthy, divergence) {
        (false, _) => "degraded",
        (true, 0) => "synchronized",
        (true, _) => "catching_up",
    };
    json!({
        "table": table,
        "routing_column": routing.column,
        "default_route": routing.default_route,
        "routing_since_lsn": routing_lsn,
        "regional_distribution": Value::Object(regions),
        "cross_cloud_consistency": {
            "sync_status": sync_status,
            "max_lag_ms": max_lag,
            "divergence_events": divergence,
        },
    })
}

/// Parses a routing message's content: the table's OID.
pub fn parse_message(content: &[u8]) -> Option<u32> {
    std::str::from_utf8(content).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn routing(v: serde_json::Value) -> CdcResult<Option<Routing>> {
        let root = json!({ "regional_routing": v });
        let o = Obj::root("config", &root).unwrap();
        parse(o.object("regional_routing").unwrap(), |_, c| {
            if c == "customer_region" {
                Ok(())
            } else {
                Err(crate::CdcError::new(crate::ErrorKind::UndefinedColumn, format!("no column {c}")))
            }
        })
    }

    fn seed() -> Routing {
        routing(json!({
            "enabled": true,
            "routing_column": "customer_region",
            "routes": {
                "americas": ["aws_kinesis", "azure_eventhub"],
                "europe": ["azure_eventhub", "gcp_pubsub"],
                "asia": ["gcp_pubsub", "aws_kinesis"]
            },
            "default_route": "europe"
        }))
        .unwrap()
        .unwrap()
    }

    #[test]
    fn parses_the_seed_example() {
        let r = seed();
        assert_eq!(r.column, "customer_region");
        assert_eq!(r.routes.len(), 3);
        assert_eq!(
            r.routes[0],
            ("americas".to_string(), vec!["aws_kinesis".to_string(), "azure_eventhub".to_string()])
        );
        assert_eq!(r.sinks(), vec!["aws_kinesis", "azure_eventhub", "gcp_pubsub"]);
        assert_eq!(r.default_route.as_deref(), Some("europe"));
    }

    #[test]
    fn refuses_bad_blocks() {
        let err = |v: serde_json::Value| routing(v).unwrap_err();
        assert_eq!(err(json!({"routes": {"a": ["s"]}})).kind.sqlstate(), "22023");
        assert_eq!(err(json!({"routing_column": "nope", "routes": {"a": ["s"]}})).kind.sqlstate(), "42703");
        assert!(err(json!({"routing_column": "customer_region", "routes": {}})).message.contains("at least one route"));
        assert!(err(json!({"routing_column": "customer_region", "routes": {"a": []}}))
            .message
            .contains("at least one sink"));
        assert!(err(json!({"routing_column": "customer_region", "routes": {"a": ["s", "s"]}}))
            .message
            .contains("twice"));
        assert!(err(json!({"routing_column": "customer_region", "routes": {"a": ["s"]}, "default_route": "b"}))
            .message
            .contains("not one of the routes"));
        assert!(err(json!({"routing_column": "customer_region", "routes": {"a": ["s"]}, "regions": 1}))
            .message
            .contains("unknown key"));
        assert!(routing(json!({"enabled": false})).unwrap().is_none());
    }

    #[test]
    fn status_sums_divergence_per_route_and_degrades_on_a_sink_not_running() {
        let r = seed();
        let row = |sink: &str, route: &str, events: u64, lag: u64| RouteCountRow {
            sink: sink.into(),
            route: route.into(),
            events,
            lag_ms: Some(lag),
        };
        let counts = vec![
            row("aws_kinesis", "americas", 10, 12),
            row("azure_eventhub", "americas", 7, 45),
            row("azure_eventhub", "europe", 5, 23),
            row("gcp_pubsub", "europe", 5, 34),
        ];
        let running = |_: &str| Some(SinkView { state: "running".into(), lag_bytes: Some(0) });
        let s = status_json("global_customers", "0/10", &r, &counts, running);
        assert_eq!(s["regional_distribution"]["americas"]["event_count"], 10);
        assert_eq!(s["regional_distribution"]["americas"]["sinks"]["azure_eventhub"]["lag_ms"], 45);
        assert_eq!(s["regional_distribution"]["asia"]["event_count"], 0);
        assert_eq!(s["regional_distribution"]["asia"]["sinks"]["gcp_pubsub"]["lag_ms"], serde_json::Value::Null);
        // americas: 10 - 7 behind on azure_eventhub; europe even.
        assert_eq!(s["cross_cloud_consistency"]["divergence_events"], 3);
        assert_eq!(s["cross_cloud_consistency"]["sync_status"], "catching_up");
        assert_eq!(s["cross_cloud_consistency"]["max_lag_ms"], 45);
        let even = vec![row("aws_kinesis", "americas", 7, 1), row("azure_eventhub", "americas", 7, 1)];
        let s = status_json("t", "0/10", &r, &even, running);
        assert_eq!(s["cross_cloud_consistency"]["sync_status"], "synchronized");
        let retrying = |n: &str| {
            (n != "gcp_pubsub").then(|| SinkView {
                state: if n == "aws_kinesis" { "retrying" } else { "running" }.into(),
                lag_bytes: None,
            })
        };
        let s = status_json("t", "0/10", &r, &even, retrying);
        assert_eq!(s["regional_distribution"]["americas"]["sinks"]["aws_kinesis"]["status"], "retrying");
        assert_eq!(s["regional_distribution"]["europe"]["sinks"]["gcp_pubsub"]["status"], "waiting_for_sink");
        assert_eq!(s["cross_cloud_consistency"]["sync_status"], "degraded");
    }

    #[test]
    fn routes_rows_by_value_with_a_default() {
        let r = seed();
        let kinesis = RoutePlan::new(&r, "aws_kinesis", 1, Lsn(100));
        let row = |v: &'static [u8]| vec![TupleValue::Text(b"1"), TupleValue::Text(v)];
        assert_eq!(kinesis.route_of(&row(b"asia"), None), Some(1), "routes are in the order of their values");
        assert!(kinesis.carries(kinesis.route_of(&row(b"asia"), None)));
        assert!(kinesis.carries(kinesis.route_of(&row(b"americas"), None)));
        // Unknown values and NULL take the default route (europe), which kinesis is not in.
        assert_eq!(kinesis.route_of(&row(b"africa"), None), Some(2));
        assert!(!kinesis.carries(kinesis.route_of(&row(b"africa"), None)));
        assert_eq!(kinesis.route_of(&[TupleValue::Text(b"1"), TupleValue::Null], None), Some(2));
        // An unchanged TOAST value is the before image's.
        let old = row(b"asia");
        assert_eq!(kinesis.route_of(&[TupleValue::Text(b"1"), TupleValue::UnchangedToast], Some(&old)), Some(1));
        assert!(!kinesis.applies(Lsn(100)) && kinesis.applies(Lsn(101)));
        assert!(kinesis.in_any());
        assert!(!RoutePlan::new(&r, "other", 1, Lsn(0)).in_any());
        assert_eq!(&*kinesis.name(0), "americas");
        assert_eq!(parse_message(b"16384"), Some(16384));
    }
}
