//! Where each setting came from, and the one precedence rule every command follows:
//! built-in defaults < the `--config` file < `GPUMEM_*` variables < flags given on the command
//! line. clap fills every flag with its default, so [`Given`] asks clap which flags the user
//! set (on the command line or through their variable); only those override the file.
//! Also here: the warning for a `GPUMEM_*` variable nobody reads (a misspelling, usually).

use clap::parser::ValueSource;
use clap::ArgMatches;
use std::collections::HashSet;

/// The flags of one command that the user set, by clap id (`leak_age`, `devices`).
#[derive(Debug, Default)]
pub(crate) struct Given(HashSet<String>);

impl Given {
    pub(crate) fn from_matches(matches: &ArgMatches) -> Self {
        let set = matches
            .ids()
            .filter(|id| {
                matches!(
                    matches.value_source(id.as_str()),
                    Some(ValueSource::CommandLine | ValueSource::EnvVariable)
                )
            })
            .map(|id| id.as_str().to_string())
            .collect();
        Given(set)
    }

    /// Whether the user set the flag with this id (its field name), by flag or variable.
    pub(crate) fn explicit(&self, id: &str) -> bool {
        self.0.contains(id)
    }
}

/// Variables read outside the CLI's flags and config keys: the log filter, the Python
/// package's (a user who sets them for PyTorch runs the CLI in the same environment) and the
/// test suite's own.
const OTHER_VARIABLES: &[&str] = &[
    "GPUMEM_LOG",
    "GPUMEM_PROCESS_NAME",
    "GPUMEM_LIBRARY",
    "GPUMEM_TORCH",
    "GPUMEM_TORCH_SERVE",
    "GPUMEM_TORCH_PUBLISH",
    "GPUMEM_TORCH_LAYER",
    "GPUMEM_TORCH_LAYER_DIR",
    "GPUMEM_TORCH_LAYER_DEBUG",
    "GPUMEM_BINARY",
    "GPUMEM_REQUIRE_GPU",
    "GPUMEM_REQUIRE_GPUS",
    "GPUMEM_BENCH_BACKEND",
];

/// Every `GPUMEM_*` variable gpumem reads: each flag's, each config key's, and the others.
pub(super) fn known_variables(command: &clap::Command) -> Vec<String> {
    let mut known: Vec<String> = OTHER_VARIABLES.iter().map(|v| v.to_string()).collect();
    known.extend(gpumem::manager::config_env_names());
    let mut stack = vec![command];
    while let Some(command) = stack.pop() {
        for arg in command.get_arguments() {
            if let Some(env) = arg.get_env() {
                known.push(env.to_string_lossy().into_owned());
            }
        }
        stack.extend(command.get_subcommands());
    }
    known.sort();
    known.dedup();
    known
}

/// One warning line for each set `GPUMEM_*` variable that gpumem does not read, naming the
/// nearest one it does: a misspelled variable otherwise changes nothing, silently.
pub(super) fn unknown_variable_warnings(set: &[String], known: &[String]) -> Vec<String> {
    set.iter()
        .filter(|name| name.starts_with("GPUMEM_") && !known.contains(name))
        .map(|name| {
            if let Some(instead) = gpumem::manager::retired_config_key(name) {
                return format!("gpumem: warning: {name} is ignored: it {instead}");
            }
            let nearest = known
                .iter()
                .min_by_key(|candidate| edit_distance(name, candidate));
            match nearest {
                Some(nearest) if edit_distance(name, nearest) <= name.len() / 2 => format!(
                    "gpumem: warning: {name} is not a gpumem variable and is ignored; \
                     did you mean {nearest}?"
                ),
                _ => format!(
                    "gpumem: warning: {name} is not a gpumem variable and is ignored \
                     (gpumem --help lists each flag's variable)"
                ),
            }
        })
        .collect()
}

