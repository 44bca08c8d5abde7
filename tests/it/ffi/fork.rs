//! Children forked while threads are inside gpumem, as PyTorch's data-loader workers fork a
//! training process whose other threads keep allocating: whatever lock a parent's thread held
//! at the fork, every child must finish promptly. In a child the parent's memory is the
//! parent's (a free is ignored), and an allocation is refused with a reason, since CUDA does not
//! survive a fork. The host runs in a process of its own ([`host_that_forks`]), so no other
//! test's threads are forked with it.

// fork(2), waitpid(2) and calling the C ABI as a C host would all take `unsafe`.
#![allow(unsafe_code)]

use super::abi::take;
use capi::*;
use gpumem::manager::MemoryConfig;
use gpumem::MemoryManager;
use std::collections::VecDeque;
use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Set in the host's process only.
const HOST: &str = "GPUMEM_TEST_FORK_HOST";
const CHILDREN: usize = 24;
const THREADS: usize = 4;
/// How long all children together may take; each needs a few milliseconds.
const DEADLINE: Duration = Duration::from_secs(15);
const MIB: isize = 1 << 20;

/// What a child found, as its exit status (0: all as it should be).
mod status {
    pub(super) const ALLOCATED: i32 = 2;
    pub(super) const NO_REASON: i32 = 3;
    pub(super) const TAG_REFUSED: i32 = 4;
}

fn set_tag(name: &str) -> i32 {
    let name = CString::new(name).expect("no NUL");
    // SAFETY: a valid C string for the call.
    unsafe { gpumem_set_tag(name.as_ptr()) }
}

/// One thread of the parent: allocates, frees, tags, marks buffers used on another stream and
/// (thread 0) reads statistics and snapshots, until `stop`, so that at any fork some thread is
/// likely to hold one of the library's locks.
fn keep_busy(thread: usize, stop: &AtomicBool) {
    let sizes = [512, 4096, 64 << 10, MIB, 3 * MIB];
    let stream = (thread % 2 * 0x1000) as *mut c_void;
    let mut live: VecDeque<(*mut c_void, isize)> = VecDeque::new();
    let mut round = 0usize;
    while !stop.load(Relaxed) {
        set_tag(&format!("worker-{thread}-{}", round % 50));
        let size = sizes[round % sizes.len()];
        let ptr = gpumem_alloc(size, 0, stream);
        assert!(!ptr.is_null(), "the parent allocates");
        if round.is_multiple_of(7) {
            gpumem_record_stream(ptr, 0x2000 as *mut c_void);
        }
        live.push_back((ptr, size));
        if live.len() > 8 {
            let (old, size) = live.pop_front().expect("one");
            gpumem_free(old, size, 0, stream);
        }
        if thread == 0 && round.is_multiple_of(16) {
            take(gpumem_memory_stats_json(0)).expect("statistics");
            take(gpumem_snapshot_json()).expect("a snapshot");
        }
        round += 1;
    }
    for (ptr, size) in live {
        gpumem_free(ptr, size, 0, stream);
    }
}

/// What a forked child does: what a data-loader worker might (free a tensor it inherited, tag,
/// read statistics, try to allocate), then exit. It must not panic or print: the harness's
/// locks were copied too. Its answer is the exit status.
fn in_child(parent_buffer: *mut c_void) -> i32 {
    gpumem_free(parent_buffer, MIB, 0, std::ptr::null_mut());
    if set_tag("child") != 0 {
        return status::TAG_REFUSED;
    }
    let ptr = gpumem_alloc(4096, 0, std::ptr::null_mut());
    if !ptr.is_null() {
        return status::ALLOCATED;
    }
    if !take(gpumem_last_error()).is_some_and(|e| e.contains("forked")) {
        return status::NO_REASON;
    }
    take(gpumem_memory_stats_json(0));
    take(gpumem_snapshot_json());
    gpumem_empty_cache();
    gpumem_reset_peak_stats();
    gpumem_record_stream(parent_buffer, 0x3000 as *mut c_void);
    0
}

