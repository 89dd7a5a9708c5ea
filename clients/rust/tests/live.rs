//! The client against a real daemon: LEASED_SOCKET must name the socket
//! of a leased whose Redis may be written (tests/integration/
//! check_client_rust starts both). Without it every test fails.

use leased::{
    CacheOptions, Json, Leased, LockOptions, RateOptions, SemOptions, UnlockOptions, WarmEntry,
    WriteOptions,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

fn socket() -> String {
    std::env::var("LEASED_SOCKET").expect("LEASED_SOCKET: the socket of a leased to test against")
}

fn client() -> Leased {
    Leased::connect(&socket()).expect("connect")
}

fn try_once() -> LockOptions {
    LockOptions::new()
}

/// A key of this run: the Redis behind the daemon may keep the last
/// run's values.
fn k(name: &str) -> String {
    format!("rs{}:{}", std::process::id(), name)
}

const SECOND: Duration = Duration::from_secs(1);

#[test]
fn guard_unlocks_on_drop_and_fences_increase() {
    let (a, b) = (client(), client());
    let first = a.lock(k("drop"), &try_once()).unwrap();
    assert_eq!(first.count(), 1);
    assert!(!first.token().is_empty());
    assert!(b.try_lock(k("drop"), &try_once()).unwrap().is_none());
    let fence = first.fence();
    drop(first);
    let second = b.lock(k("drop"), &try_once()).unwrap();
    assert!(second.fence() > fence, "{} > {}", second.fence(), fence);
    second.unlock().unwrap();
}

#[test]
fn lock_not_acquired_is_an_error_with_its_code() {
    let (a, b) = (client(), client());
    let _held = a.lock(k("busy"), &try_once()).unwrap();
    let err = b.lock(k("busy"), &try_once()).unwrap_err();
    assert_eq!(err.code(), "not_acquired");
}

#[test]
fn reentry_by_owner() {
    let (a, b) = (client(), client());
    let opts = LockOptions::new().owner("w");
    let h1 = a.lock(k("reenter"), &opts).unwrap();
    let h2 = a.lock(k("reenter"), &opts).unwrap();
    assert_eq!(h2.count(), 2);
    assert_eq!(h1.token(), h2.token());
    h2.unlock().unwrap();
    assert!(b.try_lock(k("reenter"), &try_once()).unwrap().is_none());
    h1.unlock().unwrap();
    assert!(b.try_lock(k("reenter"), &try_once()).unwrap().is_some());
}

#[test]
fn threads_sharing_a_client_exclude_each_other() {
    let ld = client();
    let held = ld.lock(k("threads"), &try_once()).unwrap();
    let other = ld.clone();
    let t = thread::spawn(move || {
        other
            .try_lock(k("threads"), &LockOptions::new())
            .unwrap()
            .is_some()
    });
    assert!(!t.join().unwrap(), "another thread reentered the lock");
    held.unlock().unwrap();
}

#[test]
fn a_waiter_gets_the_lock_on_unlock() {
    let (a, b) = (client(), client());
    let held = a.lock(k("wait"), &try_once()).unwrap();
    let pending = b
        .start_lock(k("wait"), &LockOptions::new().wait_ms(10000))
        .unwrap();
    let waiter = thread::spawn(move || pending.wait().unwrap().map(|h| h.fence()));
    held.unlock().unwrap();
    assert!(waiter.join().unwrap().is_some());
}

#[test]
fn cancel_ends_a_wait() {
    let (a, b) = (client(), client());
    let _held = a.lock(k("cancel"), &try_once()).unwrap();
    let pending = b
        .start_lock(k("cancel"), &LockOptions::new().wait_ms(-1))
        .unwrap();
    let canceller = pending.canceller();
    let waiter = thread::spawn(move || pending.wait().unwrap().is_none());
    // The cancel may reach the daemon before the lock starts waiting:
    // then it finds nothing and is sent again.
    let mut cancelled = false;
    for _ in 0..100 {
        if canceller.cancel().unwrap() {
            cancelled = true;
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    assert!(cancelled);
    assert!(waiter.join().unwrap(), "a cancelled wait acquired");
}

#[test]
fn a_timed_out_wait_leaks_no_lock() {
    let (a, b) = (client(), client());
    let held = a.lock(k("late"), &try_once()).unwrap();
    let pending = b
        .start_lock(k("late"), &LockOptions::new().wait_ms(300))
        .unwrap();
    assert!(pending.wait().unwrap().is_none());
    held.unlock().unwrap();
    assert!(a.try_lock(k("late"), &try_once()).unwrap().is_some());
}

#[test]
fn a_dropped_wait_leaks_no_lock() {
    let (a, b, c) = (client(), client(), client());
    let held = a.lock(k("dropped"), &try_once()).unwrap();
    let pending = b
        .start_lock(k("dropped"), &LockOptions::new().wait_ms(20000))
        .unwrap();
    drop(pending);
    held.unlock().unwrap();
    // Served after b's wait, had it stayed: b's session lives on.
    let got = c
        .try_lock(k("dropped"), &LockOptions::new().wait_ms(10000))
        .unwrap();
    assert!(got.is_some(), "the dropped wait kept the lock");
}

#[test]
fn lock_lost_reaches_the_guard() {
    let (a, admin) = (client(), client());
    let held = a.lock(k("lost"), &try_once()).unwrap();
    assert!(!held.is_lost());
    admin
        .call("lock.force_unlock", Json::object().set("key", k("lost")))
        .unwrap();
    assert_eq!(held.wait_lost(10 * SECOND).as_deref(), Some("taken"));
    assert!(held.is_lost());
    // A lost lock is not unlocked with an error: the holder was told.
    held.unlock().unwrap();
}

#[test]
fn explicit_unlock_reports_not_held() {
    let (a, b) = (client(), client());
    let held = a
        .lock(
            k("detached"),
            &LockOptions::new().detach(true).ttl_ms(60000),
        )
        .unwrap();
    b.unlock_token(k("detached"), held.token()).unwrap();
    let err = held.unlock().unwrap_err();
    assert_eq!(err.code(), "not_held");
    assert_eq!(err.reason(), Some("absent"));
}

#[test]
fn read_write_lock() {
    let (a, b) = (client(), client());
    let r1 = a.read_lock(&k("rw"), &try_once()).unwrap();
    let r2 = b.read_lock(&k("rw"), &try_once()).unwrap();
    assert!(a.write_lock(&k("rw"), &try_once()).is_err());
    r1.unlock().unwrap();
    r2.unlock().unwrap();
    let w = a.write_lock(&k("rw"), &try_once()).unwrap();
    assert_eq!(
        b.read_lock(&k("rw"), &try_once()).unwrap_err().code(),
        "not_acquired"
    );
    w.unlock().unwrap();
}

#[test]
fn several_keys_at_once() {
    let (a, b) = (client(), client());
    let group = a.lock([&k("m1"), &k("m2")], &try_once()).unwrap();
    assert_eq!(group.fences().len(), 2);
    assert!(b.try_lock(k("m2"), &try_once()).unwrap().is_none());
    group.unlock().unwrap();
    assert!(b
        .try_lock(vec![&k("m2"), &k("m1")], &try_once())
        .unwrap()
        .is_some());
}

#[test]
fn semaphore_permits() {
    let (a, b) = (client(), client());
    let one = a.semaphore(&k("sem"), 2, &SemOptions::new()).unwrap();
    let _two = b.semaphore(&k("sem"), 2, &SemOptions::new()).unwrap();
    assert_eq!(
        b.semaphore(&k("sem"), 2, &SemOptions::new())
            .unwrap_err()
            .code(),
        "no_permit"
    );
    one.unlock().unwrap();
    assert!(b
        .try_semaphore(&k("sem"), 2, &SemOptions::new())
        .unwrap()
        .is_some());
    assert!(b.sem_info(&k("sem"), 2).unwrap().get("available").is_some());
}

#[test]
fn cached_loads_once_for_many_threads() {
    let ld = client();
    let loads = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (ld, loads, start) = (ld.clone(), loads.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                let opts = CacheOptions::new().wait_ms(10000);
                ld.cached_with(&k("user:7"), &opts, || {
                    loads.fetch_add(1, Ordering::SeqCst);
                    // The database's time to answer, so that the other
                    // readers find the load under way.
                    thread::sleep(Duration::from_millis(300));
                    Ok::<_, std::io::Error>(Json::object().set("name", "Ada"))
                })
                .unwrap()
            })
        })
        .collect();
    for t in threads {
        assert_eq!(
            t.join().unwrap().get("name").and_then(Json::as_str),
            Some("Ada")
        );
    }
    assert_eq!(loads.load(Ordering::SeqCst), 1);
}

