//! Loading a [`MemoryConfig`]: a preset, then a TOML file, then `GPUMEM_*` environment
//! variables (and `CUDA_MEMORY_POOL_SIZE` / `CUDA_MEMORY_POOL_TRIM`), each overriding the last.
//! Every key has one parser, whichever source it comes from, and every error names the key.

use super::config::{ConfigError, MemoryConfig, Strategy};
use crate::units::{parse_bytes, parse_duration};
use std::path::PathBuf;
use std::time::Duration;

/// Where a configuration comes from.
#[derive(Clone, Debug, Default)]
pub struct ConfigSources {
    /// A TOML file (`--config`).
    pub file: Option<PathBuf>,
    /// Environment variables to read (normally `std::env::vars()`).
    pub env: Vec<(String, String)>,
}

impl ConfigSources {
    /// The file given, and this process's environment.
    pub fn from_process(file: Option<PathBuf>) -> Self {
        ConfigSources {
            file,
            env: std::env::vars().collect(),
        }
    }
}

/// A value as written: TOML keeps its type, the environment gives text.
enum Raw<'a> {
    Toml(&'a toml::Value),
    Text(&'a str),
}

/// What a value parser's error is: a detail of the message, or the whole message.
#[derive(Clone, Copy)]
enum Why {
    Detail,
    Sentence,
}

impl Raw<'_> {
    fn text(&self) -> Option<String> {
        match self {
            Raw::Text(text) => Some(text.to_string()),
            Raw::Toml(toml::Value::String(text)) => Some(text.clone()),
            Raw::Toml(toml::Value::Integer(n)) => Some(n.to_string()),
            Raw::Toml(toml::Value::Float(f)) => Some(f.to_string()),
            Raw::Toml(toml::Value::Boolean(b)) => Some(b.to_string()),
            Raw::Toml(_) => None,
        }
    }

    fn shown(&self) -> String {
        match self {
            Raw::Text(text) => format!("'{text}'"),
            // A date's own text; `Value`'s Display would show toml's private wrapper table.
            Raw::Toml(toml::Value::Datetime(date)) => date.to_string(),
            Raw::Toml(value) => value.to_string(),
        }
    }

    /// Parses the value as text. A parser's error is a detail after "VALUE is not EXPECTED:",
    /// unless it is already a whole sentence naming the value (`Why::Sentence`: sizes,
    /// durations), which is then the message as it is.
    fn parse<T>(
        &self,
        key: &str,
        expected: &str,
        why: Why,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Result<T, ConfigError> {
        let text = self
            .text()
            .ok_or_else(|| ConfigError::new(key, format!("{} is not {expected}", self.shown())))?;
        parse(text.trim()).map_err(|detail| {
            let message = match why {
                Why::Detail => format!("{} is not {expected}: {detail}", self.shown()),
                Why::Sentence => detail,
            };
            ConfigError::new(key, message)
        })
    }

    fn boolean(&self, key: &str) -> Result<bool, ConfigError> {
        self.parse(key, "true or false", Why::Detail, |t| {
            truth(t).ok_or_else(|| "expected true or false".to_string())
        })
    }

    /// True, false, or `auto` (`None`): left to the adaptive default.
    fn boolean_or_auto(&self, key: &str) -> Result<Option<bool>, ConfigError> {
        self.parse(key, "true, false or auto", Why::Detail, |t| {
            if t.eq_ignore_ascii_case("auto") {
                return Ok(None);
            }
            truth(t)
                .map(Some)
                .ok_or_else(|| "expected true, false or auto".to_string())
        })
    }

    fn number(&self, key: &str) -> Result<f64, ConfigError> {
        self.parse(key, "a number", Why::Detail, |t| {
            t.parse::<f64>().map_err(|e| e.to_string())
        })
    }

    fn count(&self, key: &str) -> Result<usize, ConfigError> {
        self.parse(key, "a whole number", Why::Detail, |t| {
            t.parse::<usize>().map_err(|e| e.to_string())
        })
    }

    fn bytes(&self, key: &str) -> Result<u64, ConfigError> {
        self.parse(
            key,
            "a byte size (e.g. 512MiB, 2G)",
            Why::Sentence,
            parse_bytes,
        )
    }

    fn duration(&self, key: &str) -> Result<Duration, ConfigError> {
        self.parse(
            key,
            "a duration (e.g. 500ms, 10s, 10m)",
            Why::Sentence,
            parse_duration,
        )
    }

    /// A duration, or "off"/"never" for none.
    fn optional_duration(&self, key: &str) -> Result<Option<Duration>, ConfigError> {
        if let Some(text) = self.text() {
            if matches!(text.trim(), "off" | "never" | "none") {
                return Ok(None);
            }
        }
        self.duration(key).map(Some)
    }

    fn devices(&self, key: &str) -> Result<Vec<usize>, ConfigError> {
        match self {
            Raw::Toml(toml::Value::Array(items)) => items
                .iter()
                .map(|item| Raw::Toml(item).count(key))
                .collect(),
            _ => self.parse(
                key,
                "a list of device indices (e.g. 0,1)",
                Why::Detail,
                |t| {
                    t.split(',')
                        .map(|part| part.trim().parse::<usize>().map_err(|e| e.to_string()))
                        .collect()
                },
            ),
        }
    }
}

/// How one key changes a configuration (the key is passed on for error messages).
type Setter = fn(&mut MemoryConfig, &Raw, &str) -> Result<(), ConfigError>;

/// Every key a file or `GPUMEM_<KEY>` may set (`pressure.high` is `GPUMEM_PRESSURE_HIGH`;
/// `devices` only from a file), each with its one parser: the list of keys, the parsing and the
/// error for an unknown key all come from this table (docs/configuration.md is tested
/// against it).
const SETTERS: &[(&str, Setter)] = &[
    ("preset", |c, raw, key| {
        *c = MemoryConfig::preset(
            &raw.parse(key, "a preset name", Why::Detail, |t| Ok(t.to_string()))?,
        )?;
        Ok(())
    }),
    ("pooling", |c, raw, key| {
        c.strategy = if raw.boolean(key)? {
            Strategy::Pooled
        } else {
            Strategy::Direct
        };
        Ok(())
    }),
    ("strategy", |c, raw, key| {
        c.strategy = raw.parse(key, "pooled or direct", Why::Detail, |t| match t {
            "pooled" => Ok(Strategy::Pooled),
            "direct" => Ok(Strategy::Direct),
            _ => Err("expected pooled or direct".to_string()),
        })?;
        Ok(())
    }),
    ("devices", |c, raw, key| {
        raw.devices(key).map(|v| c.devices = Some(v))
    }),
    ("gpu_memory_fraction", |c, raw, key| {
        raw.number(key).map(|v| c.gpu_memory_fraction = v)
    }),
    ("max_pool_size", |c, raw, key| {
        raw.bytes(key).map(|v| c.max_pool_bytes = Some(v))
    }),
    ("min_free_bytes", |c, raw, key| {
        raw.bytes(key).map(|v| c.min_free_bytes = v)
    }),
    ("cpu_fallback", |c, raw, key| {
        raw.boolean(key).map(|v| c.cpu_fallback = v)
    }),
    ("track_allocations", |c, raw, key| {
        raw.boolean(key).map(|v| c.track_allocations = v)
    }),
    ("capture_backtraces", |c, raw, key| {
        raw.boolean(key).map(|v| c.capture_backtraces = v)
    }),
    ("leak_age", |c, raw, key| {
        raw.duration(key).map(|v| c.leak_age = v)
    }),
    ("trim_on_high_pressure", |c, raw, key| {
        raw.boolean(key).map(|v| c.trim_on_high_pressure = v)
    }),
    ("cleanup_interval", |c, raw, key| {
        raw.optional_duration(key).map(|v| c.cleanup_interval = v)
    }),
    ("release_idle_after", |c, raw, key| {
        raw.optional_duration(key).map(|v| c.release_idle_after = v)
    }),
    ("max_cached_bytes", |c, raw, key| {
        raw.bytes(key).map(|v| c.max_cached_bytes = Some(v))
    }),
    ("preallocate", |c, raw, key| {
        raw.bytes(key).map(|v| c.preallocate_bytes = v)
    }),
    ("shards", |c, raw, key| raw.count(key).map(|v| c.shards = v)),
    ("small_max_bytes", |c, raw, key| {
        raw.bytes(key).map(|v| c.small_max_bytes = v)
    }),
    ("idle_pages_kept", |c, raw, key| {
        raw.count(key).map(|v| c.idle_pages_kept = v)
    }),
    ("idle_per_mille", |c, raw, key| {
        raw.count(key).map(|v| c.idle_per_mille = v)
    }),
    ("max_chunk_bytes", |c, raw, key| {
        raw.bytes(key).map(|v| c.max_chunk_bytes = v)
    }),
    ("inside_chunk_bytes", |c, raw, key| {
        raw.bytes(key).map(|v| c.inside_chunk_bytes = v)
    }),
    ("whole_chunks_when_growing", |c, raw, key| {
        raw.boolean(key).map(|v| c.whole_chunks_when_growing = v)
    }),
    ("make_room_without_waiting", |c, raw, key| {
        raw.boolean(key).map(|v| c.make_room_without_waiting = v)
    }),
    ("room_without_waiting", |c, raw, key| {
        raw.bytes(key).map(|v| c.room_without_waiting_bytes = v)
    }),
    ("stream_ordered_reuse", |c, raw, key| {
        raw.boolean_or_auto(key).map(|v| c.stream_ordered_reuse = v)
    }),
    ("place_on_mapped_pages", |c, raw, key| {
        raw.boolean(key).map(|v| c.place_on_mapped_pages = v)
    }),
    ("map_ahead_when_growing", |c, raw, key| {
        raw.boolean(key).map(|v| c.map_ahead_when_growing = v)
    }),
    ("cache_mode", |c, raw, key| {
        c.cache_mode = raw.parse(key, "adaptive, memory-first or fixed", Why::Detail, |t| {
            <super::config::CacheMode as crate::named::Named>::from_name(t)
        })?;
        Ok(())
    }),
    ("pressure.medium", |c, raw, key| {
        raw.number(key).map(|v| c.pressure.medium = v)
    }),
    ("pressure.high", |c, raw, key| {
        raw.number(key).map(|v| c.pressure.high = v)
    }),
    ("pressure.critical", |c, raw, key| {
        raw.number(key).map(|v| c.pressure.critical = v)
    }),
    ("pressure.reserve", |c, raw, key| {
        raw.bytes(key).map(|v| c.pressure.reserve_bytes = Some(v))
    }),
    // The guide's names. Tracking here means allocation ages (ids, sizes and tags are always
    // kept); gpumem caches 2 MiB pages rather than whole buffers, so N buffers cap the idle
    // cache at N pages.
    ("enable_memory_tracking", |c, raw, key| {
        raw.boolean(key).map(|v| c.track_allocations = v)
    }),
    ("max_cached_buffers", |c, raw, key| {
        let pages = raw.count(key)? as u64;
        c.max_cached_bytes = Some(pages.saturating_mul(super::config::CACHED_BUFFER_BYTES));
        Ok(())
    }),
];

/// Every key a file or `GPUMEM_<KEY>` may set, in the order of docs/configuration.md.
pub fn keys() -> impl Iterator<Item = &'static str> {
    SETTERS.iter().map(|(key, _)| *key)
}

