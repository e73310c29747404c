//! FIFO on the host backend: CPU threads push through the device handle, the test polls/pops.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use mscclpp::fifo::{Fifo, ProxyTrigger, TRIGGER_COMMIT_BIT};

const T: Duration = Duration::from_secs(20);

fn test_trigger(k: u64) -> ProxyTrigger {
    ProxyTrigger {
        fst: k,
        snd: k.wrapping_mul(0x9E37_79B9_7F4A_7C15) & !TRIGGER_COMMIT_BIT,
    }
}

/// Polls until a trigger arrives (bounded).
fn next(fifo: &Fifo) -> ProxyTrigger {
    let start = Instant::now();
    loop {
        if let Some(t) = fifo.poll() {
            return t;
        }
        assert!(
            start.elapsed() < T,
            "no trigger within {T:?} at tail {}",
            fifo.tail()
        );
        std::thread::yield_now();
    }
}

#[test]
fn empty_fifo_polls_none() {
    let fifo = Fifo::new_host(8).expect("fifo");
    assert!(fifo.poll().is_none());
    let h = fifo.device_handle();
    assert_eq!(h.size, 8);
    assert!(
        !h.triggers.is_null() && !h.head.is_null() && !h.tail.is_null() && !h.tail_cache.is_null()
    );
}

#[test]
fn single_pusher_wraps_many_laps() {
    let size = 4u32;
    let fifo = Fifo::new_host(size).expect("fifo");
    let h = fifo.device_handle();
    let n = 1000u64; // 250 laps
    std::thread::scope(|s| {
        s.spawn(move || {
            for k in 0..n {
                // SAFETY: the fifo outlives the scope; host backend memory.
                let pos = unsafe { h.push(test_trigger(k), T) }.expect("push");
                assert_eq!(pos, k);
            }
        });
        for k in 0..n {
            let t = next(&fifo);
            let want = test_trigger(k);
            assert_eq!(t.fst, want.fst, "trigger {k}");
            assert_eq!(t.snd & !TRIGGER_COMMIT_BIT, want.snd, "trigger {k}");
            assert_eq!(
                t.commit(),
                (k / u64::from(size)) % 2 == 0,
                "lap parity of {k}"
            );
            // Not popped yet: polling again returns the same trigger.
            assert_eq!(fifo.poll(), Some(t));
            fifo.pop();
        }
    });
    assert!(fifo.poll().is_none());
    assert_eq!(fifo.tail(), n);
}

#[test]
fn concurrent_pushers_each_in_order() {
    let fifo = Fifo::new_host(16).expect("fifo");
    let h = fifo.device_handle();
    let (threads, per) = (4u64, 2000u64);
    std::thread::scope(|s| {
        for g in 0..threads {
            s.spawn(move || {
                for j in 0..per {
                    // SAFETY: as above.
                    unsafe { h.push(test_trigger(g * per + j), T) }.expect("push");
                }
            });
        }
        let mut last: HashMap<u64, u64> = HashMap::new();
        for _ in 0..threads * per {
            let t = next(&fifo);
            let k = t.fst;
            assert_eq!(
                t.snd & !TRIGGER_COMMIT_BIT,
                test_trigger(k).snd,
                "payload of {k}"
            );
            let g = k / per;
            assert!(g < threads, "unknown trigger {k}");
            if let Some(prev) = last.insert(g, k) {
                assert!(k > prev, "thread {g}: {k} after {prev}");
            } else {
                assert_eq!(k, g * per, "thread {g} starts at its first trigger");
            }
            fifo.pop();
        }
        for g in 0..threads {
            assert_eq!(
                last.get(&g),
                Some(&(g * per + per - 1)),
                "thread {g} finished"
            );
        }
    });
}

#[test]
fn sync_waits_for_pop_and_push_waits_for_space() {
    let fifo = Fifo::new_host(2).expect("fifo");
    let h = fifo.device_handle();
    // SAFETY: as above.
    unsafe {
        let p0 = h.push(test_trigger(0), T).expect("push 0");
        assert!(
            h.sync(p0, Duration::from_millis(20)).is_err(),
            "not popped yet"
        );
        h.push(test_trigger(1), T).expect("push 1");
        assert!(
            h.push(test_trigger(2), Duration::from_millis(20)).is_err(),
            "full FIFO times out"
        );
    }
    // The timed-out push took position 2 from head; pop 0 and 1 and the slot frees.
    fifo.pop();
    fifo.pop();
    // SAFETY: as above.
    unsafe { h.sync(1, T) }.expect("tail passed 1");
}
