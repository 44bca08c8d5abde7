//! Allocation tags ("kv_cache", "weights"): interned into a small id, so tagging an allocation
//! costs a `u32` and one counter, not a string clone — and bounded, whatever a host passes.
//!
//! A tag's name is cleaned as a collector cleans the tags it collects ([`clean_tag`]: control
//! characters replaced, bidirectional and zero-width ones removed, at most [`MAX_TAG_CHARS`]
//! characters), so `/metrics`, the page and logs never carry an escape sequence or text that
//! reads backwards. At most [`MAX_TAGS`] names are held at once; a tag beyond them is
//! [`OTHER_TAG`], as the metrics fold small tags. A name's slot is given back as soon as no
//! [`Tag`] handle and no live allocation refer to it, so a host that tags every request with a
//! new name (a request id) holds the names of its live allocations only, not every name it ever
//! used.
//!
//! Counting (`interner`): handles count through `Clone`/`Drop`, on one counter per name; live
//! allocations count from `alloc` to their free, on counters kept per group of threads, so that
//! threads allocating under one tag (or neighbouring ones) never share a cache line on that
//! path. A name is given back when its last handle goes and no allocation lives, or else by the
//! free of its last allocation. A slot is reused under a new generation, so an id kept as a
//! number ([`Tag::id`]) never names another tag.

mod interner;

use interner::Interner;
use std::fmt;
use std::sync::{Arc, OnceLock};

/// Tag names are cut to this many characters (a collector's limit for collected tags).
pub const MAX_TAG_CHARS: usize = 64;
/// Distinct tag names held at once, `other` included; beyond them new names are `other`.
pub const MAX_TAGS: usize = 4096;
/// What a tag beyond [`MAX_TAGS`], or one with nothing left after cleaning, is called.
pub const OTHER_TAG: &str = "other";

/// Id 0 means "no tag" inside the allocator's block records.
pub(crate) const UNTAGGED: u32 = 0;

/// A tag name fit for a label, a log line and the page — the one rule for in-process tags and
/// the tags a collector collects: see [`gpumem_wire::process::clean_text`], at most
/// [`MAX_TAG_CHARS`] characters. May be empty.
pub fn clean_tag(name: &str) -> String {
    gpumem_wire::process::clean_text(name, MAX_TAG_CHARS)
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
    /// [`release_allocation`] when the allocation is freed.
    #[inline]
    pub(crate) fn retain_for_allocation(&self) -> u32 {
        interner().retain_allocation(self.0);
        self.0
    }
}

impl Clone for Tag {
    fn clone(&self) -> Self {
        interner().retain_handle(self.0);
        Tag(self.0)
    }
}

impl Drop for Tag {
    fn drop(&mut self) {
        interner().release_handle(self.0);
    }
}

/// The allocation counted by [`Tag::retain_for_allocation`] is freed; the last one of a tag no
/// handle holds gives its name back.
#[inline]
pub(crate) fn release_allocation(id: u32) {
    if id != UNTAGGED {
        interner().release_allocation(id);
    }
}

/// The name behind `id` while it is held (a live allocation's tag); `None` for no tag.
pub(crate) fn name_of(id: u32) -> Option<Arc<str>> {
    interner().name(id)
}

/// How many tag names are held now, `other` included (for tests and the documentation's
/// memory model).
pub fn held_tags() -> usize {
    interner().held()
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
}
