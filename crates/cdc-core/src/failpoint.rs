//! Failpoints: named moments where the worker exits (or fails) on purpose, for the fault-injection tests.
//!
//! The setting `cdc.test_failpoint` arms one, always for one sink: `<failpoint>:<sink name>`
//! (`after_sink_commit:orders_kafka`). A failpoint without a sink is refused, so a test can never
//! crash a pipeline it did not create (a demo sink left running, another test's sink).
use std::fmt;

/// A moment the worker can be made to exit at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failpoint {
    /// Right after the sink's delivery was committed (a Kafka transaction with its checkpoint, an
    /// in-database sink's transaction with its events and checkpoint),
    /// before the slot is confirmed: the window exactly-once must survive.
    AfterSinkCommit,
    /// The launcher's deletion of the dropped sink's progress topic fails as if the broker were
    /// down (the sink's `_cdc_cleanups` row stays, with the error, until the failpoint is disarmed).
    CleanupUnreachable,
}

impl Failpoint {
    /// Every failpoint.
    pub const ALL: [Failpoint; 2] = [Failpoint::AfterSinkCommit, Failpoint::CleanupUnreachable];

    /// Its name in `cdc.test_failpoint`.
    pub fn name(self) -> &'static str {
        match self {
            Failpoint::AfterSinkCommit => "after_sink_commit",
            Failpoint::CleanupUnreachable => "cleanup_unreachable",
        }
    }
}

impl fmt::Display for Failpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The armed failpoint, if any: which one, and for which sink.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Armed(Option<(Failpoint, String)>);

impl Armed {
    /// Parses `cdc.test_failpoint`: empty (nothing armed) or `<failpoint>:<sink name>`; the sink
    /// name is everything after the first colon.
    pub fn parse(setting: &str) -> Result<Armed, String> {
        let setting = setting.trim();
        if setting.is_empty() {
            return Ok(Armed(None));
        }
        let names = || Failpoint::ALL.iter().map(|f| f.name()).collect::<Vec<_>>().join(", ");
        let Some((point, sink)) = setting.split_once(':') else {
            return Err(format!(
                "cdc.test_failpoint \"{setting}\" names no sink: write <failpoint>:<sink name> (failpoints: {})",
                names()
            ));
        };
        let Some(point) = Failpoint::ALL.into_iter().find(|f| f.name() == point.trim()) else {
            return Err(format!(
                "cdc.test_failpoint: unknown failpoint \"{}\" (failpoints: {})",
                point.trim(),
                names()
            ));
        };
        if sink.is_empty() {
            return Err(format!("cdc.test_failpoint \"{setting}\" names no sink after the colon"));
        }
        Ok(Armed(Some((point, sink.to_string()))))
    }

    /// Whether `point` is armed for the sink named `sink`.
    pub fn fires(&self, point: Failpoint, sink: &str) -> bool {
        self.0.as_ref().is_some_and(|(p, s)| *p == point && s == sink)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failpoint_fires_only_for_its_sink() {
        let armed = Armed::parse("after_sink_commit:orders kafka:eu").expect("valid");
        assert!(armed.fires(Failpoint::AfterSinkCommit, "orders kafka:eu"));
        assert!(!armed.fires(Failpoint::AfterSinkCommit, "demo_kafka"));
        assert!(!Armed::parse("").expect("empty").fires(Failpoint::AfterSinkCommit, "x"));
    }

    #[test]
    fn a_failpoint_without_a_sink_or_with_an_unknown_name_is_refused() {
        let e = Armed::parse("after_sink_commit").unwrap_err();
        assert!(e.contains("names no sink"), "{e}");
        assert!(Armed::parse("after_sink_commit:").unwrap_err().contains("no sink"));
        let e = Armed::parse("before_anything:s").unwrap_err();
        assert!(e.contains("unknown failpoint") && e.contains("after_sink_commit"), "{e}");
    }
}
