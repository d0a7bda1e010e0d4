//! The generated CustomResourceDefinitions: checked in, well formed, and able to carry the
//! example manifests.
//!
//! Admission behaviour against a real API server (the `examples/invalid` manifests, the
//! immutable `spec.provider`) is exercised by the cluster tests; this file needs no cluster.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use sandbox_operator::api::{self, Sandbox, SandboxTemplate, SandboxVolume, crds};
use serde_json::Value;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn crd(kind: &str) -> CustomResourceDefinition {
    crds::all()
        .into_iter()
        .find(|c| c.spec.names.kind == kind)
        .unwrap_or_else(|| panic!("no CRD for {kind}"))
}

fn schema(kind: &str) -> Value {
    let crd = crd(kind);
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .expect("openAPIV3Schema");
    serde_json::to_value(schema).unwrap()
}

#[test]
fn checked_in_crds_are_up_to_date() {
    const HINT: &str =
        "crds/ is stale: run `make crds` (cargo run -- crds --out crds) and commit the result";
    let generated = crds::files().unwrap();
    for (name, yaml) in &generated {
        let path = repo("crds").join(name);
        let on_disk = fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{HINT}: cannot read {}: {e}", path.display()));
        assert!(
            on_disk == *yaml,
            "{HINT}: {name} differs from what `crds::all()` generates"
        );
    }
    let expected: BTreeSet<_> = generated.iter().map(|(n, _)| n.clone()).collect();
    let present: BTreeSet<_> = fs::read_dir(repo("crds"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") || n.ends_with(".yml"))
        .collect();
    assert_eq!(
        present, expected,
        "{HINT}: crds/ holds files no CRD generates"
    );
}

#[test]
fn generation_is_deterministic() {
    assert_eq!(crds::files().unwrap(), crds::files().unwrap());
    assert_eq!(crds::stream().unwrap(), crds::stream().unwrap());
}

#[test]
fn names_scope_and_subresources() {
    let cases = [
        ("Sandbox", "sandboxes", "sandbox", "sbx"),
        (
            "SandboxTemplate",
            "sandboxtemplates",
            "sandboxtemplate",
            "sbxt",
        ),
        ("SandboxVolume", "sandboxvolumes", "sandboxvolume", "sbxv"),
        ("SandboxBudget", "sandboxbudgets", "sandboxbudget", "sbxb"),
        (
            "SandboxWarmPool",
            "sandboxwarmpools",
            "sandboxwarmpool",
            "sbxwp",
        ),
    ];
    assert_eq!(crds::all().len(), cases.len());
    for (kind, plural, singular, short) in cases {
        let crd = crd(kind);
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some(format!("{plural}.sandboxes.dev").as_str())
        );
        assert_eq!(
            crds::file_name(&crd),
            format!("{plural}.sandboxes.dev.yaml")
        );
        assert_eq!(crd.spec.group, api::GROUP);
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(crd.spec.names.plural, plural);
        assert_eq!(crd.spec.names.singular.as_deref(), Some(singular));
        assert_eq!(crd.spec.names.short_names, Some(vec![short.to_string()]));
        assert_eq!(
            crd.spec.names.categories,
            Some(vec![api::CATEGORY.to_string()])
        );
        assert_eq!(crd.spec.versions.len(), 1);
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, api::VERSION);
        assert!(version.served && version.storage);
        let status = version
            .subresources
            .as_ref()
            .and_then(|s| s.status.as_ref());
        assert!(status.is_some(), "{kind} has no status subresource");
    }
}

#[test]
fn a_warm_pool_scales_through_the_scale_subresource() {
    let crd = crd("SandboxWarmPool");
    let scale = crd.spec.versions[0]
        .subresources
        .as_ref()
        .and_then(|s| s.scale.clone())
        .expect("a scale subresource");
    assert_eq!(scale.spec_replicas_path, ".spec.replicas");
    assert_eq!(scale.status_replicas_path, ".status.replicas");
}

