//! Allocation tags ("kv_cache", "weights"): interned into a small id, so tagging an allocation
//! costs a `u32` and one counter, not a string clone — and bounded, whatever a host passes.
//!
//! A tag's name is cleaned as the sidecar cleans the tags it collects ([`clean_tag`]: control
//! characters replaced, bidirectional and zero-width ones removed, at most [`MAX_TAG_CHARS`]
//! characters), so `/metrics`, the page and logs never carry an escape sequence or text that
//! reads backwards. At most [`MAX_TAGS`] names are held at once; a tag beyond them is
//! [`OTHER_TAG`], as the metrics fold small tags. A name's slot is given back as soon as no
//! [`Tag`] handle and no live allocation refer to it, so a host that tags every request with a
//! new name (a request id) holds the names of its live allocations only, not every name it ever
//! used.
//!
//! Counting: each slot has a counter of handles plus live allocations. Handles count through
//! `Clone`/`Drop`; an allocation counts from `alloc` to its free. Only the drop to zero takes the
//! table's write lock, and a slot is reused under a new generation, so an id kept as a number
//! ([`Tag::id`]) never names another tag.

use parking_lot::RwLock;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

/// Tag names are cut to this many characters (the sidecar's limit for collected tags).
pub const MAX_TAG_CHARS: usize = 64;
/// Distinct tag names held at once, `other` included; beyond them new names are `other`.
pub const MAX_TAGS: usize = 4096;
/// What a tag beyond [`MAX_TAGS`], or one with nothing left after cleaning, is called.
pub const OTHER_TAG: &str = "other";

/// Id 0 means "no tag" inside the allocator's block records.
pub(crate) const UNTAGGED: u32 = 0;
/// The slot of [`OTHER_TAG`], held for good.
const OTHER_SLOT: u32 = 1;
/// An id is `generation << SLOT_BITS | slot`.
const SLOT_BITS: u32 = 12;
const SLOT_MASK: u32 = (1 << SLOT_BITS) - 1;
const _: () = assert!(MAX_TAGS <= 1 << SLOT_BITS);

/// A tag name fit for a label, a log line and the page — the one rule for in-process tags and
/// the tags the sidecar collects: see [`crate::snapshot::process::clean_text`], at most
/// [`MAX_TAG_CHARS`] characters. May be empty.
pub fn clean_tag(name: &str) -> String {
    crate::snapshot::process::clean_text(name, MAX_TAG_CHARS)
}

/// An interned tag. `Tag::new` is for set-up code; keep the `Tag` and reuse it per allocation
/// (a clone is one counter increment, no string is copied).
#[derive(PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tag(u32);

impl Tag {
    /// The tag named `name`, cleaned ([`clean_tag`]); [`OTHER_TAG`] when [`MAX_TAGS`] names are
    /// already held or nothing is left of the name.
    pub fn new(name: &str) -> Tag {
        Tag(interner().intern(&clean_tag(name)))
    }

    /// The tag as a number, for a host that keeps it in an atomic; [`from_id`](Self::from_id)
    /// turns it back while the tag is still held. Never 0.
    pub fn id(&self) -> u32 {
        self.0
    }

    /// The tag a number from [`id`](Self::id) stands for, while some handle or live allocation
    /// still holds it; `None` for 0 (no tag) or a tag given back since.
    pub fn from_id(id: u32) -> Option<Tag> {
        interner().retain_if_held(id).then_some(Tag(id))
    }

    /// The tag's name.
    pub fn name(&self) -> String {
        name_of(self.0).map(|n| n.to_string()).unwrap_or_default()
    }

    /// Counts one allocation made with this tag; returns the id its block records. Undone by
    /// [`release`] when the allocation is freed.
    #[inline]
    pub(crate) fn retain_for_allocation(&self) -> u32 {
        interner().retain(self.0);
        self.0
    }
}

impl Clone for Tag {
    fn clone(&self) -> Self {
        interner().retain(self.0);
        Tag(self.0)
    }
}

