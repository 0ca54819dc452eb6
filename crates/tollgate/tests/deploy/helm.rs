//! A renderer for the subset of Helm's templates that deploy/helm/tollgate
//! uses, so the chart is tested without a helm binary. Anything outside
//! the subset is an error, never silently rendered, so a template that
//! grows a construct this does not know fails the test instead of
//! passing it unchecked.
//!
//! The subset (Go template semantics, Helm's functions):
//! - `{{ .Values.a.b }}`, `{{ .Release.Name }}`, optionally piped to
//!   one of `nindent N`, `indent N` or `quote` (Go's `%q`: a YAML
//!   double-quoted scalar);
//! - `{{ if COND }}` ... `{{ else }}` ... `{{ end }}`, COND being `PATH`
//!   (truthy), `not PATH`, `eq PATH "text"` or `ne PATH "text"`;
//! - `{{ define "name" }}` ... `{{ end }}` (in `_*.tpl` files) and
//!   `{{ include "name" . }}`, optionally piped like a value;
//! - `{{ fail "message" }}`, which stops the render with the message (a
//!   literal message only);
//! - `{{/* comments */}}`;
//! - `{{-` and `-}}`, which trim the white space before or after.

use std::collections::BTreeMap;

use serde_json::Value;

/// A parsed template.
#[derive(Debug, Clone)]
enum Node {
    Text(String),
    Value(Vec<String>, Option<Pipe>),
    Include(String, Option<Pipe>),
    If(Cond, Vec<Node>, Vec<Node>),
    Fail(String),
}

#[derive(Debug, Clone)]
enum Pipe {
    Indent(usize),
    Nindent(usize),
    Quote,
}

#[derive(Debug, Clone)]
enum Cond {
    Truthy(Vec<String>),
    Not(Vec<String>),
    Eq(Vec<String>, String),
    Ne(Vec<String>, String),
}

/// One `{{ ... }}` action, with its trim markers.
#[derive(Debug)]
enum Token {
    Text(String),
    Action(String),
}

/// Splits `text` into text and actions, applying `{{-` and `-}}`.
fn tokens(text: &str) -> Result<Vec<Token>, String> {
    let mut out = Vec::new();
    let mut rest = text;
    let mut trim_next = false;
    while let Some(start) = rest.find("{{") {
        let mut before = &rest[..start];
        if trim_next {
            before = before.trim_start();
        }
        let after = &rest[start + 2..];
        let end = after
            .find("}}")
            .ok_or_else(|| format!("an action without `}}}}`: {:?}", &rest[start..]))?;
        let mut inner = &after[..end];
        if let Some(i) = inner.strip_prefix('-') {
            if !i.starts_with([' ', '\n', '\t']) {
                return Err(format!("`{{{{-` needs a space after it: {{{{{inner}}}}}"));
            }
            before = before.trim_end();
            inner = i;
        }
        trim_next = false;
        if let Some(i) = inner.strip_suffix('-') {
            if !i.ends_with([' ', '\n', '\t']) {
                return Err(format!("`-}}}}` needs a space before it: {{{{{inner}}}}}"));
            }
            trim_next = true;
            inner = i;
        }
        out.push(Token::Text(before.to_owned()));
        out.push(Token::Action(inner.trim().to_owned()));
        rest = &after[end + 2..];
    }
    let last = if trim_next { rest.trim_start() } else { rest };
    if last.contains("}}") {
        return Err(format!("a `}}}}` without `{{{{`: {last:?}"));
    }
    out.push(Token::Text(last.to_owned()));
    Ok(out)
}

/// A path such as `.Values.a.b` as its parts.
fn path(word: &str) -> Result<Vec<String>, String> {
    let Some(rest) = word.strip_prefix('.') else {
        return Err(format!("not a value path: {word:?}"));
    };
    let parts: Vec<String> = rest.split('.').map(str::to_owned).collect();
    let root_ok = matches!(
        parts.first().map(String::as_str),
        Some("Values" | "Release")
    );
    if !root_ok || parts.iter().any(|p| p.is_empty()) {
        return Err(format!(
            "unsupported value path {word:?} (only .Values.* and .Release.*)"
        ));
    }
    Ok(parts)
}

/// A double-quoted string literal, without escapes.
fn literal(word: &str) -> Result<String, String> {
    word.strip_prefix('"')
        .and_then(|w| w.strip_suffix('"'))
        .filter(|w| !w.contains(['"', '\\']))
        .map(str::to_owned)
        .ok_or_else(|| format!("not a plain string literal: {word}"))
}