#[test]
fn a_failed_loader_gives_the_lease_back() {
    let (a, b) = (client(), client());
    let err = a
        .cached(&k("fail"), || {
            Err::<Json, _>(std::io::Error::new(std::io::ErrorKind::Other, "db down"))
        })
        .unwrap_err();
    assert_eq!(err.code(), "loader");
    assert!(std::error::Error::source(&err).is_some());
    // With the lease still out, this reader would wait its full wait_ms
    // and then time out instead of loading.
    let v = b
        .cached_with(&k("fail"), &CacheOptions::new().wait_ms(5000), || {
            Ok::<_, std::io::Error>(Json::from(7))
        })
        .unwrap();
    assert_eq!(v, Json::Int(7));
}

#[test]
fn a_panicking_loader_gives_the_lease_back() {
    let (a, b) = (client(), client());
    let a2 = a.clone();
    let r = thread::spawn(move || {
        a2.cached(&k("panic"), || -> Result<Json, std::io::Error> {
            panic!("loader")
        })
    })
    .join();
    assert!(r.is_err());
    let v = b
        .cached_with(&k("panic"), &CacheOptions::new().wait_ms(5000), || {
            Ok::<_, std::io::Error>(Json::from("x"))
        })
        .unwrap();
    assert_eq!(v.as_str(), Some("x"));
}

