//! Reading manifest files and directories for `lifeguard policy check|diff` and
//! `lifeguard exception …`.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use lifeguard::policy::ManifestFile;

/// Every manifest named by `paths`: files as given, directories searched recursively for
/// `*.yaml` and `*.yml` (in name order, hidden entries skipped). A file that cannot be read
/// becomes a file-level finding, not an error of the command.
pub fn read_manifests(paths: &[PathBuf]) -> Result<Vec<ManifestFile>> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            let mut found = Vec::new();
            yaml_files(path, &mut found)
                .with_context(|| format!("reading directory {}", path.display()))?;
            found.sort();
            files.extend(found.iter().map(|p| read(p)));
        } else {
            files.push(read(path));
        }
    }
    Ok(files)
}

fn read(path: &Path) -> ManifestFile {
    match fs::read_to_string(path) {
        Ok(text) => parse_manifest_file(path, &text),
        Err(e) => ManifestFile::unreadable(path.display().to_string(), &e),
    }
}

/// `text`, read from `path`, as the manifest file every command checks (`policy check|diff`,
/// `exception sign|verify|payload`): the same name, so the same findings word for word.
pub fn parse_manifest_file(path: &Path, text: &str) -> ManifestFile {
    ManifestFile::parse(path.display().to_string(), text)
}

fn yaml_files(dir: &Path, found: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        if entry.file_type()?.is_dir() {
            yaml_files(&path, found)?;
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            found.push(path);
        }
    }
    Ok(())
}