/// Keys a release took away, with what to set instead: a file written for that release gets
/// the replacement named, not the list of every key.
const RETIRED: &[(&str, &str)] = &[(
    "chunks_per_miss",
    "was replaced by inside_chunk_bytes, a size (16MiB by default; 0 for none)",
)];

/// What replaced a retired key or its `GPUMEM_<KEY>` variable, if `name` is one.
pub fn retired(name: &str) -> Option<&'static str> {
    RETIRED
        .iter()
        .find(|(key, _)| *key == name || env_name(key) == name)
        .map(|&(_, instead)| instead)
}

fn apply(config: &mut MemoryConfig, key: &str, raw: &Raw) -> Result<(), ConfigError> {
    match SETTERS.iter().find(|(known, _)| *known == key) {
        Some((_, set)) => set(config, raw, key),
        None => Err(ConfigError::new(
            key,
            match retired(key) {
                Some(instead) => instead.to_string(),
                None => format!(
                    "unknown key (known keys: {})",
                    keys().collect::<Vec<_>>().join(", ")
                ),
            },
        )),
    }
}

/// Flattens a TOML document into (dotted key, value), preset first so the rest overrides it.
fn flatten(table: &toml::Table) -> Vec<(String, &toml::Value)> {
    let mut keys = Vec::new();
    for (key, value) in table {
        match value {
            toml::Value::Table(inner) => {
                for (inner_key, inner_value) in inner {
                    keys.push((format!("{key}.{inner_key}"), inner_value));
                }
            }
            _ => keys.push((key.clone(), value)),
        }
    }
    keys.sort_by_key(|(key, _)| key != "preset");
    keys
}

