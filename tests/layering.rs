//! The layering, checked: the provider seam and its providers sit below the controllers, the
//! templates service and the run loop, so nothing under `src/provider/` may import them. A
//! provider that reached up would make the seam depend on what is built on it (and every
//! provider change a controller change).

use std::fs;
use std::path::{Path, PathBuf};

/// Modules above the providers.
const ABOVE: &[&str] = &["crate::controller", "crate::templates", "crate::run"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("readable source directory") {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every mention of a module above, as `file:line: text`. Comments count too: a doc link
/// upward is an arrow a reader follows.
fn upward_references(root: &Path) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    let mut found = Vec::new();
    for file in files {
        let text = fs::read_to_string(&file).expect("readable source file");
        for (n, line) in text.lines().enumerate() {
            let compact: String = line.split_whitespace().collect();
            if ABOVE.iter().any(|m| mentions(&compact, m)) {
                found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    found
}

/// Whether `line` (whitespace removed) names `module` itself or something in it, including
/// the grouped form `crate::{controller, …}`.
fn mentions(line: &str, module: &str) -> bool {
    let name = module.trim_start_matches("crate::");
    let whole = |rest: &str| !rest.starts_with(|c: char| c.is_alphanumeric() || c == '_');
    line.match_indices(module)
        .any(|(i, m)| whole(&line[i + m.len()..]))
        || line.match_indices("crate::{").any(|(i, m)| {
            let group = &line[i + m.len()..];
            let group = &group[..group.find('}').unwrap_or(group.len())];
            group
                .split(',')
                .any(|item| item == name || item.starts_with(&format!("{name}::")))
        })
}

#[test]
fn nothing_under_provider_imports_a_module_above_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/provider");
    let found = upward_references(&root);
    assert!(
        found.is_empty(),
        "src/provider must not reach up into {ABOVE:?}:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_check_sees_every_form_of_import() {
    assert!(mentions(
        "usecrate::controller::echoes::Echoes;",
        "crate::controller"
    ));
    assert!(mentions("usecrate::run;", "crate::run"));
    assert!(mentions(
        "usecrate::{api,templates::store};",
        "crate::templates"
    ));
    assert!(mentions(
        "letx=crate::templates::Service::new();",
        "crate::templates"
    ));
    assert!(!mentions("usecrate::runtime::X;", "crate::run"));
    assert!(!mentions(
        "usecrate::provider::tarsafe;",
        "crate::templates"
    ));
    let dir = std::env::temp_dir().join(format!("layering-{}", std::process::id()));
    fs::create_dir_all(dir.join("inner")).unwrap();
    fs::write(
        dir.join("inner/bad.rs"),
        "use crate::controller::Context;\n",
    )
    .unwrap();
    fs::write(dir.join("good.rs"), "use crate::provider::Change;\n").unwrap();
    let found = upward_references(&dir);
    fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("bad.rs:1"));
}