fn pipe(text: Option<&str>) -> Result<Option<Pipe>, String> {
    let Some(text) = text else { return Ok(None) };
    let words: Vec<&str> = text.split_whitespace().collect();
    let n = |w: &str| w.parse::<usize>().map_err(|_| format!("not a number: {w}"));
    match words.as_slice() {
        ["nindent", w] => Ok(Some(Pipe::Nindent(n(w)?))),
        ["indent", w] => Ok(Some(Pipe::Indent(n(w)?))),
        ["quote"] => Ok(Some(Pipe::Quote)),
        _ => Err(format!("unsupported pipeline `| {text}`")),
    }
}

/// What one action is.
enum Action {
    Emit(Node),
    If(Cond),
    Else,
    End,
    Define(String),
    Comment,
}

fn action(text: &str) -> Result<Action, String> {
    if text.starts_with("/*") {
        return if text.ends_with("*/") {
            Ok(Action::Comment)
        } else {
            Err(format!("an unterminated comment: {text}"))
        };
    }
    let (head, piped) = match text.split_once('|') {
        Some((h, p)) => (h.trim(), Some(p.trim())),
        None => (text, None),
    };
    let words: Vec<&str> = head.split_whitespace().collect();
    let no_pipe = |a: Action| {
        if piped.is_some() {
            Err(format!("a pipeline is not allowed here: {text}"))
        } else {
            Ok(a)
        }
    };
    if let Some(message) = head.strip_prefix("fail ") {
        return no_pipe(Action::Emit(Node::Fail(literal(message.trim())?)));
    }
    match words.as_slice() {
        ["else"] => no_pipe(Action::Else),
        ["end"] => no_pipe(Action::End),
        ["define", name] => no_pipe(Action::Define(literal(name)?)),
        ["if", "eq", p, lit] => no_pipe(Action::If(Cond::Eq(path(p)?, literal(lit)?))),
        ["if", "ne", p, lit] => no_pipe(Action::If(Cond::Ne(path(p)?, literal(lit)?))),
        ["if", "not", p] => no_pipe(Action::If(Cond::Not(path(p)?))),
        ["if", p] => no_pipe(Action::If(Cond::Truthy(path(p)?))),
        ["include", name, "."] => Ok(Action::Emit(Node::Include(literal(name)?, pipe(piped)?))),
        [p] if p.starts_with('.') => Ok(Action::Emit(Node::Value(path(p)?, pipe(piped)?))),
        _ => Err(format!("unsupported template action {{{{ {text} }}}}")),
    }
}

/// What a parsed list of nodes ended with.
enum Stop {
    Eof,
    Else,
    End,
}

/// Parses tokens into nodes until the end, or an `else`/`end` of an
/// enclosing block; `defines` collects `define` blocks.
fn parse(
    tokens: &mut std::iter::Peekable<std::vec::IntoIter<Token>>,
    defines: &mut BTreeMap<String, Vec<Node>>,
) -> Result<(Vec<Node>, Stop), String> {
    let mut nodes = Vec::new();
    while let Some(t) = tokens.next() {
        match t {
            Token::Text(s) => nodes.push(Node::Text(s)),
            Token::Action(a) => match action(&a)? {
                Action::Emit(n) => nodes.push(n),
                Action::Comment => {}
                Action::Else => return Ok((nodes, Stop::Else)),
                Action::End => return Ok((nodes, Stop::End)),
                Action::If(cond) => {
                    let (then, stop) = parse(tokens, defines)?;
                    let otherwise = match stop {
                        Stop::End => Vec::new(),
                        Stop::Else => match parse(tokens, defines)? {
                            (o, Stop::End) => o,
                            _ => return Err("an `else` without its `end`".into()),
                        },
                        Stop::Eof => return Err("an `if` without its `end`".into()),
                    };
                    nodes.push(Node::If(cond, then, otherwise));
                }
                Action::Define(name) => match parse(tokens, defines)? {
                    (body, Stop::End) => {
                        if defines.insert(name.clone(), body).is_some() {
                            return Err(format!("`{name}` is defined twice"));
                        }
                    }
                    _ => return Err(format!("define `{name}` without its `end`")),
                },
            },
        }
    }
    Ok((nodes, Stop::Eof))
}