#[test]
fn printer_columns() {
    let columns = |kind: &str| -> Vec<(String, String)> {
        crd(kind).spec.versions[0]
            .additional_printer_columns
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|c| (c.name, c.json_path))
            .collect()
    };
    let ready = r#".status.conditions[?(@.type=="Ready")].status"#.to_string();
    let age = ".metadata.creationTimestamp".to_string();
    let s = |x: &str| x.to_string();
    assert_eq!(
        columns("Sandbox"),
        vec![
            (s("Provider"), s(".status.provider")),
            (s("State"), s(".spec.state")),
            (s("Ready"), ready.clone()),
            (
                s("Reason"),
                s(r#".status.conditions[?(@.type=="Ready")].reason"#)
            ),
            (s("URL"), s(".status.url")),
            (s("Age"), age.clone()),
        ]
    );
    assert_eq!(
        columns("SandboxTemplate"),
        vec![
            (s("Provider"), s(".status.provider")),
            (s("Ready"), ready.clone()),
            (s("InUse"), s(".status.inUse")),
            (s("Published"), s(".status.published")),
            (s("Size"), s(".status.sizeBytes")),
            (s("Age"), age.clone()),
        ]
    );
    assert_eq!(
        columns("SandboxVolume"),
        vec![
            (s("Provider"), s(".status.provider")),
            (s("Ready"), ready),
            (s("Attached"), s(".status.attached")),
            (s("Reclaim"), s(".spec.reclaimPolicy")),
            (s("Age"), age),
        ]
    );
}

/// Walks a schema node and checks the structural-schema rules the API server enforces, plus
/// our own: no schema defaults, and every property documented (it is `kubectl explain`).
fn check_structural(node: &Value, path: &str, problems: &mut Vec<String>) {
    let Some(obj) = node.as_object() else {
        problems.push(format!("{path}: not an object"));
        return;
    };
    let int_or_string = obj.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    let preserve = obj.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    let ty = obj.get("type").and_then(Value::as_str);
    if ty.is_none() && !int_or_string && !preserve {
        problems.push(format!("{path}: no type"));
    }
    if int_or_string && ty.is_some() {
        problems.push(format!("{path}: int-or-string must not set a type"));
    }
    if obj.contains_key("default") {
        problems.push(format!("{path}: schema default (the CRDs carry none)"));
    }
    for key in [
        "oneOf",
        "allOf",
        "not",
        "$ref",
        "definitions",
        "additionalItems",
    ] {
        if obj.contains_key(key) {
            problems.push(format!("{path}: uses {key}"));
        }
    }
    if let Some(any_of) = obj.get("anyOf").and_then(Value::as_array) {
        for branch in any_of {
            for key in [
                "type",
                "description",
                "nullable",
                "default",
                "properties",
                "items",
            ] {
                if branch.get(key).is_some() && !(int_or_string && key == "type") {
                    problems.push(format!("{path}: anyOf branch sets {key}"));
                }
            }
        }
    }
    if let Some(enum_values) = obj.get("enum").and_then(Value::as_array)
        && (ty != Some("string") || !enum_values.iter().all(Value::is_string))
    {
        problems.push(format!("{path}: enum is not a plain string enum"));
    }
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        if ty != Some("object") {
            problems.push(format!("{path}: properties without type object"));
        }
        for (name, prop) in props {
            let child = format!("{path}.{name}");
            let documented = prop
                .get("description")
                .and_then(Value::as_str)
                .is_some_and(|d| !d.trim().is_empty());
            if !documented {
                problems.push(format!("{child}: no description"));
            }
            check_structural(prop, &child, problems);
        }
    }
    if let Some(items) = obj.get("items") {
        if ty != Some("array") {
            problems.push(format!("{path}: items without type array"));
        }
        if obj.get("x-kubernetes-list-type").and_then(Value::as_str) == Some("map") {
            let required: BTreeSet<&str> = items
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            for key in obj["x-kubernetes-list-map-keys"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let key = key.as_str().unwrap_or_default();
                if !required.contains(key) {
                    problems.push(format!("{path}: list-map key {key} is not required"));
                }
            }
        }
        check_structural(items, &format!("{path}[]"), problems);
    }
    if let Some(additional) = obj.get("additionalProperties")
        && additional.is_object()
    {
        check_structural(additional, &format!("{path}{{}}"), problems);
    }
}

