//! A daemon that ends the session (a restart) against a stand-in daemon
//! on a socket of the test's own: the holds of the session are told, and
//! the next call opens a new session.

use leased::{Json, Leased, LockOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::thread;
use std::time::Duration;

/// Answer hello and lock requests on one connection; after LOCKS locks,
/// close it.
fn serve(stream: UnixStream, session: usize, locks: usize) {
    let mut out = stream.try_clone().unwrap();
    let mut granted = 0;
    for line in BufReader::new(stream).lines() {
        let req = Json::parse(&line.unwrap()).unwrap();
        let id = req.get("id").cloned().unwrap_or(Json::Null);
        let reply = match req.get("op").and_then(Json::as_str) {
            Some("lock") => {
                granted += 1;
                Json::object()
                    .set("acquired", true)
                    .set("token", format!("t{}", session))
                    .set("count", 1)
                    .set("fence", session as i64)
            }
            Some("unlock") => Json::object().set("released", true).set("count", 0),
            _ => Json::object()
                .set("protocol", 1)
                .set("features", Vec::<Json>::new()),
        };
        let reply = reply.set("id", id).set("ok", true);
        out.write_all(format!("{}\n", reply).as_bytes()).unwrap();
        if granted == locks {
            return;
        }
    }
}

#[test]
fn a_new_session_after_the_daemon_ended_the_last() {
    let path = std::env::temp_dir().join(format!("leased-rs-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    let server = thread::spawn(move || {
        let (first, _) = listener.accept().unwrap();
        serve(first, 1, 1);
        let (second, _) = listener.accept().unwrap();
        serve(second, 2, usize::MAX);
    });
    let ld = Leased::connect(path.to_str().unwrap()).unwrap();
    let held = ld.lock("k", &LockOptions::new()).unwrap();
    assert_eq!(held.token(), "t1");
    assert_eq!(
        held.wait_lost(Duration::from_secs(10)).as_deref(),
        Some("connection_closed")
    );
    // The lock went with its session: its guard ends without an error.
    held.unlock().unwrap();
    let again = ld.lock("k", &LockOptions::new()).unwrap();
    assert_eq!(again.token(), "t2", "the call did not open a new session");
    again.unlock().unwrap();
    drop(ld);
    let _ = std::fs::remove_file(&path);
    server.join().unwrap();
}