/// An error about a flag whose value came from its variable names the variable, since that is
/// what the user wrote (in a manifest, say): `--interval: …` becomes
/// `GPUMEM_INTERVAL: … (the variable of --interval)`. Other messages are returned as they are.
pub(super) fn name_the_variable(
    message: &str,
    command: &clap::Command,
    matches: &ArgMatches,
) -> String {
    let Some((name, sub_matches)) = matches.subcommand() else {
        return message.to_string();
    };
    let Some(sub) = command.find_subcommand(name) else {
        return message.to_string();
    };
    let Some(rest) = message.strip_prefix("--") else {
        return message.to_string();
    };
    let Some((long, detail)) = rest.split_once(": ") else {
        return message.to_string();
    };
    let arg = sub
        .get_arguments()
        .chain(command.get_arguments())
        .find(|arg| arg.get_long() == Some(long));
    let Some(arg) = arg else {
        return message.to_string();
    };
    let from_variable =
        sub_matches.value_source(arg.get_id().as_str()) == Some(ValueSource::EnvVariable);
    match (from_variable, arg.get_env()) {
        (true, Some(variable)) => format!(
            "{}: {detail} (the variable of --{long})",
            variable.to_string_lossy()
        ),
        _ => message.to_string(),
    }
}

/// clap's refusal of a value that came from a `GPUMEM_*` variable, as one line naming the
/// variable: clap itself names only the flag (`invalid value 'abc' for '--max-connections
/// <N>'`) and adds a usage hint, though the command line held no such flag. `None` for every
/// other clap error (they stay clap's). `args` is the command line, program name first.
pub(super) fn clap_error_from_variable(
    error: &clap::Error,
    command: &clap::Command,
    args: &[String],
) -> Option<String> {
    use clap::error::{ContextKind, ContextValue};
    let text = |kind| match error.get(kind) {
        Some(ContextValue::String(text)) => Some(text.clone()),
        _ => None,
    };
    let invalid_arg = text(ContextKind::InvalidArg)?;
    let value = text(ContextKind::InvalidValue)?;
    // "--max-connections <N>" -> "max-connections"
    let long = invalid_arg
        .strip_prefix("--")?
        .split([' ', '='])
        .next()?
        .to_string();
    let on_command_line = args
        .iter()
        .skip(1)
        .any(|arg| arg == &format!("--{long}") || arg.starts_with(&format!("--{long}=")));
    if on_command_line {
        return None;
    }
    let arg = command
        .get_subcommands()
        .flat_map(|sub| sub.get_arguments())
        .chain(command.get_arguments())
        .find(|arg| arg.get_long() == Some(long.as_str()))?;
    let variable = arg.get_env()?.to_string_lossy().into_owned();
    if std::env::var(&variable).ok()? != value {
        return None;
    }
    let why = std::error::Error::source(error)
        .map(|source| format!(": {source}"))
        .unwrap_or_default();
    Some(format!(
        "{variable}: '{value}' is not a valid value (the variable of --{long}){why}"
    ))
}

/// Levenshtein distance over bytes (variable names are ASCII).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, &ca) in a.iter().enumerate() {
        let mut current = vec![i + 1; b.len() + 1];
        for (j, &cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != cb);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        previous = current;
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misspelled_variables_name_the_nearest_known_one() {
        let known: Vec<String> = ["GPUMEM_LEAK_AGE", "GPUMEM_LISTEN", "GPUMEM_LOG"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let set = vec![
            "GPUMEM_LEAKAGE".to_string(),
            "GPUMEM_LISTEN".to_string(),
            "PATH".to_string(),
            "GPUMEM_ZZZZZZZZZZZZZZZZZZZZ".to_string(),
        ];
        let warnings = unknown_variable_warnings(&set, &known);
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].contains("did you mean GPUMEM_LEAK_AGE?"));
        assert!(!warnings[1].contains("did you mean"));
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn an_error_about_a_value_from_a_variable_names_the_variable() {
        use clap::{Arg, Command};
        let command = || {
            Command::new("gpumem").subcommand(
                Command::new("demo").arg(
                    Arg::new("interval")
                        .long("interval")
                        .env("SOURCES_TEST_INTERVAL"),
                ),
            )
        };
        let from_flag = command()
            .try_get_matches_from(["gpumem", "demo", "--interval", "fast"])
            .expect("parses");
        let message = "--interval: 'fast' is not a duration";
        assert_eq!(name_the_variable(message, &command(), &from_flag), message);
        let unrelated = "config: devices: nope";
        assert_eq!(
            name_the_variable(unrelated, &command(), &from_flag),
            unrelated
        );
        // A variable only this test reads.
        std::env::set_var("SOURCES_TEST_INTERVAL", "fast");
        let from_variable = command()
            .try_get_matches_from(["gpumem", "demo"])
            .expect("parses");
        assert_eq!(
            name_the_variable(message, &command(), &from_variable),
            "SOURCES_TEST_INTERVAL: 'fast' is not a duration (the variable of --interval)"
        );
    }
}
