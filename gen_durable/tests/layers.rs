//! The library's layers import only downward: a file of a layer names (`crate::…`) only
//! its own layer and the layers [`LAYERS`] lists below it. A name the crate root
//! re-exports (`crate::Status`) counts as the module it comes from. Comments, `$crate::`
//! in a macro (resolved where it is used) and `crate::name!` (an exported macro, at the
//! root wherever it is written) are skipped.
//!
//! A layer is a directory of `gen_durable/src/`. Only the crate root and its two doors
//! (`backend.rs`, `__private.rs`) sit outside one, and [`no_module_sits_outside_a_layer`]
//! keeps it so.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// Each layer, bottom first, with the layers it may import.
const LAYERS: &[(&str, &[&str])] = &[
    // The contract: imports nothing else of the crate.
    ("model", &[]),
    // The events and their handlers.
    ("telemetry", &["model"]),
    // Persistence: every statement, the pooler, the shared connection, the wake-ups.
    ("store", &["model"]),
    // The FSM trait, what a step sees, the registry, instance migrations, the step runner.
    ("runtime", &["model", "telemetry", "store"]),
    // What a caller does: insert, signal, wait, cancel, retry; one client per shard.
    ("client", &["model", "telemetry", "store", "runtime"]),
    // Gates, rate limits and schedules.
    (
        "flow",
        &["model", "telemetry", "store", "runtime", "client"],
    ),
    // Operator actions, bulk instance migrations, the schema, counts and metrics.
    (
        "ops",
        &["model", "telemetry", "store", "runtime", "client", "flow"],
    ),
    // The engine: pickers, workers, the committer, the services.
    (
        "engine",
        &[
            "model",
            "telemetry",
            "store",
            "runtime",
            "client",
            "flow",
            "ops",
        ],
    ),
];

#[test]
fn each_layer_imports_only_the_layers_below_it() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let roots = root_reexports(&fs::read_to_string(src.join("lib.rs")).unwrap());
    let mut upward = Vec::new();
    let mut files = 0;
    for (layer, allowed) in LAYERS {
        for file in rust_files(&src.join(layer)) {
            files += 1;
            let text = fs::read_to_string(&file).unwrap();
            for (line, module) in crate_paths(&text, &roots) {
                if module != *layer && !allowed.contains(&module.as_str()) {
                    upward.push(format!(
                        "{}:{line}: layer {layer} imports crate::{module}",
                        file.strip_prefix(&src).unwrap().display()
                    ));
                }
            }
        }
    }
    assert!(
        files > 0,
        "no file found under the layers of {}",
        src.display()
    );
    assert!(
        upward.is_empty(),
        "imports that go up or sideways (see tests/layers.rs):\n{}",
        upward.join("\n")
    );
}

/// Every directory of `src/` is a layer, and the only files at its root are the crate root
/// and its doors.
#[test]
fn no_module_sits_outside_a_layer() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut outside = Vec::new();
    for entry in fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let known = if path.is_dir() {
            LAYERS.iter().any(|(layer, _)| *layer == name)
        } else {
            ["lib.rs", "backend.rs", "__private.rs"].contains(&name.as_str())
        };
        if !known {
            outside.push(name);
        }
    }
    assert!(
        outside.is_empty(),
        "not in a layer of tests/layers.rs: {outside:?}"
    );
}

/// The rule sees what it must: a path into another module, a grouped import, and a name
/// re-exported by the crate root all count; a comment does not.
#[test]
fn the_scan_resolves_paths_groups_and_root_names() {
    let roots = root_reexports(
        "pub use engine::{Engine, EngineBuilder};\npub use model::status::Status;\n",
    );
    let text = "use crate::model::error::Result;\nmacro_rules! m { () => { $crate::engine::X } }\ncrate::setters!(x);\nuse crate::{\n    engine,\n    Status,\n};\n\
                // crate::client::Client in a comment\nfn f() -> crate::Engine { todo!() }\n";
    let found: Vec<(usize, String)> = crate_paths(text, &roots);
    let modules: Vec<&str> = found.iter().map(|(_, m)| m.as_str()).collect();
    assert_eq!(modules, ["model", "engine", "model", "engine"], "{found:?}");
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

/// The names the crate root re-exports, each with the top-level module it comes from.
fn root_reexports(lib: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for statement in lib.split(';') {
        let Some(at) = statement.find("pub use ") else {
            continue;
        };
        let path = statement[at + "pub use ".len()..].trim();
        let Some((module, rest)) = path.split_once("::") else {
            continue;
        };
        if module == "crate" {
            // The prelude's re-exports of the root's own names.
            continue;
        }
        let names = rest.rsplit("::").next().unwrap_or(rest);
        for name in names.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
            if !name.is_empty() {
                out.insert(name.to_string(), module.to_string());
            }
        }
    }
    out
}

/// Each `crate::…` a source names outside comments: (line, top-level module). A grouped
/// import may span lines.
fn crate_paths(text: &str, roots: &BTreeMap<String, String>) -> Vec<(usize, String)> {
    let code: String = text
        .lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("crate::") {
        let start = from + at + "crate::".len();
        from = start;
        if code[..start - "crate::".len()].ends_with('$') {
            // `$crate::…` in a macro: resolved where the macro is used.
            continue;
        }
        let line = code[..start].matches('\n').count() + 1;
        let rest = &code[start..];
        let names: Vec<&str> = if let Some(group) = rest.strip_prefix('{') {
            let inner = group.split('}').next().unwrap_or("");
            inner
                .split(',')
                .map(|item| item.trim().split("::").next().unwrap_or("").trim())
                .collect()
        } else {
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            if rest[end..].starts_with('!') {
                // A `#[macro_export]` macro: it lives at the root wherever it is written.
                continue;
            }
            vec![&rest[..end]]
        };
        for name in names.into_iter().filter(|name| !name.is_empty()) {
            let module = roots.get(name).map_or(name, String::as_str);
            out.push((line, module.to_string()));
        }
    }
    out
}
