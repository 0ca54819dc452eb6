//! The follower's own token for the API: where it comes from, and why one
//! is refused before it is ever sent.

use std::path::PathBuf;

/// The variable a token may come from.
pub const TOKEN_VARIABLE: &str = "TOLLGATE_CONFIG_API_TOKEN";

/// What the server's token is, for messages about a wrong one.
pub const TOKEN_FORMAT: &str = "it must hold a `read` token of the config API alone \
    (the TOKEN of a `read:NAME:TOKEN` line of the API's tokens file)";

/// Where the server's token for the API comes from: named in the
/// messages of a refusal, and read again after one (a fixed file is taken
/// without a restart).
#[derive(Clone, Debug)]
pub enum TokenSource {
    /// A file, and how messages name it: the program that names the file
    /// knows how its user gave it (the binary says `--config-api-token-file`);
    /// [`TokenSource::file`] says "the token file".
    File {
        /// The file.
        path: PathBuf,
        /// What messages call it, before its path.
        label: &'static str,
    },
    /// [`TOKEN_VARIABLE`], which this crate reads itself.
    Env,
}

impl std::fmt::Display for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenSource::File { path, label } => write!(f, "{label} {}", path.display()),
            TokenSource::Env => f.write_str(TOKEN_VARIABLE),
        }
    }
}

/// A token that cannot be used, named by its source; no message quotes
/// the token.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    /// The file cannot be read.
    #[error("cannot read {0}")]
    Unreadable(TokenSource, #[source] std::io::Error),
    /// The file is not UTF-8.
    #[error("{0} is not valid UTF-8")]
    FileNotUtf8(TokenSource, #[source] std::string::FromUtf8Error),
    /// The variable is not unicode.
    #[error("{0} is not valid UTF-8: {TOKEN_FORMAT}")]
    VariableNotUnicode(TokenSource),
    /// No file was named and the variable is not set.
    #[error("the config API needs a token: a token file, or {TOKEN_VARIABLE}")]
    Missing,
    /// Only whitespace.
    #[error("{0} is empty: {TOKEN_FORMAT}")]
    Empty(TokenSource),
    /// More than one line.
    #[error("{0} holds several lines: {TOKEN_FORMAT}")]
    SeveralLines(TokenSource),
    /// A control character (its code point) inside the token.
    #[error("{0} holds the control character U+{1:04X}: {TOKEN_FORMAT}")]
    ControlCharacter(TokenSource, u32),
}

impl TokenSource {
    /// The token file at `path`, called "the token file" in messages.
    pub fn file(path: impl Into<PathBuf>) -> TokenSource {
        TokenSource::File {
            path: path.into(),
            label: "the token file",
        }
    }

    /// The token it holds: the text, surrounding whitespace (a final
    /// newline) ignored. An empty one, one of several lines, or one with
    /// another control character is refused here rather than sent and
    /// refused by the API. No message quotes the token.
    pub fn read(&self) -> Result<String, TokenError> {
        let text = match self {
            TokenSource::File { path, .. } => {
                let bytes =
                    std::fs::read(path).map_err(|e| TokenError::Unreadable(self.clone(), e))?;
                String::from_utf8(bytes).map_err(|e| TokenError::FileNotUtf8(self.clone(), e))?
            }
            TokenSource::Env => match std::env::var(TOKEN_VARIABLE) {
                Ok(text) => text,
                Err(std::env::VarError::NotPresent) => return Err(TokenError::Missing),
                Err(std::env::VarError::NotUnicode(_)) => {
                    return Err(TokenError::VariableNotUnicode(self.clone()))
                }
            },
        };
        let token = text.trim();
        if token.is_empty() {
            return Err(TokenError::Empty(self.clone()));
        }
        if token.contains(['\n', '\r']) {
            return Err(TokenError::SeveralLines(self.clone()));
        }
        if let Some(c) = token.chars().find(|c| c.is_control()) {
            return Err(TokenError::ControlCharacter(self.clone(), u32::from(c)));
        }
        Ok(token.to_owned())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::error::chain;
    use super::super::tests::temp_file;
    use super::*;

    /// Review of issue 23: every control character was called "more than
    /// one line"; a variable that is not unicode was "needs a token".
    #[test]
    fn a_token_is_refused_naming_what_is_wrong_without_quoting_it() {
        let cases: [(&[u8], &str); 5] = [
            (b"  \n", "is empty"),
            (b"abc\ndef\n", "holds several lines"),
            (b"abc\rdef", "holds several lines"),
            (b"abc\x1bdef", "holds the control character U+001B"),
            (b"abc\xffdef", "is not valid UTF-8"),
        ];
        for (i, (contents, problem)) in cases.into_iter().enumerate() {
            let path = temp_file(&format!("bad-{i}"), contents);
            let e = chain(&TokenSource::file(path.clone()).read().unwrap_err());
            assert!(
                e.starts_with(&format!("the token file {} {problem}", path.display())),
                "{e}"
            );
            assert!(!e.contains("abc"), "{e}");
        }
        let path = temp_file("good", b"\t a-token-of-this-server \n");
        assert_eq!(
            TokenSource::file(path).read().unwrap(),
            "a-token-of-this-server"
        );
    }
}
