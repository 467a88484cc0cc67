//! `cdc_pause_sink` and `cdc_resume_sink`: stop a sink's delivery and start it again where it
//! stopped. A paused sink has no worker; its slot keeps its position (and so the WAL after it);
//! it reads no shared decoding, so it holds no other sink back. The worker never writes over
//! `paused` (`worker::source::set_state`), and a paused sink whose slot holds more WAL than
//! `cdc.paused_max_wal_size` is resumed by the launcher (`worker::chores`).
use cdc_core::state::SinkState;
use cdc_core::{CdcError, ErrorKind};
use pgrx::prelude::*;

use super::{required, schema};
use crate::catalog;
use crate::errors::raise;

/// Pauses a sink: its worker finishes the delivery in hand and exits once this transaction
/// commits, and none starts until `cdc_resume_sink`. Its slot keeps its position, so nothing is
/// lost and an exactly-once sink stays exactly-once; the slot holds the WAL written meanwhile
/// (`cdc_status().retained_wal_bytes`), up to `cdc.paused_max_wal_size` past which the sink
/// resumes by itself. A paused sink reads no shared decoding, so it holds no other sink back.
/// Returns false, with a NOTICE, when the sink was paused already. Refused (55000) for a sink
/// whose slot is not made yet (`creating_slot`) and for a finished one.
///
/// ```sql
/// SELECT cdc_pause_sink('kafka_orders');
/// ```
#[pg_extern(volatile)]
fn cdc_pause_sink(sink_name: Option<&str>) -> bool {
    let sink_name = required(sink_name, "sink_name");
    let _entry = super::access::enter();
    let schema = schema();
    let state = locked_state(&schema, sink_name);
    match state {
        SinkState::Paused => {
            pgrx::notice!("sink \"{sink_name}\" is paused already");
            return false;
        }
        SinkState::CreatingSlot => raise(
            CdcError::new(
                ErrorKind::PrerequisiteState,
                format!("sink \"{sink_name}\" has no slot yet: the worker makes it once the transaction that added the sink commits"),
            )
            .hint("Pause it once cdc_status() shows it past creating_slot."),
        ),
        SinkState::Finished => raise(
            CdcError::new(
                ErrorKind::PrerequisiteState,
                format!("sink \"{sink_name}\" is finished: it delivered its initial_only snapshot and reads nothing more"),
            )
            .hint("There is nothing to pause; cdc_drop_sink removes it."),
        ),
        _ => {}
    }
    crate::worker::launcher::catalog_changed();
    set_state(&schema, sink_name, SinkState::Paused);
    true
}

/// Resumes a paused sink: a worker starts from its slot's position once this transaction commits
/// (state `starting`, then `snapshotting` or `running`) and delivers what was committed while it
/// was paused, with its guarantee. Returns false, with a NOTICE, when the sink was not paused.
///
/// ```sql
/// SELECT cdc_resume_sink('kafka_orders');
/// ```
#[pg_extern(volatile)]
fn cdc_resume_sink(sink_name: Option<&str>) -> bool {
    let sink_name = required(sink_name, "sink_name");
    let _entry = super::access::enter();
    let schema = schema();
    let state = locked_state(&schema, sink_name);
    if state != SinkState::Paused {
        pgrx::notice!("sink \"{sink_name}\" is not paused (state {state})");
        return false;
    }
    crate::worker::launcher::catalog_changed();
    set_state(&schema, sink_name, SinkState::Starting);
    true
}

/// The state of sink `sink_name`, its row locked until the transaction ends (a pause and a resume
/// of one sink wait for each other), or the 42704 error.
fn locked_state(schema: &str, sink_name: &str) -> SinkState {
    let label = catalog::json_write(
        &format!("SELECT to_jsonb(state) FROM {schema}._cdc_sinks WHERE sink_name = $1 FOR UPDATE"),
        &[sink_name.into()],
    )
    .unwrap_or_else(|| super::no_such_sink(sink_name));
    let label = label.as_str().unwrap_or_default();
    SinkState::parse(label).unwrap_or_else(|| pgrx::error!("sink \"{sink_name}\" has an unknown state \"{label}\""))
}

fn set_state(schema: &str, sink_name: &str, state: SinkState) {
    catalog::run(
        &format!(
            "UPDATE {schema}._cdc_sinks SET state = $2, last_error = NULL, state_since = now() WHERE sink_name = $1"
        ),
        &[sink_name.into(), state.label().into()],
    );
}

/// Resumes paused sinks whose slot holds more than `limit` bytes of WAL (the launcher's chore,
/// with `cdc.paused_max_wal_size`). Returns each resumed sink's name and the WAL its slot held.
pub(crate) fn resume_past(schema: &str, limit: i64) -> Vec<(String, i64)> {
    let (paused, starting) = (SinkState::Paused.label(), SinkState::Starting.label());
    let resumed = catalog::json_write(
        &format!(
            "WITH held AS (SELECT s.sink_id, s.sink_name, (pg_current_wal_lsn() - r.restart_lsn)::bigint AS bytes
                             FROM {schema}._cdc_sinks s JOIN pg_replication_slots r ON r.slot_name = s.slot_name
                            WHERE s.state = '{paused}' AND (pg_current_wal_lsn() - r.restart_lsn) > $1),
                  r AS (UPDATE {schema}._cdc_sinks s
                           SET state = '{starting}', state_since = now(),
                               last_error = format('resumed by itself: its slot held %s MB of WAL, over cdc.paused_max_wal_size (%s MB)',
                                                   h.bytes >> 20, $1 >> 20)
                          FROM held h WHERE s.sink_id = h.sink_id AND s.state = '{paused}'
                        RETURNING h.sink_name, h.bytes)
             SELECT coalesce(jsonb_agg(jsonb_build_array(sink_name, bytes)), '[]') FROM r"
        ),
        &[limit.into()],
    )
    .unwrap_or_default();
    resumed
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| (p[0].as_str().unwrap_or_default().to_string(), p[1].as_i64().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default()
}
