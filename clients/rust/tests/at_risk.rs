//! is_at_risk() follows lock_at_risk and lock_safe, against a stand-in
//! daemon on a socket of the test's own that says what the daemon says
//! when a renewal stalls (a stall of Redis itself is driven by the
//! conformance suite). Lines are read in order, so the reply to a ping
//! written after an event comes back only once the hold has seen it.

use leased::{Json, Leased, LockOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::thread;
use std::time::Duration;

fn event(name: &str, key: &str) -> Json {
    Json::object()
        .set("event", name)
        .set("key", key)
        .set("token", "t1")
        .set("lease_left_ms", 1850)
}

/// Grant the group a,b; before the reply to the first ping put both
/// keys at risk and take a out again, before the second take b out.
fn serve(stream: UnixStream) {
    let mut out = stream.try_clone().unwrap();
    let mut pings = 0;
    for line in BufReader::new(stream).lines() {
        let req = Json::parse(&line.unwrap()).unwrap();
        let id = req.get("id").cloned().unwrap_or(Json::Null);
        let mut before = Vec::new();
        let reply = match req.get("op").and_then(Json::as_str) {
            Some("lock") => Json::object()
                .set("acquired", true)
                .set("token", "t1")
                .set("count", 1),
            Some("ping") => {
                pings += 1;
                if pings == 1 {
                    before.push(event("lock_at_risk", "a"));
                    before.push(event("lock_at_risk", "b"));
                    before.push(event("lock_safe", "a"));
                } else {
                    before.push(event("lock_safe", "b"));
                }
                Json::object()
            }
            Some("unlock") => Json::object().set("released", true).set("count", 0),
            _ => Json::object()
                .set("protocol", 1)
                .set("features", Vec::<Json>::new()),
        };
        let reply = reply.set("id", id).set("ok", true);
        for line in before.iter().chain(std::iter::once(&reply)) {
            out.write_all(format!("{}\n", line).as_bytes()).unwrap();
        }
    }
}

#[test]
fn a_group_is_at_risk_until_its_last_key_is_safe() {
    let path = std::env::temp_dir().join(format!("leased-rs-risk-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    let server = thread::spawn(move || serve(listener.accept().unwrap().0));
    let ld = Leased::connect(path.to_str().unwrap()).unwrap();
    let held = ld.lock(vec!["a", "b"], &LockOptions::new()).unwrap();
    assert!(!held.is_at_risk());
    ld.ping().unwrap();
    // lock_safe of a came before the ping's reply: b is still at risk.
    assert!(held.wait_at_risk(Duration::ZERO), "safe while b is at risk");
    ld.ping().unwrap();
    assert!(!held.is_at_risk(), "at risk after lock_safe of every key");
    assert!(held.wait_safe(Duration::ZERO));
    assert!(!held.is_lost());
    held.unlock().unwrap();
    drop(ld);
    let _ = std::fs::remove_file(&path);
    server.join().unwrap();
}