#[test]
fn not_found_is_cached_as_null() {
    let ld = client();
    assert!(ld
        .cached(&k("none"), || Ok::<_, std::io::Error>(Json::Null))
        .unwrap()
        .is_null());
    let again = ld
        .cached(&k("none"), || Ok::<_, std::io::Error>(Json::from("loaded")))
        .unwrap();
    assert!(again.is_null(), "the cached null was not served: {}", again);
}

#[test]
fn update_invalidates_one_key_or_many() {
    let ld = client();
    let load = |v: &'static str| move || Ok::<_, std::io::Error>(Json::from(v));
    assert_eq!(
        ld.cached(&k("u1"), load("old")).unwrap().as_str(),
        Some("old")
    );
    assert_eq!(
        ld.cached(&k("u2"), load("old")).unwrap().as_str(),
        Some("old")
    );
    let n = ld.update(k("u1"), || Ok::<_, std::io::Error>(1)).unwrap();
    assert_eq!(n, 1);
    assert_eq!(
        ld.cached(&k("u1"), load("new")).unwrap().as_str(),
        Some("new")
    );
    ld.invalidate(vec![&k("u1"), &k("u2")]).unwrap();
    assert_eq!(
        ld.cached(&k("u2"), load("new")).unwrap().as_str(),
        Some("new")
    );
}

#[test]
fn errors_carry_the_protocol_code() {
    let ld = client();
    assert_eq!(ld.lock("", &try_once()).unwrap_err().code(), "bad_request");
    assert_eq!(
        ld.lock(Vec::<String>::new(), &try_once())
            .unwrap_err()
            .code(),
        "invalid"
    );
    let long = "k".repeat(5000);
    assert_eq!(
        ld.lock(long.as_str(), &try_once()).unwrap_err().code(),
        "bad_request"
    );
    assert_eq!(
        ld.call("no.such.op", Json::object()).unwrap_err().code(),
        "unknown_op"
    );
}

#[test]
fn connect_error_names_the_socket_and_what_to_check() {
    let err = Leased::connect("/nonexistent/leased.sock").unwrap_err();
    assert_eq!(err.code(), "connect");
    assert!(
        err.message().contains("/nonexistent/leased.sock"),
        "{}",
        err
    );
    assert!(err.message().contains("LEASED_SOCKET"), "{}", err);
}

#[test]
fn hello_announces_features() {
    let f = client().features().unwrap();
    assert!(f.iter().any(|x| x == "cancel"), "{:?}", f);
}

