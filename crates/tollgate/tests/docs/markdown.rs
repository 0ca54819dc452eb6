//! The shell examples of a Markdown file: every ```sh block, split into
//! commands and the output the page shows for each.
//!
//! The format is the one a reader sees: in a block with `$ ` prompts, each
//! prompt line is a command (a trailing `\` or a here-document continues
//! it) and the lines up to the next prompt are its output; a block without
//! prompts is a script whose every command must succeed. An HTML comment
//! right before a block, invisible on the rendered page, can say why the
//! block is not run (`<!-- doc-test: skip: REASON -->`) or which tool it
//! needs (`<!-- doc-test: needs TOOL -->`).

/// One shell block of a page.
#[derive(Debug)]
pub struct Block {
    /// 1-based line of the opening fence.
    pub line: usize,
    /// Why the block is not run, when the page says so.
    pub skip: Option<String>,
    /// A program the block needs; it is skipped, with a note, when the
    /// program is not installed.
    pub needs: Option<String>,
    /// Its commands, in order.
    pub steps: Vec<Step>,
}

/// One command of a block.
#[derive(Debug, Clone)]
pub struct Step {
    /// 1-based line of the command in the page.
    pub line: usize,
    /// The command as written, continuation lines included.
    pub command: String,
    /// The output the page shows for it (prompt blocks only; empty when the
    /// page shows none). `None` in a script block.
    pub expected: Option<Vec<String>>,
}

/// The languages whose blocks are run.
const SHELL: &[&str] = &["sh", "bash", "console", "shell"];

/// Parses every shell block of `text`. Errors name the line of a
/// directive the harness does not understand.
pub fn blocks(text: &str) -> Result<Vec<Block>, String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(lang) = lines[i].strip_prefix("```") else {
            i += 1;
            continue;
        };
        let open = i;
        let end = (i + 1..lines.len())
            .find(|&j| lines[j].trim_end() == "```")
            .ok_or_else(|| format!("line {}: a code block that never closes", open + 1))?;
        if SHELL.contains(&lang.trim()) {
            let (skip, needs) = directive(&lines, open)?;
            let body: Vec<(usize, &str)> = (open + 1..end).map(|j| (j + 1, lines[j])).collect();
            out.push(Block {
                line: open + 1,
                skip,
                needs,
                steps: steps(&body),
            });
        }
        i = end + 1;
    }
    Ok(out)
}

/// The `<!-- doc-test: ... -->` comment on the line before a fence.
fn directive(lines: &[&str], fence: usize) -> Result<(Option<String>, Option<String>), String> {
    let Some(prev) = fence.checked_sub(1).map(|p| lines[p].trim()) else {
        return Ok((None, None));
    };
    let Some(inner) = prev
        .strip_prefix("<!-- doc-test:")
        .and_then(|s| s.strip_suffix("-->"))
    else {
        return Ok((None, None));
    };
    let inner = inner.trim();
    if let Some(reason) = inner.strip_prefix("skip:") {
        let reason = reason.trim();
        if reason.is_empty() {
            return Err(format!("line {fence}: a skip must say why"));
        }
        return Ok((Some(reason.to_owned()), None));
    }
    if let Some(tool) = inner.strip_prefix("needs ") {
        return Ok((None, Some(tool.trim().to_owned())));
    }
    Err(format!(
        "line {fence}: unknown doc-test directive `{inner}`"
    ))
}

/// Splits a block's lines into steps.
fn steps(body: &[(usize, &str)]) -> Vec<Step> {
    let prompted = body.iter().any(|(_, l)| l.starts_with("$ "));
    let mut out = Vec::new();
    let mut k = 0;
    while k < body.len() {
        let (line, text) = body[k];
        if prompted {
            let Some(first) = text.strip_prefix("$ ") else {
                // Text before the first prompt: nothing to run.
                k += 1;
                continue;
            };
            let (command, next) = command(body, k, first);
            k = next;
            let mut expected = Vec::new();
            while k < body.len() && !body[k].1.starts_with("$ ") {
                expected.push(body[k].1.to_owned());
                k += 1;
            }
            while expected.last().is_some_and(|l| l.trim().is_empty()) {
                expected.pop();
            }
            out.push(Step {
                line,
                command,
                expected: Some(expected),
            });
        } else {
            let trimmed = text.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                k += 1;
                continue;
            }
            let (command, next) = command(body, k, text);
            k = next;
            out.push(Step {
                line,
                command,
                expected: None,
            });
        }
    }
    out
}

/// The command starting at `body[k]` (whose text, prompt removed, is
/// `first`): continuation lines and here-documents included. Returns it
/// and the index of the line after it.
fn command(body: &[(usize, &str)], k: usize, first: &str) -> (String, usize) {
    let mut command = first.to_owned();
    let mut k = k + 1;
    let mut current = first;
    while current.trim_end().ends_with('\\') && k < body.len() {
        current = body[k].1;
        command.push('\n');
        command.push_str(current);
        k += 1;
    }
    if let Some(word) = heredoc(&command) {
        while k < body.len() {
            let line = body[k].1;
            command.push('\n');
            command.push_str(line);
            k += 1;
            if line.trim() == word {
                break;
            }
        }
    }
    (command, k)
}

/// The terminator of a here-document the command opens (`<<'EOF'`,
/// `<<EOF`, `<<-EOF`).
fn heredoc(command: &str) -> Option<String> {
    let at = command.find("<<")?;
    let rest = command[at + 2..].trim_start_matches('-');
    let word: String = rest
        .trim_start()
        .trim_start_matches(['\'', '"'])
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    (!word.is_empty()).then_some(word)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_outputs_continuations_and_heredocs() {
        let page = "text\n<!-- doc-test: needs grpcurl -->\n```sh\n$ a \\\n  b\nout 1\n\nout 2\n\n$ cat > f <<'EOF'\n$ not a prompt\nEOF\n$ c\n```\n```yaml\n$ x\n```\n<!-- doc-test: skip: too slow -->\n```sh\n# comment\nrun one\nrun \\\n two\n```\n";
        let blocks = blocks(page).unwrap();
        assert_eq!(blocks.len(), 2);
        let b = &blocks[0];
        assert_eq!(b.needs.as_deref(), Some("grpcurl"));
        assert_eq!(b.steps.len(), 3);
        assert_eq!(b.steps[0].command, "a \\\n  b");
        assert_eq!(
            b.steps[0].expected.as_deref(),
            Some(&["out 1".to_owned(), String::new(), "out 2".to_owned()][..])
        );
        assert_eq!(b.steps[1].command, "cat > f <<'EOF'\n$ not a prompt\nEOF");
        assert_eq!(b.steps[2].expected.as_deref(), Some(&[][..]));
        let s = &blocks[1];
        assert_eq!(s.skip.as_deref(), Some("too slow"));
        assert_eq!(s.steps.len(), 2);
        assert_eq!(s.steps[1].command, "run \\\n two");
        assert!(s.steps[1].expected.is_none());
    }

    #[test]
    fn a_skip_without_a_reason_is_refused() {
        assert!(blocks("<!-- doc-test: skip: -->\n```sh\nx\n```\n").is_err());
        assert!(blocks("<!-- doc-test: maybe -->\n```sh\nx\n```\n").is_err());
    }
}
