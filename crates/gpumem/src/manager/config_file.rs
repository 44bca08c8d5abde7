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
            match t.to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" | "on" => Ok(true),
                "false" | "0" | "no" | "off" => Ok(false),
                _ => Err("expected true or false".to_string()),
            }
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
mod tests {
    use super::*;
    use crate::units::{GIB, MIB};

    fn from_file(text: &str) -> Result<MemoryConfig, ConfigError> {
        // A file per call: tests run in parallel threads, and the clock alone can repeat.
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "gpumem-config-{}-{}-{}",
            std::process::id(),
            crate::clock::now(),
            CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("gpumem.toml");
        std::fs::write(&path, text).unwrap();
        load_config(&ConfigSources {
            file: Some(path),
            env: vec![],
        })
    }

    fn from_env(vars: &[(&str, &str)]) -> Result<MemoryConfig, ConfigError> {
        let env = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        load_config(&ConfigSources { file: None, env })
    }

    #[test]
    fn a_file_sets_keys_over_its_preset() {
        let config = from_file(
            "preset = \"constrained\"\ngpu_memory_fraction = 0.7\nmin_free_bytes = \"1GiB\"\nleak_age = \"5m\"\n\
             cleanup_interval = \"off\"\ndevices = [0, 1]\n[pressure]\nhigh = 0.85\nreserve = 1073741824\n",
        )
        .unwrap();
        assert!(config.cpu_fallback, "from the preset");
        assert_eq!(config.gpu_memory_fraction, 0.7);
        assert_eq!(config.min_free_bytes, GIB);
        assert_eq!(config.leak_age, Duration::from_secs(300));
        assert_eq!(config.cleanup_interval, None);
        assert_eq!(config.devices, Some(vec![0, 1]));
        assert_eq!(config.pressure.high, 0.85);
        assert_eq!(config.pressure.reserve_bytes, Some(GIB));
    }

    #[test]
    fn bad_files_name_the_key_and_the_problem() {
        let err = from_file("gpu_memory_fraction = 1.5\n").unwrap_err();
        assert!(
            err.to_string().contains("gpu_memory_fraction")
                && err.to_string().contains("0 < value <= 1"),
            "{err}"
        );
        let err = from_file("gpu_memory_fraction = \"most\"\n").unwrap_err();
        assert!(
            err.to_string().contains("gpu_memory_fraction")
                && err.to_string().contains("not a number"),
            "{err}"
        );
        let err = from_file("turbo = true\n").unwrap_err();
        assert!(
            err.to_string().contains("`") && err.to_string().contains("unknown key"),
            "{err}"
        );
        let err = from_file("leak_age = = 3\n").unwrap_err();
        assert!(err.to_string().contains("not valid TOML"), "{err}");
        let err = from_file("min_free_bytes = \"lots\"\n").unwrap_err();
        assert!(err.to_string().contains("min_free_bytes"), "{err}");
        let err = from_file("[pressure]\nmedium = 0.9\n").unwrap_err();
        assert!(err.to_string().contains("must increase"), "{err}");
    }

    #[test]
    fn a_guide_style_file_with_the_guides_key_names_loads() {
        let config = from_file(
            "preset = \"production\"\nenable_memory_tracking = false\nmax_cached_buffers = 16\n\
             max_pool_size = \"7GB\"\ncpu_fallback = true\n",
        )
        .unwrap();
        assert!(!config.track_allocations);
        assert_eq!(config.max_cached_bytes, Some(16 * 2 * MIB));
        assert_eq!(config.max_pool_bytes, Some(7 * GIB));
        assert!(config.cpu_fallback);
        let err = from_file("enable_memory_tracking = \"sometimes\"\n").unwrap_err();
        assert!(err.to_string().contains("enable_memory_tracking"), "{err}");
        let err = from_file("max_cached_buffers = -1\n").unwrap_err();
        assert!(err.to_string().contains("max_cached_buffers"), "{err}");
    }

    #[test]
    fn a_retired_key_names_its_replacement() {
        let err = from_file("chunks_per_miss = 8\n").unwrap_err().to_string();
        assert!(
            err.contains("chunks_per_miss") && err.contains("inside_chunk_bytes"),
            "{err}"
        );
        assert_eq!(
            retired("GPUMEM_CHUNKS_PER_MISS"),
            retired("chunks_per_miss")
        );
    }

    #[test]
    fn inside_chunks_beyond_64_gib_are_refused_by_name() {
        let err = from_file("inside_chunk_bytes = \"128GiB\"\n").unwrap_err();
        assert!(err.to_string().contains("inside_chunk_bytes"), "{err}");
    }

    #[test]
    fn a_bad_size_or_duration_is_named_once() {
        // The parsers' own sentences name the value; the key's message does not repeat it.
        for (key, value) in [
            ("max_chunk_bytes", "abc"),
            ("inside_chunk_bytes", "16X"),
            ("leak_age", "5x"),
        ] {
            let from_file = from_file(&format!("{key} = \"{value}\"\n")).unwrap_err();
            let env_key = format!("GPUMEM_{}", key.to_uppercase());
            let from_env = from_env(&[(env_key.as_str(), value)]).unwrap_err();
            for err in [from_file.to_string(), from_env.to_string()] {
                assert!(
                    err.contains(&key.to_uppercase()) || err.contains(key),
                    "{err}"
                );
                assert_eq!(err.matches(value).count(), 1, "{err}");
            }
        }
    }

    #[test]
    fn a_missing_file_is_an_error_naming_it() {
        let err = load_config(&ConfigSources {
            file: Some("/no/such/gpumem.toml".into()),
            env: vec![],
        })
        .unwrap_err();
        assert!(err.to_string().contains("/no/such/gpumem.toml"), "{err}");
    }

    #[test]
    fn environment_overrides_and_cuda_variables_are_honoured() {
        let config = from_env(&[
            ("GPUMEM_CPU_FALLBACK", "true"),
            ("GPUMEM_PRESSURE_CRITICAL", "0.97"),
            ("GPUMEM_LISTEN", "ignored: a CLI flag, not a config key"),
            ("CUDA_MEMORY_POOL_SIZE", "2G"),
            ("CUDA_MEMORY_POOL_TRIM", "1"),
        ])
        .unwrap();
        assert!(config.cpu_fallback);
        assert_eq!(config.pressure.critical, 0.97);
        assert_eq!(config.preallocate_bytes, 2 * GIB);
        assert_eq!(config.release_idle_after, Some(Duration::ZERO));
        let err = from_env(&[("GPUMEM_MAX_CACHED_BUFFERS", "many")]).unwrap_err();
        assert!(
            err.to_string().contains("GPUMEM_MAX_CACHED_BUFFERS"),
            "{err}"
        );
        let err = from_env(&[("GPUMEM_SMALL_MAX_BYTES", "1TiB")]).unwrap_err();
        assert!(err.to_string().contains("small_max_bytes"), "{err}");
        let err = from_env(&[("GPUMEM_GPU_MEMORY_FRACTION", "-1")]).unwrap_err();
        assert!(err.to_string().contains("gpu_memory_fraction"), "{err}");
        assert_eq!(
            from_env(&[("GPUMEM_MAX_POOL_SIZE", "512MiB")])
                .unwrap()
                .max_pool_bytes,
            Some(512 * MIB)
        );
    }
}