fn parse_all(text: &str, defines: &mut BTreeMap<String, Vec<Node>>) -> Result<Vec<Node>, String> {
    let mut tokens = tokens(text)?.into_iter().peekable();
    match parse(&mut tokens, defines)? {
        (nodes, Stop::Eof) => Ok(nodes),
        (_, Stop::Else) => Err("an `else` outside an `if`".into()),
        (_, Stop::End) => Err("an `end` outside a block".into()),
    }
}

/// A chart's templates, parsed.
pub struct Chart {
    /// Template files by name, `_*.tpl` files excluded.
    templates: BTreeMap<String, Vec<Node>>,
    defines: BTreeMap<String, Vec<Node>>,
}

impl Chart {
    /// Parses `files` (name, text) of a chart's `templates/`.
    pub fn parse(files: &[(String, String)]) -> Result<Chart, String> {
        let mut defines = BTreeMap::new();
        let mut templates = BTreeMap::new();
        for (name, text) in files {
            let nodes = parse_all(text, &mut defines).map_err(|e| format!("{name}: {e}"))?;
            if name.starts_with('_') {
                // Helpers only define; what they would print is dropped by
                // Helm, so anything but white space there is a mistake.
                for n in &nodes {
                    match n {
                        Node::Text(t) if t.trim().is_empty() => {}
                        other => return Err(format!("{name}: output outside a define: {other:?}")),
                    }
                }
            } else {
                templates.insert(name.clone(), nodes);
            }
        }
        Ok(Chart { templates, defines })
    }

    /// Renders every template with `values` and the release's `name`:
    /// (template name, text).
    pub fn render(&self, values: &Value, release: &str) -> Result<Vec<(String, String)>, String> {
        let context = serde_json::json!({ "Values": values, "Release": { "Name": release } });
        self.templates
            .iter()
            .map(|(name, nodes)| {
                let mut out = String::new();
                self.emit(nodes, &context, &mut out, 0)
                    .map_err(|e| format!("{name}: {e}"))?;
                Ok((name.clone(), out))
            })
            .collect()
    }

    fn emit(
        &self,
        nodes: &[Node],
        ctx: &Value,
        out: &mut String,
        depth: usize,
    ) -> Result<(), String> {
        if depth > 16 {
            return Err("includes nested too deep".into());
        }
        for n in nodes {
            match n {
                Node::Text(t) => out.push_str(t),
                Node::Value(p, pipe) => out.push_str(&piped(scalar(lookup(ctx, p)?, p)?, pipe)),
                Node::Include(name, pipe) => {
                    let body = self
                        .defines
                        .get(name)
                        .ok_or_else(|| format!("include of an undefined `{name}`"))?;
                    let mut inner = String::new();
                    self.emit(body, ctx, &mut inner, depth + 1)?;
                    out.push_str(&piped(inner, pipe));
                }
                Node::If(cond, then, otherwise) => {
                    let yes = match cond {
                        Cond::Truthy(p) => truthy(lookup(ctx, p)?),
                        Cond::Not(p) => !truthy(lookup(ctx, p)?),
                        Cond::Eq(p, lit) => scalar(lookup(ctx, p)?, p)? == *lit,
                        Cond::Ne(p, lit) => scalar(lookup(ctx, p)?, p)? != *lit,
                    };
                    self.emit(if yes { then } else { otherwise }, ctx, out, depth)?;
                }
                // Helm stops the whole render ("execution error at ...").
                Node::Fail(message) => return Err(message.clone()),
            }
        }
        Ok(())
    }
}

/// The value at `path`; a path that names nothing is an error (Helm would
/// print `<no value>` or nothing, which hides a typo).
fn lookup<'a>(ctx: &'a Value, path: &[String]) -> Result<&'a Value, String> {
    let mut v = ctx;
    for p in path {
        v = v
            .get(p)
            .ok_or_else(|| format!("no value .{}", path.join(".")))?;
    }
    Ok(v)
}

fn scalar(v: &Value, path: &[String]) -> Result<String, String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        _ => Err(format!(".{} is not a scalar: {v}", path.join("."))),
    }
}

fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// Helm's `indent` (every line, the first included, gets N spaces),
/// `nindent` (a newline, then `indent`) and `quote` (Go's `%q`).
fn piped(text: String, pipe: &Option<Pipe>) -> String {
    let indent = |n: usize| {
        let pad = " ".repeat(n);
        format!("{pad}{}", text.replace('\n', &format!("\n{pad}")))
    };
    match pipe {
        None => text.clone(),
        Some(Pipe::Indent(n)) => indent(*n),
        Some(Pipe::Nindent(n)) => format!("\n{}", indent(*n)),
        Some(Pipe::Quote) => quoted(&text),
    }
}

