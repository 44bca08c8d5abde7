//! Allocation tags ("kv_cache", "weights"): interned once into a small id, so tagging an
//! allocation costs a copy of a `u32`, not a string clone.

use parking_lot::RwLock;
use std::collections::HashMap;
use std::fmt;
use std::sync::OnceLock;

/// An interned tag. `Tag::new` is for set-up code; keep the `Tag` and reuse it per allocation.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tag(u32);

/// Id 0 means "no tag" inside the allocator's block records.
pub(crate) const UNTAGGED: u32 = 0;

#[derive(Default)]
struct Interner {
    ids: HashMap<String, u32>,
    names: Vec<String>,
}

fn interner() -> &'static RwLock<Interner> {
    static INTERNER: OnceLock<RwLock<Interner>> = OnceLock::new();
    INTERNER.get_or_init(|| {
        RwLock::new(Interner {
            ids: HashMap::new(),
            names: vec![String::new()],
        })
    })
}

impl Tag {
    pub fn new(name: &str) -> Tag {
        if let Some(&id) = interner().read().ids.get(name) {
            return Tag(id);
        }
        let mut table = interner().write();
        if let Some(&id) = table.ids.get(name) {
            return Tag(id);
        }
        let id = table.names.len() as u32;
        table.names.push(name.to_string());
        table.ids.insert(name.to_string(), id);
        Tag(id)
    }

    /// The tag as a number, for a host that keeps it in an atomic (the C ABI's default tag);
    /// [`from_id`](Self::from_id) turns it back. Never 0.
    pub fn id(self) -> u32 {
        self.0
    }

    /// The tag a number from [`id`](Self::id) stands for; `None` for 0 (no tag).
    pub fn from_id(id: u32) -> Option<Tag> {
        (id != UNTAGGED).then_some(Tag(id))
    }

    pub fn name(self) -> String {
        interner()
            .read()
            .names
            .get(self.0 as usize)
            .cloned()
            .unwrap_or_default()
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_name_interns_to_the_same_tag() {
        let a = Tag::new("kv_cache");
        assert_eq!(a, Tag::new("kv_cache"));
        assert_ne!(a, Tag::new("weights"));
        assert_eq!(a.name(), "kv_cache");
        assert_eq!(Tag::from_id(a.id()), Some(a));
        assert_eq!(Tag::from_id(UNTAGGED), None);
    }
}
