//! What `/proc` says about processes: this process's name and PID namespace (for the publish
//! format), and whether a pid still runs (for the collector). Everything degrades to "unknown"
//! off Linux or without `/proc`, never to an error.

use super::published::Identity;
use std::path::Path;

/// Process names in files and labels are cut to this many characters.
pub const MAX_PROCESS_NAME: usize = 64;

/// This process: its pid, a short name and its PID namespace.
pub fn current_identity() -> Identity {
    Identity {
        pid: std::process::id(),
        process: current_process_name(),
        pid_namespace: current_pid_namespace(),
    }
}

/// `/proc/self/comm` (what `ps` shows), else the executable's file name, else `unknown`.
pub fn current_process_name() -> String {
    let from_proc = std::fs::read_to_string("/proc/self/comm")
        .ok()
        .map(|name| name.trim().to_string());
    let from_exe = || {
        std::env::current_exe()
            .ok()
            .and_then(|path| path.file_name().map(|n| n.to_string_lossy().into_owned()))
    };
    let name = from_proc.filter(|n| !n.is_empty()).or_else(from_exe);
    clean_process_name(name.as_deref().unwrap_or(""))
}

/// A process name fit for a label: see [`clean_text`]; at most [`MAX_PROCESS_NAME`]
/// characters, `unknown` when empty.
pub fn clean_process_name(name: &str) -> String {
    let cleaned = clean_text(name, MAX_PROCESS_NAME);
    if cleaned.is_empty() {
        "unknown".to_string()
    } else {
        cleaned
    }
}

/// Text from a file another process wrote, fit for a label, a log line or the page: control
/// characters replaced by `_`, invisible formatting characters (bidirectional overrides such
/// as U+202E, which can make a label read backwards, zero-width characters, the BOM) removed,
/// trimmed, and at most `max_chars` characters.
pub fn clean_text(text: &str, max_chars: usize) -> String {
    let cleaned: String = text
        .trim()
        .chars()
        .filter(|c| !is_invisible_format(*c))
        .map(|c| if c.is_control() { '_' } else { c })
        .take(max_chars)
        .collect();
    // Cut at the limit, a name may end in spaces: trim again, so cleaning clean text changes
    // nothing (a collector cleans what publishers already cleaned).
    cleaned.trim().to_string()
}

/// Unicode format characters that change how text around them reads without showing
/// themselves: bidirectional marks, embeddings, overrides and isolates, zero-width ones.
fn is_invisible_format(c: char) -> bool {
    matches!(c,
        '\u{00AD}' | '\u{061C}' | '\u{180E}' | '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}'
        | '\u{2060}'..='\u{206F}' | '\u{FEFF}' | '\u{FFF9}'..='\u{FFFB}')
}

/// The target of `/proc/self/ns/pid`, such as `pid:[4026531836]`; `None` where it cannot be read.
pub fn current_pid_namespace() -> Option<String> {
    std::fs::read_link("/proc/self/ns/pid")
        .ok()
        .map(|target| target.to_string_lossy().into_owned())
}

/// Whether the process answers to `pid` in this PID namespace: `Some(false)` when `/proc` says
/// it is gone (or a zombie waiting to be reaped), `None` when `/proc` cannot tell.
pub fn pid_alive(pid: u32) -> Option<bool> {
    pid_alive_in(Path::new("/proc"), pid)
}

fn pid_alive_in(proc_root: &Path, pid: u32) -> Option<bool> {
    if pid == 0 {
        return Some(false);
    }
    match std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")) {
        // The state follows the last ')': the name in parentheses may itself hold one.
        Ok(stat) => {
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next());
            Some(!matches!(state, Some('Z' | 'X')))
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            // No /proc at all says nothing about the pid.
            proc_root.join("self").exists().then_some(false)
        }
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_cleaned_for_labels() {
        assert_eq!(clean_process_name("  python3\n"), "python3");
        assert_eq!(clean_process_name("a\tb"), "a_b");
        assert_eq!(clean_process_name(""), "unknown");
        assert_eq!(clean_process_name(&"x".repeat(100)).len(), MAX_PROCESS_NAME);
        let cut_at_spaces = format!("{}    tail", "x".repeat(MAX_PROCESS_NAME - 2));
        let once = clean_process_name(&cut_at_spaces);
        assert_eq!(clean_process_name(&once), once, "cleaning is idempotent");
        assert_eq!(clean_process_name("evil\u{202E}gnp.exe"), "evilgnp.exe");
        assert_eq!(clean_process_name("\u{200B}\u{2066}"), "unknown");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_is_alive_and_has_a_namespace() {
        assert_eq!(pid_alive(std::process::id()), Some(true));
        assert_eq!(pid_alive(0), Some(false));
        // Above the kernel's pid_max (4194304 at most): never a live process.
        assert_eq!(pid_alive(u32::MAX - 1), Some(false));
        let identity = current_identity();
        assert!(identity
            .pid_namespace
            .is_some_and(|ns| ns.starts_with("pid:[")));
        assert_ne!(identity.process, "unknown");
    }
}
