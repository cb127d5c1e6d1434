//! Manifest input: YAML or JSON files (multi-document, `kind: List`) holding the objects a
//! cluster would stream, decoded into their k8s-openapi types.

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// One object read from a manifest.
#[derive(Debug, Clone)]
pub enum Object {
    Service(Box<Service>),
    EndpointSlice(Box<EndpointSlice>),
    Node(Box<Node>),
    ServiceCidr(Box<ServiceCIDR>),
}

/// Everything read from a manifest path.
#[derive(Debug, Clone, Default)]
pub struct Manifests {
    pub services: Vec<Service>,
    pub slices: Vec<EndpointSlice>,
    pub nodes: Vec<Node>,
    pub service_cidrs: Vec<ServiceCIDR>,
}

impl Manifests {
    fn push(&mut self, o: Object) {
        match o {
            Object::Service(s) => self.services.push(*s),
            Object::EndpointSlice(s) => self.slices.push(*s),
            Object::Node(n) => self.nodes.push(*n),
            Object::ServiceCidr(c) => self.service_cidrs.push(*c),
        }
    }
}

/// A manifest that cannot be used, naming the file, the object and the field.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: not valid YAML or JSON (document {doc}): {message}", path.display())]
    Syntax {
        path: PathBuf,
        doc: usize,
        message: String,
    },
    #[error("{}: {kind} {name}: field {field}: {message}", path.display())]
    Decode {
        path: PathBuf,
        kind: String,
        name: String,
        field: String,
        message: String,
    },
    #[error("{}: no manifest files (*.yaml, *.yml, *.json) found", path.display())]
    Empty { path: PathBuf },
}

/// Files to read: the path itself, or the manifest files under a directory, sorted.
fn files(path: &Path) -> Result<Vec<PathBuf>, ManifestError> {
    let read_err = |source| ManifestError::Read {
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(read_err)?;
    if !meta.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut out = Vec::new();
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|source| ManifestError::Read {
            path: dir.clone(),
            source,
        })?;
        for entry in entries {
            let entry = entry.map_err(|source| ManifestError::Read {
                path: dir.clone(),
                source,
            })?;
            let p = entry.path();
            let hidden = p
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with('.'));
            if hidden {
                continue;
            }
            if p.is_dir() {
                stack.push(p);
            } else if matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml" | "json")
            ) {
                out.push(p);
            }
        }
    }
    out.sort();
    if out.is_empty() {
        return Err(ManifestError::Empty {
            path: path.to_path_buf(),
        });
    }
    Ok(out)
}

/// Load every object under `path`.
pub fn load(path: &Path) -> Result<Manifests, ManifestError> {
    let mut m = Manifests::default();
    for file in files(path)? {
        let text = std::fs::read_to_string(&file).map_err(|source| ManifestError::Read {
            path: file.clone(),
            source,
        })?;
        for o in parse(&text, &file)? {
            m.push(o);
        }
    }
    Ok(m)
}

/// Parse one file's text. JSON goes straight to serde_json (large `kubectl -o json` dumps parse
/// several times faster and in a fraction of the memory); YAML through serde_yaml.
pub fn parse(text: &str, path: &Path) -> Result<Vec<Object>, ManifestError> {
    let mut out = Vec::new();
    let json = path.extension().and_then(|e| e.to_str()) == Some("json")
        || text.trim_start().starts_with('{');
    if json {
        let docs = serde_json::Deserializer::from_str(text).into_iter::<serde_json::Value>();
        for (i, doc) in docs.enumerate() {
            let value = doc.map_err(|e| ManifestError::Syntax {
                path: path.to_path_buf(),
                doc: i + 1,
                message: e.to_string(),
            })?;
            collect(value, path, &mut out)?;
        }
        return Ok(out);
    }
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let syntax = |message: String| ManifestError::Syntax {
            path: path.to_path_buf(),
            doc: i + 1,
            message,
        };
        let value = serde_yaml::Value::deserialize(doc).map_err(|e| syntax(e.to_string()))?;
        let value = serde_json::to_value(value).map_err(|e| syntax(e.to_string()))?;
        collect(value, path, &mut out)?;
    }
    Ok(out)
}

