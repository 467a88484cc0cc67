//! A wake-up for the thread that waits on delivery reports.
//!
//! librdkafka hands delivery reports to the producer's main queue, which rdkafka serves only when
//! asked (`poll`). Waiting for them by sleeping a short step between polls costs a context switch
//! per step: measured, at 2,000 single-row tx/s the waits for the broker's acknowledgements were
//! the largest share of a busy Kafka sink's CPU. librdkafka can instead write to a file descriptor
//! whenever an event arrives on the empty queue (`rd_kafka_queue_io_event_enable`); the waiting
//! thread sleeps on that descriptor, so it wakes once per report batch, at once.

use std::time::Duration;

use rdkafka::bindings as rdsys;
use rdkafka::producer::{BaseProducer, Producer, ProducerContext};

/// An eventfd librdkafka writes to when the producer's main queue gets an event while empty.
pub(super) struct ReportBell {
    queue: *mut rdsys::rd_kafka_queue_t,
    fd: libc::c_int,
}

// SAFETY: librdkafka's queue functions may be called from any thread, and the eventfd is only
// read and polled.
unsafe impl Send for ReportBell {}
// SAFETY: as above; every method takes `&self` and does nothing but thread-safe calls.
unsafe impl Sync for ReportBell {}

/// What librdkafka writes to the eventfd: an eventfd takes 8-byte counts.
static RING: [u8; 8] = 1u64.to_ne_bytes();

impl ReportBell {
    /// Rings on `producer`'s main queue (where its delivery reports and errors arrive). None when
    /// the eventfd cannot be made: the caller then sleeps a short step between polls instead.
    pub(super) fn new<C: ProducerContext>(producer: &BaseProducer<C>) -> Option<ReportBell> {
        // SAFETY: plain system call; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        // SAFETY: the client pointer is valid while `producer` lives, and `ReportBell` is dropped
        // before it (it is declared before the producer in `KafkaSink`). The returned queue is a
        // new reference that `drop` releases; librdkafka copies the payload.
        let queue = unsafe { rdsys::rd_kafka_queue_get_main(producer.client().native_ptr()) };
        if queue.is_null() {
            // SAFETY: the fd was just made and is not shared.
            unsafe { libc::close(fd) };
            return None;
        }
        // SAFETY: queue and fd are valid; the payload is static.
        unsafe { rdsys::rd_kafka_queue_io_event_enable(queue, fd, RING.as_ptr().cast(), RING.len()) };
        Some(ReportBell { queue, fd })
    }

    /// Forgets earlier rings: call before serving the queue, so that a ring after it means a new
    /// event.
    pub(super) fn clear(&self) {
        let mut count = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a local buffer; a non-blocking eventfd returns EAGAIN
        // when it was not rung.
        unsafe { libc::read(self.fd, count.as_mut_ptr().cast(), count.len()) };
    }

    /// Events waiting on the queue.
    pub(super) fn queued(&self) -> usize {
        // SAFETY: the queue reference is valid until drop.
        unsafe { rdsys::rd_kafka_queue_length(self.queue) }
    }

    /// Whether it rang since the last [`clear`](Self::clear) (without waiting).
    #[cfg(test)]
    fn rung(&self) -> bool {
        let mut pfd = libc::pollfd { fd: self.fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd, no wait.
        unsafe { libc::poll(&mut pfd, 1, 0) == 1 }
    }

    /// Sleeps until the queue gets an event after the last [`clear`](Self::clear), or `max`.
    pub(super) fn wait(&self, max: Duration) {
        let mut pfd = libc::pollfd { fd: self.fd, events: libc::POLLIN, revents: 0 };
        let ms = libc::c_int::try_from(max.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
        // SAFETY: one valid pollfd; an error or a signal only ends the wait early.
        unsafe { libc::poll(&mut pfd, 1, ms) };
    }
}

impl Drop for ReportBell {
    fn drop(&mut self) {
        // SAFETY: stop the writes before the fd is closed (its number could be reused), then
        // release the queue reference taken in `new`.
        unsafe {
            rdsys::rd_kafka_queue_io_event_enable(self.queue, -1, std::ptr::null(), 0);
            rdsys::rd_kafka_queue_destroy(self.queue);
            libc::close(self.fd);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use rdkafka::config::ClientConfig;
    use rdkafka::mocking::MockCluster;
    use rdkafka::producer::{BaseRecord, DefaultProducerContext};

    use super::*;

    /// The bell rings when a delivery report arrives on the empty queue, and again for the next
    /// report once the queue was served: what lets the waiting thread sleep instead of polling.
    #[test]
    fn rings_when_a_report_arrives_and_again_after_the_queue_was_served() {
        let cluster = MockCluster::new(1).unwrap();
        let producer: BaseProducer<DefaultProducerContext> =
            ClientConfig::new().set("bootstrap.servers", cluster.bootstrap_servers()).create().unwrap();
        let bell = ReportBell::new(&producer).expect("an eventfd");
        for round in 0..2 {
            bell.clear();
            assert!(!bell.rung(), "round {round}: rang before anything was sent");
            producer.send(BaseRecord::<(), [u8]>::to("t").payload(b"x".as_slice())).map_err(|(e, _)| e).unwrap();
            let deadline = Instant::now() + Duration::from_secs(30);
            while bell.queued() == 0 {
                assert!(Instant::now() < deadline, "round {round}: no delivery report");
                std::thread::sleep(Duration::from_millis(5));
            }
            assert!(bell.rung(), "round {round}: a report was queued and the bell did not ring");
            bell.wait(Duration::from_secs(30));
            while bell.queued() > 0 {
                producer.poll(Duration::ZERO);
            }
            assert_eq!(producer.in_flight_count(), 0);
        }
    }
}
