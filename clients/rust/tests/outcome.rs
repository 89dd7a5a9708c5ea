//! An error reply with `"outcome":"unknown"` (the request left for Redis
//! and no answer came) is told apart, against a stand-in daemon on a
//! socket of the test's own: the real one says it only while Redis stalls.

use leased::{Json, Leased, RateOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::thread;

fn serve(stream: UnixStream) {
    let mut out = stream.try_clone().unwrap();
    for line in BufReader::new(stream).lines() {
        let req = Json::parse(&line.unwrap()).unwrap();
        let id = req.get("id").cloned().unwrap_or(Json::Null);
        let reply = match req.get("op").and_then(Json::as_str) {
            Some("rate.acquire") => Json::object().set("ok", false).set(
                "error",
                Json::object()
                    .set("code", "redis_unavailable")
                    .set("message", "no answer")
                    .set("outcome", "unknown"),
            ),
            Some("ping") => Json::object().set("ok", false).set(
                "error",
                Json::object()
                    .set("code", "redis_unavailable")
                    .set("message", "down"),
            ),
            _ => Json::object()
                .set("ok", true)
                .set("protocol", 1)
                .set("features", Vec::<Json>::new()),
        };
        let reply = reply.set("id", id);
        out.write_all(format!("{}\n", reply).as_bytes()).unwrap();
    }
}

#[test]
fn rate_acquire_outcome_unknown() {
    let path = std::env::temp_dir().join(format!("leased-rs-outcome-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    let server = thread::spawn(move || serve(listener.accept().unwrap().0));
    let ld = Leased::connect(path.to_str().unwrap()).unwrap();
    let err = ld
        .rate_acquire("r", 1, 1000, &RateOptions::new())
        .unwrap_err();
    assert_eq!(err.code(), "redis_unavailable");
    assert!(err.outcome_unknown());
    let err = ld.ping().unwrap_err();
    assert_eq!(err.code(), "redis_unavailable");
    assert!(!err.outcome_unknown());
    drop(ld);
    let _ = std::fs::remove_file(&path);
    server.join().unwrap();
}
