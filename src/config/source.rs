//! Errors that name the file and line of what they are about, and the map from
//! byte offsets (kept by `Spanned` values) to those lines.

use std::fmt;
use std::path::{Path, PathBuf};

use toml::Spanned;

/// A configuration error that points at the place it comes from.
#[derive(Debug)]
pub struct ConfigError {
    pub file: String,
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{}: {}", self.file, line, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Turns byte offsets into line numbers for errors found after parsing.
pub struct SourceMap<'a> {
    file: &'a str,
    text: &'a str,
}

impl<'a> SourceMap<'a> {
    /// `file` names the configuration in messages; `text` is what was parsed.
    pub(super) fn new(file: &'a str, text: &'a str) -> SourceMap<'a> {
        SourceMap { file, text }
    }

    pub fn error<T>(&self, span: &Spanned<T>, message: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.file.to_string(),
            line: self.line(span),
            message: message.into(),
        }
    }

    /// The line a value was written on.
    pub fn line<T>(&self, span: &Spanned<T>) -> Option<usize> {
        let range = span.span();
        // Defaults carry an empty span at 0: they have no line.
        (range.end > 0).then(|| self.text[..range.start].matches('\n').count() + 1)
    }

    /// The configuration's name in messages.
    pub fn file(&self) -> &str {
        self.file
    }

    /// An error about a `[table]` as a whole: it names the table's header line.
    pub fn table_error(&self, table: &str, message: impl Into<String>) -> ConfigError {
        let header = format!("[{table}]");
        let line = self
            .text
            .lines()
            .position(|line| line.trim() == header)
            .map(|index| index + 1);
        ConfigError {
            file: self.file.to_string(),
            line,
            message: message.into(),
        }
    }

    pub fn plain(&self, message: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.file.to_string(),
            line: None,
            message: message.into(),
        }
    }

    /// Resolves a path from the config relative to the config file's directory.
    pub fn resolve(&self, path: &Path) -> PathBuf {
        if path.is_absolute() {
            return path.to_path_buf();
        }
        Path::new(self.file)
            .parent()
            .map(|dir| dir.join(path))
            .unwrap_or_else(|| path.to_path_buf())
    }
}

/// Resolves a configured path against the config file's directory; it must be a file.
pub(super) fn resolve_file(
    map: &SourceMap<'_>,
    path: &mut Spanned<PathBuf>,
    key: &str,
) -> Result<(), ConfigError> {
    let resolved = map.resolve(path.get_ref());
    if !resolved.is_file() {
        return Err(map.error(
            path,
            format!("key `{key}`: no such file {}", resolved.display()),
        ));
    }
    *path.get_mut() = resolved;
    Ok(())
}