/// `text` as Go's `%q` writes it, which Helm's `quote` uses: in double
/// quotes, with `"` and `\` escaped and control characters written as
/// escapes; every one of them is also a YAML double-quoted escape.
fn quoted(text: &str) -> String {
    let mut out = String::from('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{b}' => out.push_str("\\v"),
            '\u{c}' => out.push_str("\\f"),
            c if c.is_control() && u32::from(c) < 0x80 => {
                out.push_str(&format!("\\x{:02x}", u32::from(c)));
            }
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(template: &str, values: Value) -> Result<String, String> {
        let chart = Chart::parse(&[
            (
                "_h.tpl".into(),
                "{{- define \"l\" -}}\na: {{ .Release.Name }}\n{{- end }}\n".into(),
            ),
            ("t.yaml".into(), template.into()),
        ])?;
        Ok(chart.render(&values, "rel")?.remove(0).1)
    }

    #[test]
    fn values_conditions_includes_and_trimming_render_as_helm_does() {
        let v = serde_json::json!({"mode": "x", "n": 3, "s": "", "c": "p: 1\nq: 2\n"});
        assert_eq!(render("n: {{ .Values.n }}", v.clone()).unwrap(), "n: 3");
        assert_eq!(
            render(
                "a:\n{{- if eq .Values.mode \"x\" }}\n  b: 1\n{{- else }}\n  b: 2\n{{- end }}\n",
                v.clone()
            )
            .unwrap(),
            "a:\n  b: 1\n"
        );
        assert_eq!(
            render("{{- if .Values.s }}yes{{- else }}no{{- end }}", v.clone()).unwrap(),
            "no"
        );
        assert_eq!(
            render("{{- if not .Values.s }}yes{{- end }}", v.clone()).unwrap(),
            "yes"
        );
        assert_eq!(
            render("m:\n  {{- include \"l\" . | nindent 2 }}", v.clone()).unwrap(),
            "m:\n  a: rel"
        );
        assert_eq!(
            render("d: |\n  {{- .Values.c | nindent 2 }}", v).unwrap(),
            "d: |\n  p: 1\n  q: 2\n  "
        );
    }

    #[test]
    fn quote_writes_a_yaml_double_quoted_scalar_as_go_does() {
        let v = serde_json::json!({
            "url": "rediss://:p#ss@redis.example:6380/1",
            "odd": "say \"yes\"\\no\n\u{1}",
            "n": 5,
        });
        assert_eq!(
            render("- {{ .Values.url | quote }}", v.clone()).unwrap(),
            "- \"rediss://:p#ss@redis.example:6380/1\""
        );
        assert_eq!(
            render("{{ .Values.odd | quote }}", v.clone()).unwrap(),
            r#""say \"yes\"\\no\n\x01""#
        );
        assert_eq!(render("{{ .Values.n | quote }}", v).unwrap(), "\"5\"");
    }

    #[test]
    fn fail_stops_the_render_only_where_it_is_reached() {
        let v = serde_json::json!({"mode": "x"});
        let guard = "{{- if ne .Values.mode \"x\" }}{{ fail \"mode must be x\" }}{{- end }}ok";
        assert_eq!(render(guard, v).unwrap(), "ok");
        let e = render(guard, serde_json::json!({"mode": "y"})).unwrap_err();
        assert!(e.contains("mode must be x"), "{e}");
    }

    #[test]
    fn anything_outside_the_subset_is_refused() {
        let v = serde_json::json!({"x": [1], "y": "a"});
        for bad in [
            "{{ .Values.y | squote }}",
            "{{ .Values.y | quote | nindent 2 }}",
            "{{ .Values.y | quote 2 }}",
            "{{ fail .Values.y }}",
            "{{ fail \"a\" \"b\" }}",
            "{{ fail \"x\" | quote }}",
            "{{ fail }}",
            "{{ range .Values.x }}{{ end }}",
            "{{ toYaml .Values.x }}",
            "{{ .Values.x }}",
            "{{ .Values.missing }}",
            "{{ .Chart.Name }}",
            "{{ if and .Values.y .Values.y }}{{ end }}",
            "{{ if .Values.y }}",
            "{{ end }}",
            "{{ include \"nope\" . }}",
            "{{ .Values.y",
            "{{-.Values.y }}",
            "{{ with .Values.y }}{{ end }}",
            "{{ $x := 1 }}",
        ] {
            assert!(render(bad, v.clone()).is_err(), "accepted: {bad}");
        }
    }
}
