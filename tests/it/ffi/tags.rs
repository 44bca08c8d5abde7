//! Tags from a host that is not careful with them, through the C ABI: a new tag per request
//! (300,000 of them) must not grow the host's memory by more than 32 MiB, since a name is given
//! back once nothing holds it; a 1 MiB tag is cut to 64 characters; escape sequences and
//! bidirectional overrides never reach the snapshot or `/metrics`.
//!
//! The memory figure comes from a process of its own (this test binary run again on just
//! [`host_of_300k_tags`]), so no other test's allocations move it.

// Calling the C ABI as a C host would takes `unsafe`, as it does for any host.
#![allow(unsafe_code)]

use capi::*;
use gpumem::backend::sim::{SimBackend, SimConfig};
use gpumem::manager::{held_tags, MemoryConfig, MAX_TAGS, MAX_TAG_CHARS};
use gpumem::{AllocOptions, MemoryManager, Tag};
use std::collections::VecDeque;
use std::ffi::{c_void, CStr, CString};
use std::sync::Arc;

const TAGS: usize = 300_000;
/// Allocations kept live at once, each under its own tag: more than the table holds, so the
/// cap (`other`) and the reuse of freed names are both exercised.
const LIVE: usize = MAX_TAGS + 1000;
const GROWTH_LIMIT_KIB: u64 = 32 * 1024;
/// Set in the child process only.
const CHILD: &str = "GPUMEM_TEST_TAG_HOST";

fn rss_kib() -> u64 {
    crate::reliability::rss_kib(std::process::id()).expect("this process's VmRSS")
}

fn set_tag(name: &str) {
    let name = CString::new(name).expect("no NUL");
    // SAFETY: a valid C string for the call.
    assert_eq!(unsafe { gpumem_set_tag(name.as_ptr()) }, 0);
}

fn snapshot() -> String {
    let text = gpumem_snapshot_json();
    assert!(!text.is_null());
    // SAFETY: a non-null string from the library, released once right after.
    let copy = unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: as above.
    unsafe { gpumem_string_free(text) };
    copy
}

/// The host: run only as the child of [`a_new_tag_per_request_costs_the_live_tags_only`].
#[test]
#[ignore = "run by a_new_tag_per_request_costs_the_live_tags_only in a process of its own"]
fn host_of_300k_tags() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let backend = super::one_device(8 << 30);
    let manager = MemoryManager::new(backend, MemoryConfig::default()).expect("manager");
    capi::install(manager).expect("installed");
    let name = |i: usize| format!("request-{i:010}/decoder.layers.attention.output_proj");
    let mut live: VecDeque<*mut c_void> = VecDeque::with_capacity(LIVE + 1);
    let round = |i: usize, live: &mut VecDeque<*mut c_void>| {
        set_tag(&name(i));
        let ptr = gpumem_alloc(4096, 0, std::ptr::null_mut());
        assert!(!ptr.is_null());
        live.push_back(ptr);
        if live.len() > LIVE {
            let oldest = live.pop_front().expect("one");
            gpumem_free(oldest, 4096, 0, std::ptr::null_mut());
        }
    };
    // Warm up: the pools, the live map and the tag table reach their working size.
    for i in 0..2 * LIVE {
        round(i, &mut live);
    }
    let before = rss_kib();
    for i in 2 * LIVE..TAGS {
        round(i, &mut live);
    }
    let after = rss_kib();
    let held_while_live = held_tags();
    for ptr in live.drain(..) {
        gpumem_free(ptr, 4096, 0, std::ptr::null_mut());
    }
    // SAFETY: null clears the tag.
    assert_eq!(unsafe { gpumem_set_tag(std::ptr::null()) }, 0);
    println!(
        "tag host: {TAGS} tags, {LIVE} live at once: VmRSS {before} -> {after} KiB; \
         {held_while_live} names held with them live, {} after they were freed",
        held_tags()
    );
    assert!(held_while_live <= MAX_TAGS, "{held_while_live} names held");
    assert!(held_tags() <= 8, "{} names still held", held_tags());
    assert!(
        after.saturating_sub(before) < GROWTH_LIMIT_KIB,
        "{TAGS} tags grew the host by {} KiB",
        after - before
    );
}

#[test]
fn a_new_tag_per_request_costs_the_live_tags_only() {
    super::run_alone("ffi::tags::host_of_300k_tags", CHILD, "tag host:");
}

#[test]
fn hostile_tags_are_cut_and_cleaned_before_any_output() {
    let _turn = super::abi::abi();
    let huge = format!("{}{}", "h".repeat(MAX_TAG_CHARS - 4), "x".repeat(1 << 20));
    for (given, shown) in [
        (
            huge.as_str(),
            format!("{}xxxx", "h".repeat(MAX_TAG_CHARS - 4)),
        ),
        (
            "evil\u{1b}[2J\u{202E}gnp.exe",
            "evil_[2Jgnp.exe".to_string(),
        ),
    ] {
        set_tag(given);
        // Large, so it is among the tags the snapshot lists by name.
        let ptr = gpumem_alloc(64 << 20, 0, std::ptr::null_mut());
        assert!(!ptr.is_null());
        let json = snapshot();
        gpumem_free(ptr, 64 << 20, 0, std::ptr::null_mut());
        let snapshot: serde_json::Value = serde_json::from_str(&json).expect("JSON");
        let tags: Vec<&str> = snapshot["devices"][0]["by_tag"]
            .as_array()
            .expect("by_tag")
            .iter()
            .filter_map(|g| g["tag"].as_str())
            .collect();
        assert!(tags.contains(&shown.as_str()), "{shown:?} not in {tags:?}");
        for tag in tags {
            assert!(tag.chars().count() <= MAX_TAG_CHARS, "{tag}");
            assert!(!tag.contains(['\u{1b}', '\u{202E}']), "{tag:?}");
        }
    }
    // SAFETY: null clears the tag.
    assert_eq!(unsafe { gpumem_set_tag(std::ptr::null()) }, 0);
}

#[test]
fn escape_sequences_and_bidi_overrides_never_reach_metrics() {
    let sim = Arc::new(SimBackend::new(SimConfig::default()));
    let manager = MemoryManager::new(sim, MemoryConfig::default()).expect("manager");
    let options = AllocOptions::tagged(Tag::new("evil\u{1b}[2J\u{202E}gnp.exe"));
    let _buffer = manager.alloc(0, 64 << 20, &options).expect("alloc");
    let exporter = gpumem_observe::Exporter::builder()
        .manager(manager)
        .listen(([127, 0, 0, 1], 0))
        .interval(std::time::Duration::from_millis(100))
        .spawn()
        .expect("exporter");
    for path in ["/metrics", "/", "/api/v1/snapshot"] {
        let reply = crate::web::get(exporter.local_addr(), path);
        assert_eq!(reply.status, 200, "{path}");
        assert!(
            reply.body.contains("evil_[2Jgnp.exe"),
            "{path}: the tag is shown, cleaned"
        );
        assert!(
            !reply.body.contains(['\u{1b}', '\u{202E}']),
            "{path} carries the raw tag"
        );
    }
    exporter.shutdown();
}
