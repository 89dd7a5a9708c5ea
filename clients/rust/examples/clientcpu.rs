//! The client's CPU per uncontended lock+unlock pair, for
//! bench/peers/clientcpu.sh: WORKERS threads, each on its own key, do
//! PAIRS pairs in all over CONNS clients (1: every thread shares one
//! `Leased`); the process's user+system CPU time over them, per pair, as
//! one JSON line like clientcpu.py's.
//!
//!     clientcpu --sock=PATH [--workers=50] [--pairs=30000] [--conns=1]
//!               [--label=now]

use leased::{Leased, LockOptions};
use std::collections::HashMap;
use std::thread;
use std::time::Instant;

/// User+system CPU seconds of this process, from /proc/self/stat (in
/// USER_HZ, 100 per second on Linux).
fn cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name, which is in parentheses.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

fn run(clients: &[Leased], workers: usize, pairs: usize, tag: &str) {
    let threads: Vec<_> = (0..workers)
        .map(|w| {
            let c = clients[w % clients.len()].clone();
            let n = pairs / workers + usize::from(w < pairs % workers);
            let key = format!("clientcpu:rust:{}:{}:{}", tag, std::process::id(), w);
            thread::spawn(move || {
                let opts = LockOptions::new();
                for _ in 0..n {
                    let held = c.lock(key.as_str(), &opts).expect("lock");
                    held.unlock().expect("unlock");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a worker failed");
    }
}

fn main() {
    let opt: HashMap<String, String> = std::env::args()
        .skip(1)
        .filter_map(|a| {
            let (k, v) = a.trim_start_matches("--").split_once('=')?;
            Some((k.to_string(), v.to_string()))
        })
        .collect();
    let num = |k: &str, d: usize| opt.get(k).and_then(|v| v.parse().ok()).unwrap_or(d);
    let (workers, pairs, conns) = (num("workers", 50), num("pairs", 30000), num("conns", 1));
    let sock = opt.get("sock").cloned().unwrap_or_default();
    let clients: Vec<Leased> = (0..conns.max(1))
        .map(|_| Leased::connect(&sock).expect("connect"))
        .collect();
    run(&clients, workers, pairs.min(1000), "warm");
    let (c0, t0) = (cpu(), Instant::now());
    run(&clients, workers, pairs, "m");
    let (c1, t) = (cpu(), t0.elapsed().as_secs_f64());
    println!(
        "{{\"lang\":\"rust\",\"label\":\"{}\",\"workers\":{},\"pairs\":{},\"conns\":{},\
         \"cpu_us_per_pair\":{},\"pairs_per_s\":{}}}",
        opt.get("label").map_or("now", String::as_str),
        workers,
        pairs,
        conns,
        (c1 - c0) * 1e6 / pairs as f64,
        pairs as f64 / t
    );
}
