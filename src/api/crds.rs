//! Renders the CustomResourceDefinitions (`sandbox-operator crds`).

use std::fs;
use std::path::Path;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use kube::CustomResourceExt;

use super::{Sandbox, SandboxBudget, SandboxTemplate, SandboxVolume, SandboxWarmPool};

/// Every CRD of the API, in a fixed order, as installed (this, not `Sandbox::crd()`, is what
/// `crds/` holds).
///
/// Doc comments are wrapped at 100 columns in the source; their descriptions are re-flowed
/// into one line per paragraph so that `kubectl explain` wraps them cleanly.
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![Sandbox::crd(), SandboxTemplate::crd(), SandboxVolume::crd()]
        .into_iter()
        .chain([SandboxBudget::crd()])
        .chain([SandboxWarmPool::crd()])
        .map(|mut crd| {
            for version in &mut crd.spec.versions {
                if let Some(schema) = version
                    .schema
                    .as_mut()
                    .and_then(|s| s.open_api_v3_schema.as_mut())
                {
                    reflow_schema(schema);
                }
            }
            crd
        })
        .collect()
}

/// Re-flows every description in a schema tree (see [`all`]).
fn reflow_schema(schema: &mut JSONSchemaProps) {
    if let Some(description) = schema.description.as_mut() {
        *description = reflow(description);
    }
    let children = schema
        .properties
        .iter_mut()
        .flat_map(|props| props.values_mut())
        .chain(schema.items.as_mut().and_then(|items| match items {
            JSONSchemaPropsOrArray::Schema(s) => Some(s.as_mut()),
            JSONSchemaPropsOrArray::Schemas(_) => None,
        }))
        .chain(schema.additional_properties.as_mut().and_then(|a| match a {
            JSONSchemaPropsOrBool::Schema(s) => Some(s.as_mut()),
            JSONSchemaPropsOrBool::Bool(_) => None,
        }));
    for child in children {
        reflow_schema(child);
    }
}

/// Joins the lines of each paragraph with spaces; paragraphs stay separated by a blank line.
fn reflow(text: &str) -> String {
    text.split("\n\n")
        .map(|para| {
            para.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// File name of a CRD: `<plural>.<group>.yaml` (its `metadata.name` plus `.yaml`).
pub fn file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}.{}.yaml", crd.spec.names.plural, crd.spec.group)
}

/// One CRD as a YAML document (no leading `---`).
///
/// Scalars that a YAML 1.1 reader (kubectl, via go-yaml) would resolve to another type —
/// the `idleAction` value `off`, say — are quoted. The text is parsed back and compared
/// with the CRD before it is returned, so what is written is exactly what is applied.
pub fn render(crd: &CustomResourceDefinition) -> Result<String, String> {
    let name = file_name(crd);
    let yaml =
        serde_saphyr::to_string(crd).map_err(|e| format!("cannot render CRD {name}: {e}"))?;
    let expected =
        serde_json::to_value(crd).map_err(|e| format!("cannot serialise CRD {name}: {e}"))?;
    let parsed: serde_json::Value = serde_yaml::from_str(&yaml)
        .map_err(|e| format!("rendered CRD {name} does not parse back: {e}"))?;
    if parsed != expected {
        return Err(format!(
            "rendered CRD {name} does not parse back to the same object"
        ));
    }
    Ok(yaml)
}

/// Every CRD as `(file name, YAML)`, in the order of [`all`].
pub fn files() -> Result<Vec<(String, String)>, String> {
    all()
        .iter()
        .map(|crd| Ok((file_name(crd), render(crd)?)))
        .collect()
}

/// Every CRD as one multi-document YAML stream (`---` before each document).
pub fn stream() -> Result<String, String> {
    Ok(files()?
        .into_iter()
        .map(|(_, yaml)| format!("---\n{yaml}"))
        .collect())
}

/// With `Some(dir)`: creates `dir` and writes one `<plural>.<group>.yaml` per CRD into it.
/// With `None`: prints all CRDs as one multi-document YAML stream on stdout.
pub fn write(out: Option<&Path>) -> Result<(), String> {
    match out {
        Some(dir) => {
            fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create directory {}: {e}", dir.display()))?;
            for (name, yaml) in files()? {
                let path = dir.join(&name);
                fs::write(&path, yaml)
                    .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            }
            Ok(())
        }
        None => {
            print!("{}", stream()?);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reflow_joins_lines_and_keeps_paragraphs() {
        assert_eq!(reflow("a b\nc d\n\ne\n f"), "a b c d\n\ne f");
        assert_eq!(reflow("one line"), "one line");
    }

    #[test]
    fn every_crd_renders_and_parses_back() {
        for (name, yaml) in files().unwrap() {
            assert!(name.ends_with(".sandboxes.dev.yaml"), "{name}");
            assert!(
                yaml.starts_with("apiVersion: apiextensions.k8s.io/v1"),
                "{name}"
            );
        }
        assert_eq!(stream().unwrap().matches("---\n").count(), 5);
    }
}
