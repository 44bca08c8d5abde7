//! Enums a person picks by name — in a flag, a `GPUMEM_*` variable or a config file: each lists
//! its names once, and every reader (the command line, the C ABI, config files) parses and
//! describes them from that list.

/// One name a value answers to.
#[derive(Clone, Copy, Debug)]
pub struct Choice<T: 'static> {
    pub name: &'static str,
    pub value: T,
    /// A line for `--help`; empty when the name says it all.
    pub help: &'static str,
    /// Other spellings accepted and not advertised.
    pub aliases: &'static [&'static str],
}

impl<T: Copy> Choice<T> {
    /// A choice without help or aliases.
    pub const fn plain(name: &'static str, value: T) -> Self {
        Choice {
            name,
            value,
            help: "",
            aliases: &[],
        }
    }
}

/// An enum with a fixed set of names.
pub trait Named: Copy + PartialEq + 'static {
    /// Every value, in the order help lists them.
    const CHOICES: &'static [Choice<Self>];

    /// The value `text` names (case-insensitive, aliases included), or an error listing the
    /// names.
    fn from_name(text: &str) -> Result<Self, String> {
        let wanted = text.trim();
        Self::CHOICES
            .iter()
            .find(|c| {
                c.name.eq_ignore_ascii_case(wanted)
                    || c.aliases.iter().any(|a| a.eq_ignore_ascii_case(wanted))
            })
            .map(|c| c.value)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::CHOICES.iter().map(|c| c.name).collect();
                format!("'{text}' is not one of {}", names.join(", "))
            })
    }

    /// The name a value is written with.
    fn name(self) -> &'static str {
        Self::CHOICES
            .iter()
            .find(|c| c.value == self)
            .map_or("?", |c| c.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::BackendChoice;

    #[test]
    fn names_parse_case_insensitively_and_errors_list_them() {
        assert_eq!(BackendChoice::from_name("CUDA"), Ok(BackendChoice::Cuda));
        assert_eq!(BackendChoice::Sim.name(), "sim");
        let err = BackendChoice::from_name("rocm").unwrap_err();
        assert_eq!(err, "'rocm' is not one of auto, cuda, sim");
    }
}
