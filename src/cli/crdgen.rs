//! `lifeguard crdgen`: CRD YAML from the Rust types.

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};

pub fn run(out_dir: &Path, to_stdout: bool) -> Result<()> {
    let rendered = lifeguard::api::render_crd_files().context("rendering the CRDs")?;
    if to_stdout {
        let docs: Vec<&str> = rendered.iter().map(|(_, yaml)| yaml.as_str()).collect();
        print!("{}", docs.join("---\n"));
        return Ok(());
    }
    fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    for (file, yaml) in rendered {
        let path = out_dir.join(file);
        fs::write(&path, yaml).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