impl Drop for Tag {
    fn drop(&mut self) {
        release(self.0);
    }
}

/// Gives back one count of `id` (a handle or an allocation); the last frees the name.
#[inline]
pub(crate) fn release(id: u32) {
    if id != UNTAGGED {
        interner().release(id);
    }
}

/// The name behind `id` while it is held (a live allocation's tag); `None` for no tag.
pub(crate) fn name_of(id: u32) -> Option<Arc<str>> {
    interner().name(id)
}

/// How many tag names are held now, `other` included (for tests and the documentation's
/// memory model).
pub fn held_tags() -> usize {
    interner().table.read().by_name.len()
}

impl fmt::Debug for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tag({:?})", self.name())
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

fn interner() -> &'static Interner {
    static INTERNER: OnceLock<Interner> = OnceLock::new();
    INTERNER.get_or_init(|| Interner::new(MAX_TAGS))
}

/// The names, their slots and counters; see the module documentation.
struct Interner {
    table: RwLock<Table>,
    /// Handles plus live allocations, per slot; read and changed without the table's lock.
    counts: Box<[AtomicU32]>,
}

struct Table {
    by_name: HashMap<Arc<str>, u32>,
    /// Per slot: the name and the full id (with its generation) while held.
    slots: Vec<Option<(Arc<str>, u32)>>,
    /// The generation the next use of each slot gets.
    generations: Vec<u32>,
    free: Vec<u32>,
}