#[test]
fn schemas_are_structural_documented_and_default_free() {
    for kind in [
        "Sandbox",
        "SandboxTemplate",
        "SandboxVolume",
        "SandboxBudget",
    ] {
        let mut problems = Vec::new();
        check_structural(&schema(kind), "", &mut problems);
        assert!(problems.is_empty(), "{kind}: {problems:#?}");
    }
}

/// The CEL rules (`x-kubernetes-validations`) at a path of property names.
fn rules_at(kind: &str, path: &[&str]) -> Vec<(String, String)> {
    let mut node = schema(kind);
    for segment in path {
        node = if *segment == "[]" {
            node["items"].clone()
        } else {
            node["properties"][*segment].clone()
        };
    }
    node["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            (
                r["rule"].as_str().unwrap_or_default().to_string(),
                r["message"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[test]
fn provider_is_immutable_on_every_kind() {
    for kind in ["Sandbox", "SandboxTemplate", "SandboxVolume"] {
        let rules = rules_at(kind, &["spec"]);
        let (rule, message) = rules
            .iter()
            .find(|(r, _)| r.contains("oldSelf.provider"))
            .unwrap_or_else(|| panic!("{kind}: no provider transition rule in {rules:?}"));
        // Changing, adding and removing are all covered.
        assert!(
            rule.contains("has(self.provider) == has(oldSelf.provider)"),
            "{rule}"
        );
        assert!(rule.contains("self.provider == oldSelf.provider"), "{rule}");
        assert_eq!(
            message,
            &format!(
                "spec.provider is immutable: delete and recreate the {kind} to move it to another provider"
            )
        );
    }
}

#[test]
fn cel_rules_are_where_they_belong() {
    let has = |kind: &str, path: &[&str], needle: &str| {
        let rules = rules_at(kind, path);
        assert!(
            rules
                .iter()
                .any(|(r, m)| r.contains(needle) || m.contains(needle)),
            "{kind} {path:?}: no rule mentioning {needle:?} in {rules:?}"
        );
    };
    // Whether a Sandbox needs spec.image depends on its provider's type, which admission
    // cannot know (Fly Sprites refuses an image): the providers refuse a missing one.
    // (Refusing it beside spec.warmPoolRef, `!has(self.image)`, is another matter.)
    assert!(
        !rules_at("Sandbox", &["spec"]).iter().any(|(r, _)| r
            .replace("!has(self.image)", "")
            .contains("has(self.image)")),
        "no admission rule may require spec.image of every provider"
    );
    has(
        "Sandbox",
        &["spec"],
        "spec.image cannot be set with spec.warmPoolRef",
    );
    has("Sandbox", &["spec"], "spec.warmPoolRef is immutable");
    has("SandboxWarmPool", &["spec"], "spec.template.warmPoolRef");
    has("Sandbox", &["spec", "lifetime"], "shutdownAt or ttlSeconds");
    has("Sandbox", &["spec", "labels"], "sandboxes.dev/");
    has("Sandbox", &["spec", "ports"], "exists_one");
    has(
        "Sandbox",
        &["spec", "volumes"],
        "w.mountPath == v.mountPath",
    );
    has("Sandbox", &["spec", "volumes", "[]", "mountPath"], "'/../'");
    has(
        "Sandbox",
        &["spec", "resources", "memory"],
        "must be greater than zero",
    );
    has(
        "SandboxTemplate",
        &["spec", "capturePaths", "[]"],
        "!self.contains('/../') && !self.endsWith('/..') && self != '/'",
    );
    has(
        "SandboxTemplate",
        &["spec", "capturePaths", "[]"],
        "shell metacharacters",
    );
    has(
        "SandboxVolume",
        &["spec", "size"],
        "must be greater than zero",
    );
}

#[test]
fn quantities_are_int_or_string_with_the_kubernetes_pattern() {
    let s = schema("Sandbox");
    for field in ["cpu", "memory", "disk"] {
        let q = &s["properties"]["spec"]["properties"]["resources"]["properties"][field];
        assert_eq!(q["x-kubernetes-int-or-string"], true, "{field}");
        assert_eq!(q["pattern"], api::QUANTITY_PATTERN, "{field}");
        assert!(q.get("type").is_none(), "{field}");
    }
    let env = &s["properties"]["spec"]["properties"]["env"];
    assert_eq!(env["x-kubernetes-list-type"], "map");
    assert_eq!(
        env["x-kubernetes-list-map-keys"],
        serde_json::json!(["name"])
    );
    let idle = &s["properties"]["spec"]["properties"]["idleAction"]["enum"];
    assert_eq!(idle, &serde_json::json!(["off", "stop", "suspend"]));
    // YAML 1.1 readers (kubectl) must still read `off` as a string in the file.
    let (_, yaml) = crds::files()
        .unwrap()
        .into_iter()
        .find(|(n, _)| n.starts_with("sandboxes."))
        .unwrap();
    assert!(
        !yaml.lines().any(|l| l.trim() == "- off"),
        "unquoted `off` in the CRD YAML"
    );
}

/// Every example manifest, parsed as YAML into JSON.
fn examples() -> Vec<(PathBuf, Value)> {
    let mut out = Vec::new();
    let mut paths: Vec<_> = fs::read_dir(repo("examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    paths.sort();
    for path in paths {
        let text = fs::read_to_string(&path).unwrap();
        let value: Value =
            serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        out.push((path, value));
    }
    out
}

/// Deserialises into the typed kind and serialises back.
fn round_trip(value: &Value) -> Value {
    match value["kind"].as_str() {
        Some("Sandbox") => {
            serde_json::to_value(serde_json::from_value::<Sandbox>(value.clone()).unwrap()).unwrap()
        }
        Some("SandboxTemplate") => {
            serde_json::to_value(serde_json::from_value::<SandboxTemplate>(value.clone()).unwrap())
                .unwrap()
        }
        Some("SandboxVolume") => {
            serde_json::to_value(serde_json::from_value::<SandboxVolume>(value.clone()).unwrap())
                .unwrap()
        }
        other => panic!("unexpected kind {other:?}"),
    }
}

#[test]
fn examples_round_trip_through_the_rust_types() {
    let examples = examples();
    let kinds: BTreeSet<_> = examples
        .iter()
        .map(|(_, v)| v["kind"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        kinds,
        BTreeSet::from([
            "Sandbox".into(),
            "SandboxTemplate".into(),
            "SandboxVolume".into()
        ])
    );
    for (path, value) in &examples {
        assert_eq!(value["apiVersion"], api::API_VERSION, "{}", path.display());
        assert_eq!(
            &round_trip(value),
            value,
            "{} does not round-trip",
            path.display()
        );
    }
}

#[test]
fn the_demo_sandbox_is_what_the_docs_say() {
    let text = fs::read_to_string(repo("examples/sandbox.yaml")).unwrap();
    let sbx: Sandbox = serde_yaml::from_str(&text).unwrap();
    assert_eq!(sbx.metadata.name.as_deref(), Some("demo"));
    assert_eq!(sbx.metadata.namespace.as_deref(), Some("default"));
    let spec = &sbx.spec;
    assert_eq!(
        spec.image.as_deref(),
        Some("sandbox-operator/base:bookworm")
    );
    assert_eq!(spec.command.as_ref().map(|c| c[0].as_str()), Some("perl"));
    assert!(spec.command.as_ref().unwrap()[3].contains("hello from sandbox"));
    let ports = spec.ports.as_ref().unwrap();
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0].port, 8080);
    let res = spec.resources.as_ref().unwrap();
    assert_eq!(res.cpu.as_ref().unwrap().to_millis(), Ok(500));
    assert_eq!(res.memory.as_ref().unwrap().to_bytes(), Ok(256 << 20));
    assert_eq!(res.pids, Some(256));
    assert!(spec.env.as_ref().is_some_and(|e| !e.is_empty()));
    assert!(spec.labels.as_ref().is_some_and(|l| !l.is_empty()));
    assert!(sbx.status.is_none());
}

#[test]
fn an_empty_status_deserialises() {
    let sbx: Sandbox = serde_json::from_value(serde_json::json!({
        "apiVersion": "sandboxes.dev/v1alpha1", "kind": "Sandbox",
        "metadata": {"name": "x"}, "spec": {"image": "i"}, "status": {}
    }))
    .unwrap();
    let status = sbx.status.unwrap();
    assert!(status.conditions.is_empty() && status.ports.is_empty());
    let tpl: SandboxTemplate = serde_json::from_value(serde_json::json!({
        "apiVersion": "sandboxes.dev/v1alpha1", "kind": "SandboxTemplate",
        "metadata": {"name": "x"},
        "spec": {"sandboxRef": {"name": "s"}, "capturePaths": ["/home"]},
        "status": {"ref": "sha256:abc"}
    }))
    .unwrap();
    assert_eq!(tpl.status.unwrap().ref_.as_deref(), Some("sha256:abc"));
    let vol: SandboxVolume = serde_json::from_value(serde_json::json!({
        "apiVersion": "sandboxes.dev/v1alpha1", "kind": "SandboxVolume",
        "metadata": {"name": "x"}, "spec": {}, "status": {}
    }))
    .unwrap();
    assert!(vol.status.unwrap().attached_to.is_empty());
}

#[test]
fn invalid_examples_say_what_the_api_server_answers() {
    let mut count = 0;
    for entry in fs::read_dir(repo("examples/invalid")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        count += 1;
        let text = fs::read_to_string(&path).unwrap();
        let first = text.lines().next().unwrap_or_default();
        let expect = first.strip_prefix("# expect: ").unwrap_or_default();
        assert!(
            !expect.trim().is_empty(),
            "{}: first line must be `# expect: <substring>`",
            path.display()
        );
        let value: Value = serde_yaml::from_str(&text)
            .unwrap_or_else(|e| panic!("{}: not YAML: {e}", path.display()));
        assert_eq!(value["apiVersion"], api::API_VERSION, "{}", path.display());
    }
    assert!(count >= 16, "only {count} invalid manifests");
}

#[test]
fn the_structural_check_catches_what_the_api_server_rejects() {
    let bad = serde_json::json!({
        "type": "object",
        "properties": {
            "a": {"description": "no type"},
            "b": {"type": "string", "description": "d", "default": "x"},
            "c": {"description": "d", "anyOf": [{"type": "string"}, {"type": "integer"}]},
            "d": {"type": "string"},
            "e": {"type": "string", "description": "d", "enum": [false, "stop"]},
            "f": {"type": "array", "description": "d", "x-kubernetes-list-type": "map",
                  "x-kubernetes-list-map-keys": ["k"],
                  "items": {"type": "object", "properties": {"k": {"type": "string", "description": "d"}}}}
        }
    });
    let mut problems = Vec::new();
    check_structural(&bad, "", &mut problems);
    let all = problems.join("\n");
    for needle in [
        ".a: no type",
        ".b: schema default",
        ".c: anyOf branch sets type",
        ".d: no description",
        ".e: enum is not a plain string enum",
        ".f: list-map key k is not required",
    ] {
        assert!(all.contains(needle), "missed {needle:?} in:\n{all}");
    }
}