/// How the children ended.
#[derive(Default, Debug)]
struct Outcome {
    as_expected: usize,
    /// (child, exit status or -signal) of children that finished with a wrong answer.
    wrong: Vec<(usize, i32)>,
    /// Children still running at the deadline (killed).
    hung: Vec<usize>,
}

/// Waits for every child until the deadline, then kills and reaps the rest.
fn reap(children: Vec<(usize, libc::pid_t)>) -> Outcome {
    let mut outcome = Outcome::default();
    let mut pending = children;
    let deadline = Instant::now() + DEADLINE;
    while !pending.is_empty() && Instant::now() < deadline {
        pending.retain(|&(child, pid)| {
            let mut status = 0;
            // SAFETY: `pid` is a child of this process not yet reaped; `status` is writable.
            let reaped = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if reaped != pid {
                return true;
            }
            let code = if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                -libc::WTERMSIG(status)
            };
            if code == 0 {
                outcome.as_expected += 1;
            } else {
                outcome.wrong.push((child, code));
            }
            false
        });
        std::thread::sleep(Duration::from_millis(10));
    }
    for (child, pid) in pending {
        let mut status = 0;
        // SAFETY: as above; the child is killed, then reaped so that no zombie is left.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, &mut status, 0);
        }
        outcome.hung.push(child);
    }
    outcome
}

/// The host: run only as the child of [`children_of_a_busy_process_never_block`].
#[test]
#[ignore = "run by children_of_a_busy_process_never_block in a process of its own"]
fn host_that_forks() {
    if std::env::var_os(HOST).is_none() {
        return;
    }
    let backend = super::one_device(4 << 30);
    // One pool per stream shared by all threads, as the C ABI opens its own manager.
    let config = MemoryConfig {
        shards: 1,
        ..MemoryConfig::default()
    };
    capi::install(MemoryManager::new(backend, config).expect("manager")).expect("installed");
    set_tag("forking-thread");
    let parent_buffer = gpumem_alloc(MIB, 0, std::ptr::null_mut());
    assert!(!parent_buffer.is_null());
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..THREADS)
        .map(|thread| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || keep_busy(thread, &stop))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(50));
    let mut children = Vec::new();
    for child in 0..CHILDREN {
        std::thread::sleep(Duration::from_millis(2 + child as u64 % 3));
        // SAFETY: fork(2); the child runs only `in_child` and leaves through exit(3) or
        // _exit(2), never returning into the test harness.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let code = in_child(parent_buffer);
            // Half leave through exit(3), which runs the thread's destructors as a Python
            // child returning from its work would; half through _exit(2), as multiprocessing's
            // workers do.
            // SAFETY: ends this forked process.
            unsafe {
                if child % 2 == 0 {
                    libc::_exit(code)
                } else {
                    libc::exit(code)
                }
            }
        }
        children.push((child, pid));
    }
    let outcome = reap(children);
    stop.store(true, Relaxed);
    for thread in threads {
        thread.join().expect("a busy thread");
    }
    gpumem_free(parent_buffer, MIB, 0, std::ptr::null_mut());
    let live = take(gpumem_memory_stats_json(0)).expect("the parent's statistics");
    println!(
        "fork host: {CHILDREN} children forked while {THREADS} threads used the library: {} as \
         expected, {} with a wrong answer (child, status: {:?}), {} hung and killed after {} s \
         ({:?})",
        outcome.as_expected,
        outcome.wrong.len(),
        outcome.wrong,
        outcome.hung.len(),
        DEADLINE.as_secs(),
        outcome.hung
    );
    assert!(
        outcome.hung.is_empty() && outcome.wrong.is_empty(),
        "{outcome:?}"
    );
    let live: serde_json::Value = serde_json::from_str(&live).expect("JSON");
    assert_eq!(
        live["ffi_live_allocations"], 0,
        "the parent's buffers are its own, whatever its children freed"
    );
}

#[test]
fn children_of_a_busy_process_never_block() {
    super::run_alone("ffi::fork::host_that_forks", HOST, "fork host:");
}
