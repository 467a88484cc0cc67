//! What a dropped sink leaves at its destination, deleted by the launcher: an exactly-once Kafka or
//! Event Hubs sink's progress topic. `cdc_drop_sink` records it in `_cdc_cleanups` in its own
//! transaction (a deletion cannot be rolled back, so none happens before the drop commits); the
//! launcher deletes it once the sink's worker stopped (a running producer would make it again), on a
//! thread of its own so a broker that is down holds back no other chore, and tries again after a
//! pause that doubles with each failed attempt, up to 5 minutes.
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cdc_core::failpoint::{Armed, Failpoint};
use cdc_sinks::open::with_signals_blocked;
use cdc_sinks::{ErrorClass, SinkError};
use serde_json::Value;

use super::run_tx;
use crate::{catalog, gucs};

/// How long one attempt waits for the broker.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// An attempt's thread: whether the topic was there to delete, or why it failed.
type Attempt = JoinHandle<Result<bool, SinkError>>;

/// The launcher's cleanups: the one in progress, if any (its row, its topic and the thread deleting
/// it), and when to look at `_cdc_cleanups` again. The launcher passes often under load, so the
/// table is read only after the catalog changed (a drop commits) or when a pending cleanup's pause
/// ends, not at every pass.
#[derive(Default)]
pub struct Cleanups {
    running: Option<(i64, String, Attempt)>,
    /// The catalog generation last looked at.
    seen: Option<u64>,
    /// When to look again although the catalog did not change (a cleanup is pending).
    again_at: Option<Instant>,
}

impl Cleanups {
    /// One launcher pass: records the result of an attempt that finished, or starts the next one due.
    pub fn tick(&mut self, schema: &str, failpoint: &Armed, generation: u64) {
        if let Some((_, _, handle)) = &self.running {
            if !handle.is_finished() {
                return;
            }
            let Some((id, topic, handle)) = self.running.take() else { return };
            let result = handle.join().unwrap_or_else(|_| {
                Err(SinkError { class: ErrorClass::Retry, message: "the deleting thread panicked".into() })
            });
            record(schema, id, &topic, result);
            self.again_at = Some(Instant::now());
            return;
        }
        let now = Instant::now();
        if self.seen == Some(generation) && self.again_at.is_none_or(|t| now < t) {
            return;
        }
        self.seen = Some(generation);
        self.again_at = None;
        let Some(next) = run_tx(|| next_due(schema)).ok().flatten() else { return };
        if next["pending"].as_i64().unwrap_or(0) > 0 {
            self.again_at = Some(now + RECHECK);
        }
        let due = &next["due"];
        if due.is_null() {
            return;
        }
        let id = due["cleanup_id"].as_i64().unwrap_or_default();
        let (sink_id, sink_name) = (catalog::str_field(due, "sink_id"), catalog::str_field(due, "sink_name"));
        let topic = catalog::str_field(due, "target").to_string();
        // Its worker may still be finishing a delivery: it would make the topic again.
        if super::launcher::serving(sink_id).is_some() {
            return;
        }
        let unreachable = failpoint.fires(Failpoint::CleanupUnreachable, sink_name);
        let config = match cdc_sinks::parse_config(catalog::str_field(due, "sink_type"), &due["config"]) {
            Ok(c) => c,
            Err(e) => {
                record(schema, id, &topic, Err(SinkError { class: ErrorClass::Operator, message: e.message }));
                return;
            }
        };
        let bootstrap = gucs::string(&gucs::KAFKA_BOOTSTRAP_SERVERS);
        let client_id = format!("pg_cdc-cleanup-{sink_name}");
        let target = topic.clone();
        let handle = with_signals_blocked(move || {
            std::thread::spawn(move || {
                if unreachable {
                    return Err(SinkError {
                        class: ErrorClass::Retry,
                        message: "failpoint cleanup_unreachable: the broker is taken as down".into(),
                    });
                }
                cdc_sinks::open::delete_leftover(&config, &target, &bootstrap, &client_id, ATTEMPT_TIMEOUT)
            })
        });
        self.running = Some((id, topic, handle));
    }
}

/// How soon to look again while cleanups are pending (each one's own pause decides when it is due).
const RECHECK: Duration = Duration::from_millis(500);

/// The least tried cleanup whose pause since its last attempt is over (`due`, null if none), and how
/// many are pending.
fn next_due(schema: &str) -> Option<Value> {
    if !catalog::has(schema, "_cdc_cleanups") {
        return None;
    }
    catalog::json(
        &format!(
            "SELECT jsonb_build_object('pending', (SELECT count(*) FROM {schema}._cdc_cleanups),
                     'due', (SELECT to_jsonb(c) FROM {schema}._cdc_cleanups c
                              WHERE c.last_attempt_at IS NULL
                                 OR c.last_attempt_at
                                    + least(interval '1 second' * power(2, least(c.attempts, 20)), interval '5 minutes') <= now()
                              -- The least tried first: a destination that stays down must not
                              -- hold back the cleanups of the others (each attempt may wait 10 s).
                              ORDER BY c.attempts, c.cleanup_id LIMIT 1))"
        ),
        &[],
    )
}

/// Deletes the row of a cleanup done, or records a failed attempt.
fn record(schema: &str, id: i64, topic: &str, result: Result<bool, SinkError>) {
    let done = match &result {
        Ok(deleted) => run_tx(|| {
            catalog::run(&format!("DELETE FROM {schema}._cdc_cleanups WHERE cleanup_id = $1"), &[id.into()]);
            if *deleted {
                pgrx::log!("pg_cdc launcher: deleted the progress topic {topic} of a dropped sink");
            }
        }),
        Err(e) => run_tx(|| {
            catalog::run(
                &format!(
                    "UPDATE {schema}._cdc_cleanups SET attempts = attempts + 1, last_attempt_at = now(), last_error = $2
                      WHERE cleanup_id = $1"
                ),
                &[id.into(), e.message.as_str().into()],
            );
        }),
    };
    if let Err(e) = done {
        pgrx::warning!("pg_cdc launcher: cannot record the cleanup of {topic}: {e}");
    }
}
