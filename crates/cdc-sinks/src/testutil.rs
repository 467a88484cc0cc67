//! What the sinks' tests share.
use std::sync::Arc;

use cdc_core::envelope::{Event, Op};
use cdc_core::Lsn;

/// An INSERT of row `id` of public.orders, the `index`-th event of the transaction committed at
/// `commit`: key `{"id":<id>}`, payload `{"after":{"id":<id>}}`.
pub fn event(commit: u64, index: u32, id: u32) -> Event {
    Event {
        table_oid: 1,
        schema: Arc::from("public"),
        table: Arc::from("orders"),
        op: Op::Insert,
        lsn: Lsn(commit - 1),
        commit_lsn: Lsn(commit),
        index,
        key: Some(format!("{{\"id\":{id}}}").into_bytes()),
        payload: format!("{{\"after\":{{\"id\":{id}}}}}").into_bytes(),
        tombstone: false,
        topic_version: None,
        schema_version: None,
        routes: Vec::new(),
    }
}
