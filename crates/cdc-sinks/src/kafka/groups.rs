//! Where Kafka consumer groups are on a sink's topic: each group's committed offset per
//! partition, and the last event it consumed there (for `cdc_schema_history`'s consumers: the
//! schema version in force at that event). Read with the sink's own connection settings; nothing
//! is committed and no group is joined.
use std::time::{Duration, Instant};

use rdkafka::bindings as rd;
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
/// groups are asked, all within `timeout`. The second value counts the groups not read: left out
/// by `max_groups`, not answered in time, or answered with an error. Errors are the client's, as
/// text.
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
    let mut c: ClientConfig = base.clone();
    c.set("group.id", format!("pg_cdc-schema-history-{}", std::process::id()))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed");
    let reader: BaseConsumer =
        with_signals_blocked(|| c.create()).map_err(|e| format!("cannot create a Kafka client: {e}"))?;
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
    let (committed, unanswered) = committed_offsets(&reader, &names, topic, &partitions, deadline);
    let mut out = Vec::new();
    for (group, partition, at) in committed {
        let (low, end) = ends.get(&partition).copied().unwrap_or((0, 0));
        let (last, caught_up) =
            if at >= end { (None, true) } else { around(&reader, topic, partition, at, low, end, deadline) };
        out.push(Position { group, partition, committed: at, end, last, caught_up });
    }
    Ok((out, skipped + unanswered))
}

/// The committed offsets on `topic` of each group in `groups`, asked over `client`'s own
/// connection with the admin request ListConsumerGroupOffsets (one group per request, as
/// librdkafka allows, `IN_FLIGHT` at a time): no client per group, so thousands of groups cost
/// thousands of small requests, not thousands of connections. Groups not answered by `deadline`
/// are counted in the second value, as are groups whose answer was an error.
fn committed_offsets(
    client: &BaseConsumer,
    groups: &[String],
    topic: &str,
    partitions: &[i32],
    deadline: Instant,
) -> (Vec<(String, i32, i64)>, usize) {
    const IN_FLIGHT: usize = 64;
    let mut tpl = TopicPartitionList::new();
    for &p in partitions {
        tpl.add_partition(topic, p);
    }
    let rk = client.client().native_ptr();
    let mut out = Vec::new();
    let (mut asked, mut answered, mut failed) = (0usize, 0usize, 0usize);
    // SAFETY: every pointer below comes from librdkafka for the live handle `rk` (borrowed from
    // `client` for this whole call) and is destroyed here exactly once: the options and the queue
    // at the end, each request object right after librdkafka copied it, each event after it was
    // read. Strings read from results are copied before their event is destroyed.
    unsafe {
        let queue = rd::rd_kafka_queue_new(rk);
        let options =
            rd::rd_kafka_AdminOptions_new(rk, rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_LISTCONSUMERGROUPOFFSETS);
        let mut errstr = [0 as std::os::raw::c_char; 256];
        let wait_ms = deadline.saturating_duration_since(Instant::now()).as_millis().clamp(100, 60_000) as i32;
        rd::rd_kafka_AdminOptions_set_request_timeout(options, wait_ms, errstr.as_mut_ptr(), errstr.len());
        while answered < groups.len() && Instant::now() < deadline {
            while asked < groups.len() && asked - answered < IN_FLIGHT {
                let Ok(name) = std::ffi::CString::new(groups[asked].as_str()) else {
                    asked += 1;
                    answered += 1;
                    failed += 1;
                    continue;
                };
                let mut request = rd::rd_kafka_ListConsumerGroupOffsets_new(name.as_ptr(), tpl.ptr());
                rd::rd_kafka_ListConsumerGroupOffsets(rk, &mut request, 1, options, queue);
                rd::rd_kafka_ListConsumerGroupOffsets_destroy(request);
                asked += 1;
            }
            let wait = deadline.saturating_duration_since(Instant::now()).as_millis().min(500) as i32;
            let event = rd::rd_kafka_queue_poll(queue, wait);
            if event.is_null() {
                continue;
            }
            answered += 1;
            let result = rd::rd_kafka_event_ListConsumerGroupOffsets_result(event);
            if rd::rd_kafka_event_error(event) != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
                || result.is_null()
            {
                failed += 1;
                rd::rd_kafka_event_destroy(event);
                continue;
            }
            let mut count = 0usize;
            let results = rd::rd_kafka_ListConsumerGroupOffsets_result_groups(result, &mut count);
            for i in 0..count {
                let group = *results.add(i);
                if !rd::rd_kafka_group_result_error(group).is_null() {
                    failed += 1;
                    continue;
                }
                let name =
                    std::ffi::CStr::from_ptr(rd::rd_kafka_group_result_name(group)).to_string_lossy().into_owned();
                let list = rd::rd_kafka_group_result_partitions(group);
                if list.is_null() {
                    continue;
                }
                for j in 0..(*list).cnt as usize {
                    let e = &*(*list).elems.add(j);
                    if e.err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && e.offset > 0 {
                        out.push((name.clone(), e.partition, e.offset));
                    }
                }
            }
            rd::rd_kafka_event_destroy(event);
        }
        // Requests still in flight deliver to the queue; destroying it drops them.
        rd::rd_kafka_AdminOptions_destroy(options);
        rd::rd_kafka_queue_destroy(queue);
    }
    (out, failed + (groups.len() - answered))
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
