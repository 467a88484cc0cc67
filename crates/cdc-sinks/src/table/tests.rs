use cdc_core::envelope::Event;
use cdc_core::Lsn;
use serde_json::json;

use super::config::parse;
use super::*;
use crate::testutil::event;

#[derive(Default)]
struct Memory {
    rows: Vec<(u64, u32)>,
    checkpoint: Option<Checkpoint>,
    writes: u32,
}

impl EventStore for Memory {
    fn insert(&mut self, events: &[Event]) -> Result<(), SinkError> {
        self.rows.extend(events.iter().map(|e| (e.commit_lsn.0, e.index)));
        Ok(())
    }
    fn save_checkpoint(&mut self, checkpoint: Checkpoint) -> Result<(), SinkError> {
        self.checkpoint = Some(checkpoint);
        self.writes += 1;
        Ok(())
    }
    fn load_checkpoint(&mut self) -> Result<Option<Checkpoint>, SinkError> {
        Ok(self.checkpoint)
    }
}

#[test]
fn events_and_checkpoint_go_to_the_store_and_empty_units_write_nothing() {
    let mut sink = TableSink::new(Memory::default());
    assert_eq!(sink.open().unwrap(), None);
    assert!(sink.in_source_database() && sink.delivery_mode() == DeliveryMode::ExactlyOnce);
    let stats = sink.send(&[event(10, 1, 1), event(10, 2, 2)]).unwrap();
    assert_eq!(stats, PublishStats { events: 2, bytes: 2 * (8 + 18) });
    sink.flush(Checkpoint { end_lsn: Lsn(11) }).unwrap();
    // A heartbeat's unit: nothing sent, nothing written (its WAL would call for another heartbeat).
    sink.flush(Checkpoint { end_lsn: Lsn(20) }).unwrap();
    assert_eq!(sink.store_mut().writes, 1);
    assert_eq!(sink.open().unwrap(), Some(Checkpoint { end_lsn: Lsn(11) }));
    assert_eq!(sink.store_mut().rows, [(10, 1), (10, 2)]);
    // An aborted unit leaves no count behind for the next flush.
    sink.send(&[event(30, 1, 3)]).unwrap();
    sink.abort();
    sink.flush(Checkpoint { end_lsn: Lsn(40) }).unwrap();
    assert_eq!(sink.store_mut().writes, 1);
}

#[test]
fn config() {
    let c = parse(&json!({"table": "app.\"Events\"", "retention_hours": 24, "retention_events": 1000000})).unwrap();
    assert_eq!((c.table.as_str(), c.retention_hours, c.retention_events), ("app.\"Events\"", 24, Some(1_000_000)));
    assert_eq!(parse(&json!({"table": "e"})).unwrap().retention_hours, config::DEFAULT_RETENTION_HOURS);
    let e = |v| parse(&v).unwrap_err();
    assert_eq!(e(json!({})).message, "config.table is required for a table sink");
    assert_eq!(e(json!({"table": "a;drop table x"})).kind.sqlstate(), "42602");
    assert_eq!(e(json!({"table": "e", "exactly_once": false})).kind.sqlstate(), "22023");
    assert!(parse(&json!({"table": "e", "exactly_once": true})).is_ok());
    assert_eq!(e(json!({"table": "e", "retention_hours": 0})).kind.sqlstate(), "22023");
    assert_eq!(e(json!({"table": "e", "topic": "t"})).kind.sqlstate(), "22023");
    // Other formats are for the Kafka-protocol sinks: refused for a table sink by the registry.
    let proto = crate::registry::parse_config("table", &json!({"table": "e", "format": "protobuf"}));
    assert_eq!(proto.unwrap_err().kind.sqlstate(), "0A000");
}