impl Interner {
    fn new(capacity: usize) -> Interner {
        let capacity = capacity.clamp(2, 1 << SLOT_BITS);
        let other: Arc<str> = Arc::from(OTHER_TAG);
        let mut slots = vec![None; capacity];
        slots[OTHER_SLOT as usize] = Some((Arc::clone(&other), OTHER_SLOT));
        Interner {
            table: RwLock::new(Table {
                by_name: HashMap::from([(other, OTHER_SLOT)]),
                slots,
                generations: vec![0; capacity],
                // Lowest slots first, so a small table stays at the front.
                free: (OTHER_SLOT + 1..capacity as u32).rev().collect(),
            }),
            counts: (0..capacity).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    fn counter(&self, id: u32) -> &AtomicU32 {
        &self.counts[(id & SLOT_MASK) as usize]
    }

    /// The id of `name` with one more count: found, else a free slot, else `other`.
    fn intern(&self, name: &str) -> u32 {
        if name.is_empty() {
            return self.other();
        }
        {
            // Found under the read lock: a slot is freed only under the write lock, after its
            // count is seen at zero, so the count raised here keeps it.
            let table = self.table.read();
            if let Some(&id) = table.by_name.get(name) {
                self.retain(id);
                return id;
            }
        }
        let mut table = self.table.write();
        if let Some(&id) = table.by_name.get(name) {
            self.retain(id);
            return id;
        }
        let Some(slot) = table.free.pop() else {
            drop(table);
            return self.other();
        };
        let generation = table.generations[slot as usize];
        table.generations[slot as usize] = generation.wrapping_add(1) & (u32::MAX >> SLOT_BITS);
        let id = generation << SLOT_BITS | slot;
        let name: Arc<str> = Arc::from(name);
        table.slots[slot as usize] = Some((Arc::clone(&name), id));
        table.by_name.insert(name, id);
        self.counter(id).store(1, Ordering::Relaxed);
        id
    }

    fn other(&self) -> u32 {
        self.retain(OTHER_SLOT);
        OTHER_SLOT
    }

    /// One more count of a held id (the caller holds a count, or the read lock).
    #[inline]
    fn retain(&self, id: u32) {
        self.counter(id).fetch_add(1, Ordering::Relaxed);
    }

    /// One count fewer; at zero the slot is freed, unless it was taken again meanwhile.
    #[inline]
    fn release(&self, id: u32) {
        if self.counter(id).fetch_sub(1, Ordering::AcqRel) != 1 || id & SLOT_MASK == OTHER_SLOT {
            return;
        }
        let mut table = self.table.write();
        let slot = (id & SLOT_MASK) as usize;
        let still_this = matches!(&table.slots[slot], Some((_, held)) if *held == id);
        if !still_this || self.counter(id).load(Ordering::Acquire) != 0 {
            return;
        }
        if let Some((name, _)) = table.slots[slot].take() {
            table.by_name.remove(&name);
        }
        table.free.push(slot as u32);
        // Give the memory back once the table has shrunk well below what it grew to.
        if table.by_name.capacity() > 64 && table.by_name.len() < table.by_name.capacity() / 4 {
            let keep = table.by_name.len() * 2;
            table.by_name.shrink_to(keep);
        }
    }

    /// One more count of `id` if it is held now; false otherwise.
    fn retain_if_held(&self, id: u32) -> bool {
        if id == UNTAGGED {
            return false;
        }
        let table = self.table.read();
        let held = matches!(table.slots.get((id & SLOT_MASK) as usize), Some(Some((_, held))) if *held == id);
        if held {
            self.retain(id);
        }
        held
    }

    fn name(&self, id: u32) -> Option<Arc<str>> {
        if id == UNTAGGED {
            return None;
        }
        let table = self.table.read();
        match table.slots.get((id & SLOT_MASK) as usize) {
            Some(Some((name, held))) if *held == id => Some(Arc::clone(name)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_name_interns_to_the_same_tag() {
        let a = Tag::new("kv_cache");
        assert_eq!(a, Tag::new("kv_cache"));
        assert_ne!(a, Tag::new("weights"));
        assert_eq!(a.name(), "kv_cache");
        assert_eq!(Tag::from_id(a.id()), Some(a.clone()));
        assert_eq!(Tag::from_id(UNTAGGED), None);
    }

    #[test]
    fn names_are_cleaned_and_cut() {
        let long = Tag::new(&"x".repeat(1 << 20));
        assert_eq!(long.name().chars().count(), MAX_TAG_CHARS);
        assert_eq!(Tag::new("kv\u{1b}[31m\u{202E}cache").name(), "kv_[31mcache");
        assert_eq!(Tag::new("\u{202E}\u{200B}").name(), OTHER_TAG);
    }

    #[test]
    fn a_slot_is_freed_when_nothing_holds_it_and_reused_under_a_new_id() {
        let interner = Interner::new(4);
        let a = interner.intern("a");
        let b = interner.intern("b");
        assert_eq!(
            interner.intern("c"),
            OTHER_SLOT,
            "full: two slots and other"
        );
        interner.retain(a); // an allocation
        interner.release(a); // the handle goes; the allocation holds it
        assert_eq!(interner.name(a).as_deref(), Some("a"));
        interner.release(a); // freed
        assert_eq!(interner.name(a), None);
        assert!(!interner.retain_if_held(a), "an old id names nothing");
        let c = interner.intern("c");
        assert_eq!(c & SLOT_MASK, a & SLOT_MASK, "the slot is reused");
        assert_ne!(c, a, "under another generation");
        assert_eq!(interner.name(c).as_deref(), Some("c"));
        interner.release(b);
        interner.release(c);
        assert_eq!(interner.table.read().by_name.len(), 1, "only other is left");
    }

    #[test]
    fn racing_the_last_release_with_a_new_intern_never_loses_a_name() {
        let interner = Arc::new(Interner::new(8));
        std::thread::scope(|scope| {
            for _ in 0..4 {
                let interner = Arc::clone(&interner);
                scope.spawn(move || {
                    for _ in 0..20_000 {
                        let id = interner.intern("shared");
                        assert_eq!(interner.name(id).as_deref(), Some("shared"));
                        interner.release(id);
                    }
                });
            }
        });
        assert_eq!(interner.table.read().by_name.len(), 1);
    }
}
