//! The webhook sink against a minimal HTTP server on a local socket (the end-to-end tests use a
//! real one, Python's http.server).
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use cdc_core::Lsn;
use serde_json::{json, Value};

use super::config::parse;
use super::*;
use crate::testutil::event;

/// A request the server got: its headers (lower-case names) and body.
type Got = Arc<Mutex<Vec<(Vec<(String, String)>, Vec<u8>)>>>;

/// Serves one canned response per connection, in order, recording each request.
fn server(responses: Vec<&'static str>) -> (String, Got) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://user:pw@{}/hook?token=abc", listener.local_addr().unwrap());
    let got: Got = Arc::default();
    let seen = got.clone();
    std::thread::spawn(move || {
        for response in responses {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut headers = Vec::new();
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                let line = line.trim_end();
                if line.is_empty() {
                    break;
                }
                if let Some((k, v)) = line.split_once(':') {
                    headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
                }
            }
            let len = headers.iter().find(|(k, _)| k == "content-length").map_or(0, |(_, v)| v.parse().unwrap());
            let mut body = vec![0; len];
            reader.read_exact(&mut body).unwrap();
            seen.lock().unwrap().push((headers, body));
            let mut stream = stream;
            stream.write_all(response.as_bytes()).unwrap();
        }
    });
    (url, got)
}

const OK: &str = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
const BUSY: &str =
    "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
const BAD: &str = "HTTP/1.1 400 Bad Request\r\nContent-Length: 21\r\nConnection: close\r\n\r\nunknown field \"event\"";

fn sink(url: &str, extra: Value) -> WebhookSink {
    let mut cfg = json!({"url": url, "batch_max_events": 2});
    cfg.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    WebhookSink::new(&parse(&cfg).unwrap(), Some(b"s3cret".to_vec()))
}

#[test]
fn batches_are_posted_in_order_signed_and_parse_as_json() {
    let (url, got) = server(vec![OK, OK]);
    let mut s = sink(&url, json!({"headers": {"Authorization": "Bearer t"}}));
    let stats = s.send(&[event(10, 1, 1), event(10, 2, 2), event(20, 1, 3)]).unwrap();
    assert_eq!(stats.events, 3);
    s.flush(Checkpoint { end_lsn: Lsn(21) }).unwrap();
    let got = got.lock().unwrap();
    assert_eq!(got.len(), 2, "two events per request");
    let (headers, body) = &got[0];
    let header = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    assert_eq!(header("x-pg-cdc-signature"), Some(signature(b"s3cret", body)));
    assert_eq!(header("authorization").as_deref(), Some("Bearer t"));
    assert_eq!(header("content-type").as_deref(), Some("application/json"));
    let v: Value = serde_json::from_slice(body).unwrap();
    assert_eq!(
        v["events"][0],
        json!({"id": "10-1", "commit_lsn": 10, "event_index": 1, "table": "public.orders",
                                      "key": {"id": 1}, "event": {"after": {"id": 1}}})
    );
    let last: Value = serde_json::from_slice(&got[1].1).unwrap();
    assert_eq!(last["events"][0]["id"], "20-1");
}

#[test]
fn retry_after_holds_the_next_request_back_and_4xx_needs_an_operator() {
    let (url, got) = server(vec![BUSY, OK, BAD]);
    let mut s = sink(&url, json!({}));
    s.send(&[event(10, 1, 1)]).unwrap();
    let e = s.flush(Checkpoint { end_lsn: Lsn(11) }).unwrap_err();
    assert_eq!(e.class, ErrorClass::Retry);
    assert!(e.message.contains("HTTP 503"), "{}", e.message);
    // The URL's credentials, path and query are never in a message.
    assert!(
        e.message.starts_with("webhook http://127.0.0.1:") && !e.message.contains("pw") && !e.message.contains("abc")
    );
    s.abort();
    s.send(&[event(10, 1, 1)]).unwrap();
    assert!(s.hold_until().is_some_and(|t| t > Instant::now() + Duration::from_millis(500)));
    let early = s.flush(Checkpoint { end_lsn: Lsn(11) }).unwrap_err();
    assert!(early.message.contains("Retry-After"), "{}", early.message);
    assert_eq!(got.lock().unwrap().len(), 1, "nothing was sent before the Retry-After");
    std::thread::sleep(Duration::from_millis(1100));
    s.flush(Checkpoint { end_lsn: Lsn(11) }).unwrap();
    s.send(&[event(30, 1, 4)]).unwrap();
    let e = s.flush(Checkpoint { end_lsn: Lsn(31) }).unwrap_err();
    assert_eq!(e.class, ErrorClass::Operator);
    assert!(e.message.ends_with("HTTP 400: unknown field \"event\""), "{}", e.message);
}

#[test]
fn an_unreachable_endpoint_is_transient() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut s = sink(&format!("http://127.0.0.1:{port}/"), json!({}));
    s.send(&[event(10, 1, 1)]).unwrap();
    assert_eq!(s.flush(Checkpoint { end_lsn: Lsn(11) }).unwrap_err().class, ErrorClass::Retry);
}

#[test]
fn statuses_and_retry_after() {
    assert_eq!(classify_status(204), None);
    for s in [408, 429, 500, 503] {
        assert_eq!(classify_status(s), Some(ErrorClass::Retry), "{s}");
    }
    for s in [301, 400, 401, 403, 404, 413] {
        assert_eq!(classify_status(s), Some(ErrorClass::Operator), "{s}");
    }
    assert_eq!(retry_after(" 7 "), Some(Duration::from_secs(7)));
    assert_eq!(retry_after("100000"), Some(MAX_RETRY_AFTER));
    assert_eq!(retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
}

#[test]
fn config() {
    let e = |v| parse(&v).unwrap_err();
    assert_eq!(e(json!({})).message, "config.url is required for a webhook sink");
    assert_eq!(e(json!({"url": "ftp://x"})).kind.sqlstate(), "22023");
    assert_eq!(e(json!({"url": "https://"})).kind.sqlstate(), "22023");
    assert_eq!(e(json!({"url": "https://x", "exactly_once": true})).kind.sqlstate(), "22023");
    assert_eq!(e(json!({"url": "https://x", "headers": {"Content-Type": "text/plain"}})).kind.sqlstate(), "22023");
    assert_eq!(e(json!({"url": "https://x", "headers": {"X-A": "a\r\nX-B: b"}})).kind.sqlstate(), "22023");
    let secret = e(json!({"url": "https://x", "headers": {"Authorization": ["canary-secret"]}}));
    assert!(!format!("{secret:?}").contains("canary-secret"));
    let c = parse(&json!({"url": "https://x/y", "secret_file": "hook.key", "partition_key": "account_id"})).unwrap();
    assert_eq!((c.batch_max_events, c.batch_max_bytes, c.timeout_ms), (500, 1 << 20, 10_000));
    assert_eq!(c.common.partition_key.as_deref(), Some("account_id"));
    assert_eq!(endpoint_label("https://u:p@example.com:8443/x?y=1"), "https://example.com:8443");
}
