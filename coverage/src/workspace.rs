//! Map source file paths to workspace folders (`hal`, `mp_tests/ibv-testprov`, `core`, ...).
//!
//! A crate is named by its folder relative to the workspace root, as `thresholds.json` names
//! it. A path under no member folder (outside the workspace, or in a folder that is not a
//! member) belongs to [`OTHER`], which is still counted in the total so nothing is dropped
//! silently.

use std::path::{Component, Path, PathBuf};

use crate::CoverageError;

/// The bucket for paths under no workspace member folder.
pub const OTHER: &str = "(other)";

/// Workspace root and member folders, longest first so nested members win.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrateMap {
    root: PathBuf,
    folders: Vec<String>,
}

impl CrateMap {
    /// A map from the workspace root and member folders relative to it (`"mp_tests/ibv-testprov"`).
    pub fn new(root: impl Into<PathBuf>, folders: impl IntoIterator<Item = String>) -> Self {
        let mut folders: Vec<String> = folders
            .into_iter()
            .map(|f| f.trim_matches('/').to_string())
            .collect();
        folders.sort_by(|a, b| {
            Path::new(b)
                .components()
                .count()
                .cmp(&Path::new(a).components().count())
                .then_with(|| a.cmp(b))
        });
        folders.dedup();
        CrateMap {
            root: root.into(),
            folders,
        }
    }

    /// Build from `cargo metadata --no-deps --format-version 1` output.
    pub fn from_cargo_metadata(json: &str) -> Result<Self, CoverageError> {
        let value: serde_json::Value = serde_json::from_str(json)
            .map_err(|e| CoverageError::Metadata(format!("expected JSON: {e}")))?;
        let root = value
            .get("workspace_root")
            .and_then(|v| v.as_str())
            .ok_or_else(|| CoverageError::Metadata("expected a string workspace_root".into()))?;
        let root = PathBuf::from(root);
        let packages = value
            .get("packages")
            .and_then(|v| v.as_array())
            .ok_or_else(|| CoverageError::Metadata("expected a packages array".into()))?;
        let mut folders = Vec::new();
        for package in packages {
            let manifest = package
                .get("manifest_path")
                .and_then(|v| v.as_str())
                .ok_or_else(|| {
                    CoverageError::Metadata("expected manifest_path on every package".into())
                })?;
            let dir = Path::new(manifest).parent().ok_or_else(|| {
                CoverageError::Metadata(format!("manifest_path {manifest} has no parent folder"))
            })?;
            let relative = dir.strip_prefix(&root).map_err(|_| {
                CoverageError::Metadata(format!(
                    "package folder {} is not under the workspace root {}",
                    dir.display(),
                    root.display()
                ))
            })?;
            folders.push(relative.to_string_lossy().into_owned());
        }
        Ok(CrateMap::new(root, folders))
    }

    /// The workspace root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Member folders, longest first.
    pub fn folders(&self) -> &[String] {
        &self.folders
    }

    /// The member folder a source path belongs to, or [`OTHER`].
    pub fn crate_of(&self, source: &str) -> &str {
        let path = Path::new(source);
        let relative: PathBuf = if path.is_absolute() {
            match path.strip_prefix(&self.root) {
                Ok(rel) => rel.to_path_buf(),
                Err(_) => return OTHER,
            }
        } else {
            path.components()
                .filter(|c| !matches!(c, Component::CurDir))
                .collect()
        };
        self.folders
            .iter()
            .find(|folder| folder.is_empty() || relative.starts_with(folder.as_str()))
            .map_or(OTHER, |f| if f.is_empty() { "." } else { f.as_str() })
    }
}
