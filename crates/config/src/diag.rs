//! Diagnostics: errors and warnings that name file, line and column.

use std::fmt;

use thiserror::Error;

/// Where something was written: file, 1-based line and column.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pos {
    /// The file name as given to the loader.
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub col: usize,
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Line 0 is the file as a whole (it could not be read): no
        // position to give.
        if self.line == 0 {
            write!(f, "{}", self.file)
        } else {
            write!(f, "{}:{}:{}", self.file, self.line, self.col)
        }
    }
}

/// One problem found in a config, at a position.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Diagnostic {
    /// Where.
    pub pos: Pos,
    /// What, in one sentence.
    pub message: String,
}

impl Diagnostic {
    /// A diagnostic at `pos`.
    pub fn new(pos: &Pos, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            pos: pos.clone(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.pos, self.message)
    }
}

/// A config that cannot be used: every error found, in file order.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub struct ConfigError {
    /// The errors; never empty.
    pub errors: Vec<Diagnostic>,
}

impl ConfigError {
    /// A config error with one diagnostic.
    pub fn one(pos: &Pos, message: impl Into<String>) -> ConfigError {
        ConfigError {
            errors: vec![Diagnostic::new(pos, message)],
        }
    }
}

impl ConfigError {
    /// The diagnostics, one per line, without the `error: ` that
    /// [`Display`](fmt::Display) starts each with: for a caller that says
    /// "error" itself (a server's log, a wrapped error).
    pub fn plain(&self) -> String {
        self.errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "error: {e}")?;
        }
        Ok(())
    }
}

/// Collects errors and warnings while a config is read, so a user sees
/// every problem at once instead of one per run.
#[derive(Debug, Default)]
pub struct Diagnostics {
    /// Problems that make the config unusable.
    pub errors: Vec<Diagnostic>,
    /// Changes normalization made, and other things worth knowing.
    pub warnings: Vec<Diagnostic>,
}

impl Diagnostics {
    /// Records an error.
    pub fn error(&mut self, pos: &Pos, message: impl Into<String>) {
        self.errors.push(Diagnostic::new(pos, message));
    }

    /// Records a warning.
    pub fn warn(&mut self, pos: &Pos, message: impl Into<String>) {
        self.warnings.push(Diagnostic::new(pos, message));
    }

    /// Unwraps a result, recording its error; `None` on error.
    pub fn take<T>(&mut self, r: Result<T, Diagnostic>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(d) => {
                self.errors.push(d);
                None
            }
        }
    }
}
