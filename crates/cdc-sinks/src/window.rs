//! The bound on what an asynchronous sink has handed to its client without a receipt yet (Pub/Sub,
//! Pulsar): each event is checked against what one message holds and counted, and once so many
//! messages or bytes are outstanding the sink waits for their receipts before it hands over more.

use cdc_core::deliver::port::PublishStats;
use cdc_core::envelope::Event;

/// Messages and bytes handed over since the last wait.
#[derive(Debug, Clone)]
pub struct Outstanding {
    max_messages: usize,
    max_bytes: usize,
    messages: usize,
    bytes: usize,
}

impl Outstanding {
    /// A window of at most `max_messages` messages or `max_bytes` payload bytes.
    pub fn new(max_messages: usize, max_bytes: usize) -> Self {
        Outstanding { max_messages, max_bytes, messages: 0, bytes: 0 }
    }

    /// Counts `ev` into the window and into `stats`, once it fits in one message of at most
    /// `max_message` bytes; otherwise the start of the operator's error ("the event of ... is N
    /// bytes"), which the sink completes with what its messages hold.
    pub fn admit(&mut self, ev: &Event, max_message: usize, stats: &mut PublishStats) -> Result<(), String> {
        if ev.payload.len() > max_message {
            return Err(format!(
                "the event of {}.{} at LSN {} is {} bytes",
                ev.schema,
                ev.table,
                ev.lsn,
                ev.payload.len()
            ));
        }
        stats.events += 1;
        stats.bytes += (ev.payload.len() + ev.key.as_ref().map_or(0, Vec::len)) as u64;
        self.messages += 1;
        self.bytes += ev.payload.len();
        Ok(())
    }

    /// Whether the sink must wait for receipts before it hands over more.
    pub fn full(&self) -> bool {
        self.messages >= self.max_messages || self.bytes >= self.max_bytes
    }

    /// Everything handed over is settled (its receipts waited for, or abandoned).
    pub fn clear(&mut self) {
        self.messages = 0;
        self.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::event;

    fn event_with_payload(payload: Vec<u8>) -> Event {
        Event { payload, key: None, ..event(10, 1, 1) }
    }

    #[test]
    fn counts_until_full_and_refuses_what_one_message_cannot_hold() {
        let mut w = Outstanding::new(2, 100);
        let mut stats = PublishStats::default();
        let small = event_with_payload(vec![b'x'; 10]);
        w.admit(&small, 50, &mut stats).unwrap();
        assert!(!w.full());
        w.admit(&small, 50, &mut stats).unwrap();
        assert!(w.full(), "two messages");
        assert_eq!(stats.events, 2);
        w.clear();
        assert!(!w.full());
        let big = event_with_payload(vec![b'x'; 60]);
        let e = w.admit(&big, 50, &mut stats).unwrap_err();
        assert!(e.ends_with("is 60 bytes"), "{e}");
        assert_eq!(stats.events, 2, "a refused event is not counted");
        let mut bytes = Outstanding::new(100, 30);
        bytes.admit(&small, 50, &mut stats).unwrap();
        bytes.admit(&small, 50, &mut stats).unwrap();
        assert!(!bytes.full());
        bytes.admit(&small, 50, &mut stats).unwrap();
        assert!(bytes.full(), "30 bytes");
    }
}
