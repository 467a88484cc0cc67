//! Where Kafka consumer groups are on a sink's topic: each group's committed offset per
//! partition, and the last event it consumed there (for `cdc_schema_history`'s consumers: the
//! schema version in force at that event). Read with the sink's own connection settings; nothing
//! is committed and no group is joined.
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::Message;
use rdkafka::{Offset, TopicPartitionList};

use super::config::KafkaSinkConfig;
use super::{client_configs, with_signals_blocked};

/// One group's position on one partition of the topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    /// The consumer group.
    pub group: String,
    /// The partition.
    pub partition: i32,
    /// Its committed offset: the next message it will read.
    pub committed: i64,
    /// The partition's end (high watermark).
    pub end: i64,
    /// The value of the last message before `committed` (the last event it consumed; `None` when
    /// none could be read: control records only, or the message is gone).
    pub last: Option<Vec<u8>>,
    /// No message follows `committed` (only transaction markers, if anything): it read them all.
    pub caught_up: bool,
}

/// The positions of every consumer group that committed offsets on `topic`; at most `max_groups`
/// groups are asked (the answer says when more were left out). Errors are the client's, as text.
pub fn positions(
    cfg: &KafkaSinkConfig,
    default_bootstrap: &str,
    topic: &str,
    timeout: Duration,
    max_groups: usize,
) -> Result<(Vec<Position>, usize), String> {
    let (base, _) = client_configs(cfg, default_bootstrap, "pg_cdc-schema-history", None);
    let deadline = Instant::now() + timeout;
    let left = || deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(100));
    let consumer = |group: &str| -> Result<BaseConsumer, String> {
        let mut c: ClientConfig = base.clone();
        c.set("group.id", group).set("enable.auto.commit", "false").set("isolation.level", "read_committed");
        with_signals_blocked(|| c.create()).map_err(|e| format!("cannot create a Kafka client: {e}"))
    };
    let reader = consumer(&format!("pg_cdc-schema-history-{}", std::process::id()))?;
    let metadata =
        reader.fetch_metadata(Some(topic), left()).map_err(|e| format!("cannot read topic {topic}'s metadata: {e}"))?;
    let partitions: Vec<i32> = metadata.topics().iter().flat_map(|t| t.partitions().iter().map(|p| p.id())).collect();
    let groups = reader.fetch_group_list(None, left()).map_err(|e| format!("cannot list the consumer groups: {e}"))?;
    let mut names: Vec<String> = groups
        .groups()
        .iter()
        .filter(|g| g.protocol_type().is_empty() || g.protocol_type() == "consumer")
        .map(|g| g.name().to_string())
        .filter(|n| !n.starts_with("pg_cdc-"))
        .collect();
    names.sort();
    let skipped = names.len().saturating_sub(max_groups);
    names.truncate(max_groups);
    let mut ends = std::collections::HashMap::new();
    for &p in &partitions {
        let (low, end) = reader
            .fetch_watermarks(topic, p, left())
            .map_err(|err| format!("cannot read topic {topic}'s offsets: {err}"))?;
        ends.insert(p, (low, end));
    }
    // Each group's committed offsets need a client of that group: asked 8 at a time.
    let mut committed: Vec<(String, i32, i64)> = Vec::new();
    for chunk in names.chunks(8) {
        let asks: Vec<_> = chunk
            .iter()
            .map(|group| {
                let (group, c, partitions, topic) =
                    (group.clone(), consumer(group), partitions.clone(), topic.to_string());
                let wait = left();
                std::thread::spawn(move || -> Result<Vec<(String, i32, i64)>, String> {
                    let mut tpl = TopicPartitionList::new();
                    for p in partitions {
                        tpl.add_partition(&topic, p);
                    }
                    let got = c?
                        .committed_offsets(tpl, wait)
                        .map_err(|e| format!("cannot read group {group}'s offsets: {e}"))?;
                    Ok(got
                        .elements()
                        .iter()
                        .filter_map(|e| match e.offset() {
                            Offset::Offset(at) if at > 0 => Some((group.clone(), e.partition(), at)),
                            _ => None,
                        })
                        .collect())
                })
            })
            .collect();
        for ask in asks {
            committed.extend(ask.join().map_err(|_| "a Kafka client thread failed".to_string())??);
        }
    }
    let mut out = Vec::new();
    for (group, partition, at) in committed {
        let (low, end) = ends.get(&partition).copied().unwrap_or((0, 0));
        let (last, caught_up) =
            if at >= end { (None, true) } else { around(&reader, topic, partition, at, low, end, deadline) };
        out.push(Position { group, partition, committed: at, end, last, caught_up });
    }
    Ok((out, skipped))
}

/// The value of the last message before offset `at`, and whether no message follows it (a
/// transactional topic has control records between and after messages, which the client skips:
/// the read starts a little before `at` and stops at the first message at or after it).
fn around(
    reader: &BaseConsumer,
    topic: &str,
    partition: i32,
    at: i64,
    low: i64,
    end: i64,
    deadline: Instant,
) -> (Option<Vec<u8>>, bool) {
    let start = (at - 16).max(low);
    let mut tpl = TopicPartitionList::new();
    if tpl.add_partition_offset(topic, partition, Offset::Offset(start)).is_err() || reader.assign(&tpl).is_err() {
        return (None, false);
    }
    let mut last = None;
    let deadline = deadline.min(Instant::now() + Duration::from_secs(2));
    while Instant::now() < deadline {
        match reader.poll(Duration::from_millis(200)) {
            Some(Ok(m)) if m.offset() < at => last = m.payload().map(<[u8]>::to_vec),
            Some(Ok(_)) => return (last, false),
            Some(Err(_)) => return (last, false),
            None => {
                // Nothing more to read: the position is at the end, past any control record.
                let position = reader
                    .position()
                    .ok()
                    .and_then(|p| p.find_partition(topic, partition).and_then(|e| e.offset().to_raw()));
                if position.is_some_and(|p| p >= end) {
                    return (last, true);
                }
            }
        }
    }
    (last, false)
}
