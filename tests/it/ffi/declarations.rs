//! One ABI written three times — the Rust exports (`crates/gpumem-capi`), the C header
//! (`python/gpumem/gpumem.h`) and the Python package's ctypes declarations
//! (`python/gpumem/_native.py`) — checked against each other: every function in each, with
//! the same parameters and result. Renaming an export, or changing a type, on one side only
//! fails here.

use std::collections::BTreeMap;
use std::path::Path;

const REPOSITORY: &str = env!("CARGO_MANIFEST_DIR");

/// A function as C sees it: parameter types and result type, spelled the C way.
#[derive(Debug, PartialEq, Eq)]
struct Signature {
    parameters: Vec<String>,
    result: String,
}

type Declarations = BTreeMap<String, Signature>;

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(REPOSITORY).join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Whitespace collapsed to single spaces, so declarations spread over lines read as one.
fn squeeze(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A Rust FFI type as C spells it.
fn c_type_of_rust(rust: &str) -> String {
    let c = match squeeze(rust).as_str() {
        "isize" => "ssize_t",
        "c_int" => "int",
        "u64" => "uint64_t",
        "i64" => "int64_t",
        "*mut c_void" => "void *",
        "*mut c_char" => "char *",
        "*const c_char" => "const char *",
        "c_double" => "double",
        "*mut pytorch::DeviceStats" => "gpumem_device_stats_t *",
        other => panic!("the C ABI exports a type this test does not know: {other}"),
    };
    c.to_string()
}

/// A header type in one spelling: the stream handle is an opaque pointer, as `void *` is.
fn c_type_of_header(c: &str) -> String {
    let c = squeeze(&c.replace('*', " * "));
    let c = c.replace(" *", "*").replace('*', " *");
    match c.as_str() {
        "gpumem_stream_t" => "void *".to_string(),
        _ => c,
    }
}

/// A ctypes expression from `_native.py` as C spells it (`owned` is its name for a string the
/// caller must free; `void_p` and `c_char_p` are its local aliases).
fn c_type_of_ctypes(python: &str) -> String {
    let c = match python.trim() {
        "ctypes.c_ssize_t" => "ssize_t",
        "ctypes.c_int" => "int",
        "ctypes.c_uint64" => "uint64_t",
        "ctypes.c_int64" => "int64_t",
        "ctypes.c_double" => "double",
        "stats_p" => "gpumem_device_stats_t *",
        "void_p" | "ctypes.c_void_p" => "void *",
        "owned" => "char *",
        "c_char_p" | "ctypes.c_char_p" => "const char *",
        "None" => "void",
        other => panic!("_native.py declares a type this test does not know: {other}"),
    };
    c.to_string()
}

/// Every `#[no_mangle] pub [unsafe] extern "C" fn` of the C ABI crate.
fn rust_exports() -> Declarations {
    let mut found = Declarations::new();
    let dir = Path::new(REPOSITORY).join("crates/gpumem-capi/src");
    for entry in std::fs::read_dir(&dir).expect("the C ABI's sources") {
        let source = std::fs::read_to_string(entry.expect("entry").path()).expect("readable");
        for (at, _) in source.match_indices("#[no_mangle]") {
            let rest = &source[at..];
            let head = squeeze(&rest[..rest.find('{').expect("a body")]);
            let after_fn = head.split(" fn ").nth(1).expect("an extern fn");
            let (name, rest) = after_fn.split_once('(').expect("parameters");
            let (parameters, result) = rest.rsplit_once(')').expect("parameters end");
            let parameters = parameters
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(|p| c_type_of_rust(p.split_once(':').expect("name: type").1))
                .collect();
            let result = match result.trim().strip_prefix("->") {
                Some(ty) => c_type_of_rust(ty),
                None => "void".to_string(),
            };
            found.insert(name.trim().to_string(), Signature { parameters, result });
        }
    }
    found
}

/// Every function prototype in the header.
fn header_declarations() -> Declarations {
    let header = read("python/gpumem/gpumem.h");
    // Comments out, then one statement per `;`.
    let mut code = String::new();
    let mut rest = header.as_str();
    while let Some(start) = rest.find("/*") {
        code.push_str(&rest[..start]);
        rest = &rest[start + rest[start..].find("*/").expect("comment ends") + 2..];
    }
    code.push_str(rest);
    let mut found = Declarations::new();
    for statement in code.split(';').map(squeeze) {
        let Some(open) = statement
            .find("gpumem_")
            .filter(|_| statement.ends_with(')'))
        else {
            continue;
        };
        let Some(paren) = statement[open..].find('(').map(|p| p + open) else {
            continue;
        };
        // What precedes the name is the result type (the first statement also carries the
        // header's preprocessor lines and `extern "C" {`: only what follows them counts).
        let head = statement[..open]
            .rsplit(['}', '{'])
            .next()
            .unwrap_or_default();
        let result = c_type_of_header(head.rsplit("#endif").next().unwrap_or(head));
        let name = statement[open..paren].trim().to_string();
        let inner = &statement[paren + 1..statement.len() - 1];
        let parameters = inner
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty() && *p != "void")
            .map(|p| {
                // Drop the parameter's name: the last word, unless the type ends in `*`.
                let without_name = match p.rfind([' ', '*']) {
                    Some(i) if !p.ends_with('*') => &p[..=i],
                    _ => p,
                };
                c_type_of_header(without_name)
            })
            .collect();
        found.insert(name, Signature { parameters, result });
    }
    found
}

/// The `signatures` table of `_native.py`: `"name": ([argument types], result type),`.
fn python_declarations() -> Declarations {
    let source = read("python/gpumem/_native.py");
    let table_start = source
        .find("signatures = {")
        .expect("_native.py has a signatures table");
    let table = &source[table_start..];
    let table = squeeze(&table[..table.find("\n    }").expect("the table ends")]);
    let mut found = Declarations::new();
    for entry in table.split("\"gpumem_").skip(1) {
        let (name, rest) = entry.split_once("\":").expect("\"name\": (...)");
        let open = rest.find('[').expect("argument list");
        let close = rest.find(']').expect("argument list ends");
        let parameters = rest[open + 1..close]
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(c_type_of_ctypes)
            .collect();
        let result = rest[close + 1..]
            .trim_start_matches([',', ' '])
            .split(')')
            .next()
            .expect("result type");
        found.insert(
            format!("gpumem_{name}"),
            Signature {
                parameters,
                result: c_type_of_ctypes(result.trim_end_matches([',', ' '])),
            },
        );
    }
    found
}

#[test]
fn the_header_declares_exactly_the_rust_exports() {
    let rust = rust_exports();
    assert!(
        rust.len() >= 15,
        "found only {} exports: {rust:?}",
        rust.len()
    );
    assert_eq!(
        header_declarations(),
        rust,
        "gpumem.h (left) against the Rust exports"
    );
}

#[test]
fn the_python_package_declares_exactly_the_header() {
    let header = header_declarations();
    assert_eq!(
        python_declarations(),
        header,
        "_native.py (left) against gpumem.h"
    );
}