#[test]
fn unlock_repeated_with_one_request_id_releases_one_hold() {
    let (a, b) = (client(), client());
    let key = k("rid");
    let opts = LockOptions::new().owner("rid");
    let h1 = a.lock(key.as_str(), &opts).unwrap();
    let h2 = a.lock(key.as_str(), &opts).unwrap();
    let by_owner = UnlockOptions::new().owner("rid");
    for i in 0..2 {
        let u = a
            .unlock_with(&key, &by_owner.clone().request_id("rs-1"))
            .unwrap();
        assert_eq!((u.released, u.count), (false, 1), "unlock {}", i + 1);
    }
    let info = b
        .call(
            "lock.info",
            Json::object()
                .set("key", key.as_str())
                .set("token", h1.token()),
        )
        .unwrap();
    assert_eq!(info.get("count").and_then(Json::as_i64), Some(1));
    assert!(b.try_lock(key.as_str(), &try_once()).unwrap().is_none());
    let long = "r".repeat(65);
    let err = a
        .unlock_with(&key, &by_owner.clone().request_id(&long))
        .unwrap_err();
    assert_eq!(err.code(), "bad_request");
    let err = a.unlock_with(&key, &UnlockOptions::new()).unwrap_err();
    assert_eq!(err.code(), "invalid");
    let u = b
        .unlock_with(
            &key,
            &UnlockOptions::new().token(h1.token()).request_id("rs-2"),
        )
        .unwrap();
    assert!(u.released);
    let err = a
        .unlock_with(&key, &by_owner.request_id("rs-3"))
        .unwrap_err();
    assert_eq!(err.code(), "not_held");
    // Both holds were released above: the guards' own unlocks find nothing.
    drop((h1, h2));
}

#[test]
fn rate_acquire_bursts_refuses_and_waits() {
    let ld = client();
    let key = k("rate");
    let slow = RateOptions::new().burst(2);
    for i in 0..2 {
        let r = ld.rate_acquire(&key, 1, 60_000, &slow).unwrap();
        assert!(r.acquired, "grant {}", i + 1);
    }
    let r = ld.rate_acquire(&key, 1, 60_000, &slow).unwrap();
    assert!(!r.acquired && r.retry_after_ms > 0, "{:?}", r);
    let err = ld
        .rate_acquire(&key, 1, 60_000, &slow.clone().permits(3))
        .unwrap_err();
    assert_eq!(err.code(), "bad_request");
    // 20 a second, one at a time: the second waits about 50 ms.
    let fast = k("rate:fast");
    let one = RateOptions::new().burst(1);
    assert!(ld.rate_acquire(&fast, 20, 1000, &one).unwrap().acquired);
    let r = ld
        .rate_acquire(&fast, 20, 1000, &one.wait_ms(10_000))
        .unwrap();
    assert!(r.acquired, "{:?}", r);
}

#[test]
fn warmed_entries_are_hits_and_errors_are_per_entry() {
    let ld = client();
    let (a, none, t) = (k("warm:a"), k("warm:none"), k("warm:t"));
    let w = ld
        .warm(
            &[
                WarmEntry::new(&a, Json::object().set("name", "Ada")),
                WarmEntry::new(&none, Json::Null).ttl_ms(30_000),
                WarmEntry::new("", "empty key"),
                WarmEntry::new(&t, "v").ttl_ms(0),
            ],
            Some(60_000),
        )
        .unwrap();
    assert_eq!(w.stored, 2);
    assert_eq!(w.errors.len(), 4);
    assert!(w.errors[0].is_none() && w.errors[1].is_none());
    assert_eq!(w.errors[2].as_ref().unwrap().code(), "bad_request");
    assert_eq!(w.errors[3].as_ref().unwrap().code(), "bad_request");
    let fail = || -> Result<Json, std::io::Error> { panic!("loaded a warmed key") };
    let v = ld.cached(&a, fail).unwrap();
    assert_eq!(v.get("name").and_then(Json::as_str), Some("Ada"));
    assert!(ld.cached(&none, fail).unwrap().is_null());
    assert_eq!(ld.warm(&[], None).unwrap_err().code(), "invalid");
    let many: Vec<WarmEntry> = (0..1001)
        .map(|i| WarmEntry::new(&k(&format!("warm:m{}", i)), i))
        .collect();
    assert_eq!(ld.warm(&many, None).unwrap_err().code(), "bad_request");
}