fn str_at<'a>(v: &'a serde_json::Value, keys: &[&str]) -> Option<&'a str> {
    let mut cur = v;
    for k in keys {
        cur = cur.get(*k)?;
    }
    cur.as_str()
}

fn decode<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T, (String, String)> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let field = e.path().to_string();
        (field, e.into_inner().to_string())
    })
}

fn collect(
    mut value: serde_json::Value,
    path: &Path,
    out: &mut Vec<Object>,
) -> Result<(), ManifestError> {
    if value.is_null() {
        return Ok(());
    }
    let kind = str_at(&value, &["kind"]).unwrap_or_default().to_string();
    let api = str_at(&value, &["apiVersion"])
        .unwrap_or_default()
        .to_string();
    let name = match (
        str_at(&value, &["metadata", "namespace"]),
        str_at(&value, &["metadata", "name"]),
    ) {
        (Some(ns), Some(n)) => format!("{ns}/{n}"),
        (None, Some(n)) => n.to_string(),
        _ => "(unnamed)".to_string(),
    };
    if kind == "List" || (kind.ends_with("List") && value.get("items").is_some()) {
        if let serde_json::Value::Array(items) = value["items"].take() {
            for item in items {
                collect(item, path, out)?;
            }
        }
        return Ok(());
    }
    let obj = match (api.as_str(), kind.as_str()) {
        ("v1", "Service") => decode(value).map(|s| Object::Service(Box::new(s))),
        ("discovery.k8s.io/v1", "EndpointSlice") => {
            decode(value).map(|s| Object::EndpointSlice(Box::new(s)))
        }
        ("v1", "Node") => decode(value).map(|n| Object::Node(Box::new(n))),
        ("networking.k8s.io/v1" | "networking.k8s.io/v1beta1", "ServiceCIDR") => {
            decode(value).map(|c| Object::ServiceCidr(Box::new(c)))
        }
        _ => {
            tracing::debug!(file = %path.display(), %api, %kind, %name, "ignoring object of another kind");
            return Ok(());
        }
    };
    match obj {
        Ok(o) => out.push(o),
        Err((field, message)) => {
            return Err(ManifestError::Decode {
                path: path.to_path_buf(),
                kind,
                name,
                field,
                message,
            })
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_document_and_lists() {
        let text = r#"
apiVersion: v1
kind: Service
metadata: { name: a, namespace: ns }
spec: { clusterIP: 10.96.0.1, ports: [{ port: 80 }] }
---
apiVersion: v1
kind: List
items:
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: { name: a-1, namespace: ns, labels: { kubernetes.io/service-name: a } }
  addressType: IPv4
  endpoints: [{ addresses: [10.0.0.1] }]
- apiVersion: v1
  kind: ConfigMap
  metadata: { name: ignored }
---
{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}
"#;
        let objs = parse(text, Path::new("x.yaml")).unwrap();
        assert_eq!(objs.len(), 3);
        assert!(matches!(objs[0], Object::Service(_)));
        assert!(matches!(objs[1], Object::EndpointSlice(_)));
        assert!(matches!(objs[2], Object::Node(_)));
    }

    #[test]
    fn json_documents_and_lists() {
        let text = r#"{"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a", "namespace": "ns"},
             "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": 80}]}}]}
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}"#;
        let objs = parse(text, Path::new("x.json")).unwrap();
        assert_eq!(objs.len(), 2);
        let e = parse(r#"{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"}, "spec": {"ports": [{"port": "x"}]}}"#, Path::new("y.json")).unwrap_err().to_string();
        assert!(
            e.contains("y.json") && e.contains("Service a") && e.contains("spec.ports[0].port"),
            "{e}"
        );
    }

    #[test]
    fn decode_errors_name_file_object_and_field() {
        let text = "apiVersion: v1\nkind: Service\nmetadata: { name: a, namespace: ns }\nspec: { ports: [{ port: eighty }] }\n";
        let e = parse(text, Path::new("bad.yaml")).unwrap_err().to_string();
        assert!(
            e.contains("bad.yaml")
                && e.contains("Service ns/a")
                && e.contains("spec.ports[0].port"),
            "{e}"
        );
        let e = parse("a: [", Path::new("broken.yaml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("broken.yaml"), "{e}");
    }
}
