//! The project's documentation, for the tests that check what it says.

use std::path::{Path, PathBuf};

/// The repository's root.
pub fn repository() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// README.md, then every page under docs/ in name order.
pub fn documents() -> Vec<PathBuf> {
    let mut documents = vec![repository().join("README.md")];
    let mut pages: Vec<PathBuf> = std::fs::read_dir(repository().join("docs"))
        .expect("docs/")
        .map(|entry| entry.expect("a docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    pages.sort();
    documents.extend(pages);
    documents
}