#[test]
fn bloom_filter_rules_keys_out_before_the_cache() {
    let ld = client();
    let (f, inside, outside) = (k("bloom"), k("bloom:in"), k("bloom:out"));
    let c = ld.bloom_create(&f, 1000, 0.01).unwrap();
    assert_eq!(c.get("created").and_then(Json::as_bool), Some(true));
    assert!(c.get("bits").and_then(Json::as_i64).unwrap_or(0) > 0);
    let again = ld.bloom_create(&f, 1000, 0.01).unwrap();
    assert_eq!(again.get("created").and_then(Json::as_bool), Some(false));
    assert_eq!(
        ld.bloom_create(&f, 2000, 0.01).unwrap_err().code(),
        "bad_request"
    );
    assert_eq!(ld.bloom_add(&f, inside.as_str()).unwrap(), vec![true]);
    assert_eq!(ld.bloom_add(&f, inside.as_str()).unwrap(), vec![false]);
    assert_eq!(
        ld.bloom_check(&f, vec![inside.clone(), outside.clone()])
            .unwrap(),
        vec![true, false]
    );
    let none = k("bloom:none");
    assert_eq!(
        ld.bloom_check(&none, inside.as_str()).unwrap_err().code(),
        "bad_request"
    );
    assert_eq!(
        ld.bloom_add(&f, Vec::<String>::new()).unwrap_err().code(),
        "invalid"
    );
    let loads = AtomicUsize::new(0);
    let opts = CacheOptions::new().bloom(&f);
    let load = || -> Result<Json, std::io::Error> {
        loads.fetch_add(1, Ordering::SeqCst);
        Ok(Json::from("v"))
    };
    assert!(ld.cached_with(&outside, &opts, load).unwrap().is_null());
    assert_eq!(
        ld.cached_with(&inside, &opts, load).unwrap().as_str(),
        Some("v")
    );
    assert_eq!(loads.load(Ordering::SeqCst), 1);
}

/// A compare-and-set that wins, one that loses with the current version,
/// and a fill over version 0.
#[test]
fn versioned_writes_compare_and_set() {
    let ld = client();
    let (a, f) = (k("ver:a"), k("ver:f"));
    let none = CacheOptions::new();
    let miss = ld.read(&a, false, &none).unwrap();
    assert!(!miss.hit && miss.version == 0 && miss.value.is_null());
    let w1 = ld
        .write(
            &a,
            Json::object().set("n", 1),
            &WriteOptions::new().if_version(0),
        )
        .unwrap();
    assert!(w1.stored && w1.version > 0, "{:?}", w1);
    let got = ld.read(&a, false, &none).unwrap();
    assert!(got.hit && got.version == w1.version);
    assert_eq!(got.value.get("n").and_then(Json::as_i64), Some(1));
    let cas = WriteOptions::new().if_version(got.version);
    let w2 = ld.write(&a, Json::object().set("n", 2), &cas).unwrap();
    assert!(w2.stored && w2.version > w1.version, "{:?}", w2);
    let late = ld.write(&a, "late", &cas).unwrap();
    assert_eq!((late.stored, late.version), (false, w2.version));
    let now = ld.read(&a, false, &none).unwrap();
    assert_eq!(now.value.get("n").and_then(Json::as_i64), Some(2));
    let lease = ld
        .read(&f, true, &none)
        .unwrap()
        .lease
        .expect("a lease on a miss");
    let w = ld
        .fill(&f, &lease, "x", &WriteOptions::new().if_version(7))
        .unwrap();
    assert_eq!((w.stored, w.version), (false, 0));
    let fw = ld
        .fill(&f, &lease, Json::Null, &WriteOptions::new().if_version(0))
        .unwrap();
    assert!(fw.stored);
    let nf = ld.read(&f, false, &none).unwrap();
    assert!(nf.hit && nf.value.is_null() && nf.version == fw.version);
    let err = ld
        .write(&a, "x", &WriteOptions::new().if_version(-1))
        .unwrap_err();
    assert_eq!(err.code(), "bad_request");
}