/// Applies the keys of a TOML document over `config`; errors name `shown` (the file) and the key.
fn apply_toml(config: &mut MemoryConfig, shown: &str, text: &str) -> Result<(), ConfigError> {
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        // toml's message spans lines ("invalid string\nexpected ..."): one line, with where.
        let line = e.span().map_or(1, |span| {
            text.get(..span.start)
                .map_or(1, |before| before.matches('\n').count() + 1)
        });
        let message = e.message().lines().collect::<Vec<_>>().join("; ");
        ConfigError::new(shown, format!("not valid TOML at line {line}: {message}"))
    })?;
    for (key, value) in flatten(&table) {
        apply(config, &key, &Raw::Toml(value))
            .map_err(|e| ConfigError::new(format!("{shown}: {}", e.key), e.message))?;
    }
    Ok(())
}

/// A boolean as a file or an environment variable spells it.
fn truth(text: &str) -> Option<bool> {
    match text.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Some(true),
        "false" | "0" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// A configuration from the text of a TOML file alone (no environment), checked: what
/// `--config` reads, for callers that hold the text (and the config parser's fuzz target).
pub fn parse_config_str(text: &str) -> Result<MemoryConfig, ConfigError> {
    let mut config = MemoryConfig::default();
    apply_toml(&mut config, "config", text)?;
    config.validate()?;
    Ok(config)
}

/// Config files are a few lines of TOML; anything bigger is not one (`--config /dev/zero`).
pub(super) const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The text of a config file, at most [`MAX_CONFIG_BYTES`] of UTF-8.
fn read_config_file(path: &std::path::Path) -> Result<String, String> {
    let cannot = |e: std::io::Error| format!("cannot read the config file: {e}");
    // Not a FIFO or a device: one would block the command for ever, the other never end.
    let file = crate::safe_fs::open_named_regular(path).map_err(cannot)?;
    let bytes = crate::safe_fs::read_capped(file, MAX_CONFIG_BYTES)
        .map_err(cannot)?
        .map_err(|_| {
            format!(
                "the config file is larger than {} (a gpumem config is a few lines of TOML)",
                crate::units::Bytes(MAX_CONFIG_BYTES)
            )
        })?;
    String::from_utf8(bytes).map_err(|_| "the config file is not valid UTF-8 text".to_string())
}

/// The `GPUMEM_<KEY>` variable of each key the environment may set.
pub fn env_names() -> impl Iterator<Item = String> {
    keys().filter(|key| *key != "devices").map(env_name)
}

fn env_name(key: &str) -> String {
    format!("GPUMEM_{}", key.replace('.', "_").to_ascii_uppercase())
}

/// Reads and checks the configuration; the error names the file or variable and the key.
pub fn load_config(sources: &ConfigSources) -> Result<MemoryConfig, ConfigError> {
    load_config_over(MemoryConfig::default(), sources)
}

/// [`load_config`] starting from `base` instead of the defaults: a command's own defaults
/// (the demo's short leak age) come first, so the file and the environment override them.
pub fn load_config_over(
    base: MemoryConfig,
    sources: &ConfigSources,
) -> Result<MemoryConfig, ConfigError> {
    let mut config = base;
    if let Some(path) = &sources.file {
        let shown = path.display().to_string();
        let text = read_config_file(path).map_err(|why| ConfigError::new(&shown, why))?;
        apply_toml(&mut config, &shown, &text)?;
    }
    let env = |name: &str| {
        sources
            .env
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    };
    // `devices` is left to the CLI's own `--devices`/`GPUMEM_DEVICES` ("all" or "0,2").
    for key in keys().filter(|key| *key != "devices") {
        let name = env_name(key);
        if let Some(value) = env(&name) {
            apply(&mut config, key, &Raw::Text(value))
                .map_err(|e| ConfigError::new(name.clone(), e.message))?;
        }
    }
    if let Some(size) = env("CUDA_MEMORY_POOL_SIZE") {
        config.preallocate_bytes = Raw::Text(size).bytes("CUDA_MEMORY_POOL_SIZE")?;
    }
    if let Some(trim) = env("CUDA_MEMORY_POOL_TRIM") {
        if Raw::Text(trim).boolean("CUDA_MEMORY_POOL_TRIM")? {
            // "Trim automatically": give idle memory back at every upkeep.
            config.release_idle_after = Some(Duration::ZERO);
            config
                .cleanup_interval
                .get_or_insert(Duration::from_secs(1));
        }
    }
    config.validate()?;
    Ok(config)
}

#[cfg(test)]
mod tests;
