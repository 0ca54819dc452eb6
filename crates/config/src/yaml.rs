//! YAML with positions: a small owned tree built from saphyr's marked
//! nodes, and a field reader that reports unknown fields with a
//! did-you-mean.
//!
//! Parsing is the first of two steps (ripgrep's "parse, then resolve"):
//! this module knows YAML and positions and nothing of limits; the format
//! modules turn the tree into the resolved config.

use saphyr::{LoadableYamlNode, MarkedYaml, Scalar, YamlData};
use saphyr_parser::Event;

use crate::diag::{Diagnostic, Pos};

/// A YAML node and where it starts.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// Where the node starts.
    pub pos: Pos,
    /// What it is.
    pub kind: Kind,
}

/// The shape of a node.
#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    /// `~`, `null` or nothing.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// A whole number.
    Int(i64),
    /// A number with a fraction.
    Float(f64),
    /// Any other scalar.
    Str(String),
    /// A list.
    Seq(Vec<Node>),
    /// A mapping, in document order.
    Map(Vec<(Node, Node)>),
}

/// The deepest nesting of lists and mappings a document may have. The
/// deepest real config nests about eight levels; the bound exists because
/// `saphyr`'s loader, the conversion below and dropping the trees all
/// recurse once per level, so a document nested 100,000 levels deep
/// (`- - - - …`, 200 KB) would overflow the stack and take the process
/// down instead of getting an error.
pub const MAX_DEPTH: usize = 64;

/// Parses `text` (named `file` in messages) into its documents.
pub fn parse(file: &str, text: &str) -> Result<Vec<Node>, Diagnostic> {
    check_depth(file, text)?;
    let docs = MarkedYaml::load_from_str(text).map_err(|e| invalid(file, &e))?;
    docs.iter().map(|d| convert(file, d)).collect()
}

fn invalid(file: &str, e: &saphyr::ScanError) -> Diagnostic {
    Diagnostic::new(&at(file, e.marker()), format!("invalid YAML: {}", e.info()))
}

fn at(file: &str, m: &saphyr::Marker) -> Pos {
    Pos {
        file: file.to_owned(),
        line: m.line(),
        col: m.col() + 1,
    }
}

/// Refuses a document nested deeper than [`MAX_DEPTH`], naming where it
/// goes too deep. Reads the parser's events one by one, which takes no
/// stack however deep the document goes, and stops at the first level
/// too many.
fn check_depth(file: &str, text: &str) -> Result<(), Diagnostic> {
    let too_deep = |m: &saphyr::Marker| {
        Diagnostic::new(
            &at(file, m),
            format!(
                "YAML nested more than {MAX_DEPTH} levels deep (lists and mappings inside each \
                 other); a config needs far fewer"
            ),
        )
    };
    let mut depth = 0usize;
    for event in saphyr_parser::Parser::new_from_str(text) {
        let (event, span) = event.map_err(|e| {
            // The scanner reads flow collections (`[[[…`) ahead of the
            // events, and stops by itself at 255 levels: the same problem.
            if e.info() == "recursion limit exceeded" {
                too_deep(e.marker())
            } else {
                invalid(file, &e)
            }
        })?;
        match event {
            Event::SequenceStart(..) | Event::MappingStart(..) => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(too_deep(&span.start));
                }
            }
            Event::SequenceEnd | Event::MappingEnd => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

fn convert(file: &str, y: &MarkedYaml<'_>) -> Result<Node, Diagnostic> {
    let pos = Pos {
        file: file.to_owned(),
        line: y.span.start.line(),
        col: y.span.start.col() + 1,
    };
    let kind = match &y.data {
        YamlData::Value(Scalar::Null) => Kind::Null,
        YamlData::Value(Scalar::Boolean(b)) => Kind::Bool(*b),
        YamlData::Value(Scalar::Integer(i)) => Kind::Int(*i),
        YamlData::Value(Scalar::FloatingPoint(f)) => Kind::Float(f.into_inner()),
        YamlData::Value(Scalar::String(s)) => Kind::Str(s.to_string()),
        YamlData::Representation(s, _, _) => Kind::Str(s.to_string()),
        YamlData::Sequence(items) => Kind::Seq(
            items
                .iter()
                .map(|i| convert(file, i))
                .collect::<Result<_, _>>()?,
        ),
        YamlData::Mapping(map) => Kind::Map(
            map.iter()
                .map(|(k, v)| Ok((convert(file, k)?, convert(file, v)?)))
                .collect::<Result<_, Diagnostic>>()?,
        ),
        YamlData::Tagged(_, inner) => {
            // saphyr gives the value inside a tag no span of its own (line
            // 0): it is where the tag is.
            let mut node = convert(file, inner)?;
            if node.pos.line == 0 {
                node.pos = pos;
            }
            return Ok(node);
        }
        YamlData::Alias(_) | YamlData::BadValue => {
            return Err(Diagnostic::new(
                &pos,
                "unsupported YAML value (aliases and bad values are not allowed)",
            ));
        }
    };
    Ok(Node { pos, kind })
}

impl Node {
    /// A word for the node's type, for messages.
    pub fn type_name(&self) -> &'static str {
        match self.kind {
            Kind::Null => "nothing",
            Kind::Bool(_) => "a boolean",
            Kind::Int(_) => "a number",
            Kind::Float(_) => "a fractional number",
            Kind::Str(_) => "a string",
            Kind::Seq(_) => "a list",
            Kind::Map(_) => "a mapping",
        }
    }

    fn expected(&self, what: &str, wanted: &str) -> Diagnostic {
        Diagnostic::new(
            &self.pos,
            format!("`{what}` must be {wanted}, found {}", self.type_name()),
        )
    }

    /// The node as a mapping.
    pub fn as_map(&self, what: &str) -> Result<Fields<'_>, Diagnostic> {
        match &self.kind {
            Kind::Map(entries) => Fields::new(self, entries),
            _ => Err(self.expected(what, "a mapping")),
        }
    }

    /// The node as a list; `null` is an empty list.
    pub fn as_seq(&self, what: &str) -> Result<&[Node], Diagnostic> {
        match &self.kind {
            Kind::Seq(items) => Ok(items),
            Kind::Null => Ok(&[]),
            _ => Err(self.expected(what, "a list")),
        }
    }

    /// The node as a string (plain scalars only).
    pub fn as_str(&self, what: &str) -> Result<&str, Diagnostic> {
        match &self.kind {
            Kind::Str(s) => Ok(s),
            _ => Err(self.expected(what, "a string")),
        }
    }

    /// A scalar's text, whatever its type: `123` reads as `"123"`.
    pub fn scalar_text(&self, what: &str) -> Result<String, Diagnostic> {
        match &self.kind {
            Kind::Str(s) => Ok(s.clone()),
            Kind::Int(i) => Ok(i.to_string()),
            Kind::Bool(b) => Ok(b.to_string()),
            Kind::Null => Ok(String::new()),
            _ => Err(self.expected(what, "a scalar")),
        }
    }

    /// The node as a whole number `>= 0`.
    pub fn as_u64(&self, what: &str) -> Result<u64, Diagnostic> {
        match &self.kind {
            Kind::Int(i) if *i >= 0 => Ok(*i as u64),
            Kind::Int(i) => Err(Diagnostic::new(
                &self.pos,
                format!("`{what}` must not be negative, found {i}"),
            )),
            Kind::Str(s) if s.parse::<u64>().is_ok() => s
                .parse::<u64>()
                .map_err(|_| self.expected(what, "a whole number")),
            Kind::Float(f) => Err(Diagnostic::new(
                &self.pos,
                format!("`{what}` must be a whole number, found {f}"),
            )),
            _ => Err(self.expected(what, "a whole number")),
        }
    }

    /// The node as a number.
    pub fn as_f64(&self, what: &str) -> Result<f64, Diagnostic> {
        match &self.kind {
            Kind::Int(i) => Ok(*i as f64),
            Kind::Float(f) => Ok(*f),
            _ => Err(self.expected(what, "a number")),
        }
    }

    /// The node as a boolean.
    pub fn as_bool(&self, what: &str) -> Result<bool, Diagnostic> {
        match &self.kind {
            Kind::Bool(b) => Ok(*b),
            _ => Err(self.expected(what, "`true` or `false`")),
        }
    }
}

/// The fields of a mapping, by name, with positions.
#[derive(Clone, Debug)]
pub struct Fields<'a> {
    /// The mapping itself (for its position).
    pub node: &'a Node,
    entries: Vec<(&'a str, &'a Node, &'a Node)>,
}

impl<'a> Fields<'a> {
    fn new(node: &'a Node, entries: &'a [(Node, Node)]) -> Result<Fields<'a>, Diagnostic> {
        let mut out = Vec::with_capacity(entries.len());
        for (k, v) in entries {
            match &k.kind {
                Kind::Str(name) => out.push((name.as_str(), k, v)),
                _ => {
                    return Err(Diagnostic::new(
                        &k.pos,
                        format!("keys must be names, found {}", k.type_name()),
                    ))
                }
            }
        }
        Ok(Fields { node, entries: out })
    }

    /// The value of field `name`, if present.
    pub fn get(&self, name: &str) -> Option<&'a Node> {
        self.entries
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|(_, _, v)| *v)
    }

    /// The position of field `name`'s key, or the mapping's.
    pub fn pos_of(&self, name: &str) -> &'a Pos {
        self.entries
            .iter()
            .find(|(n, _, _)| *n == name)
            .map_or(&self.node.pos, |(_, k, _)| &k.pos)
    }

    /// Whether field `name` is present.
    pub fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// The value of required field `name`.
    pub fn require(&self, name: &str, context: &str) -> Result<&'a Node, Diagnostic> {
        self.get(name).ok_or_else(|| {
            Diagnostic::new(
                &self.node.pos,
                format!("{context} is missing required field `{name}`"),
            )
        })
    }

    /// The field names, in document order.
    pub fn names(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.entries.iter().map(|(n, _, _)| *n)
    }

    /// Every `(name, key, value)`, in document order.
    pub fn iter(&self) -> impl Iterator<Item = (&'a str, &'a Node, &'a Node)> + '_ {
        self.entries.iter().copied()
    }

    /// These fields with `over`'s replacing same-named ones and added
    /// after them: how a domain override refines a resource.
    pub fn overlay(&self, over: &Fields<'a>) -> Fields<'a> {
        let mut entries: Vec<_> = self
            .entries
            .iter()
            .filter(|(n, _, _)| !over.has(n))
            .copied()
            .collect();
        entries.extend(over.entries.iter().copied());
        Fields {
            node: over.node,
            entries,
        }
    }

    /// These fields without the named ones.
    pub fn without(&self, names: &[&str]) -> Fields<'a> {
        Fields {
            node: self.node,
            entries: self
                .entries
                .iter()
                .filter(|(n, _, _)| !names.contains(n))
                .copied()
                .collect(),
        }
    }

    /// One error per field not in `known`, with a did-you-mean.
    pub fn unknown(&self, known: &[&str], context: &str) -> Vec<Diagnostic> {
        self.entries
            .iter()
            .filter(|(n, _, _)| !known.contains(n))
            .map(|(n, k, _)| {
                let hint = did_you_mean(n, known)
                    .map(|s| format!(", did you mean `{s}`?"))
                    .unwrap_or_else(|| format!(" (expected one of: {})", known.join(", ")));
                Diagnostic::new(&k.pos, format!("unknown field `{n}` in {context}{hint}"))
            })
            .collect()
    }
}

/// The closest of `candidates` to `word`, if one is close.
pub fn did_you_mean<'c>(word: &str, candidates: &[&'c str]) -> Option<&'c str> {
    candidates
        .iter()
        .map(|c| (strsim::jaro_winkler(word, c), *c))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_one_based() {
        let docs = parse("f.yaml", "a: 1\nb:\n  c: x\n").unwrap();
        let root = docs[0].as_map("root").unwrap();
        let b = root.get("b").unwrap().as_map("b").unwrap();
        assert_eq!(b.pos_of("c").line, 3);
        assert_eq!(b.pos_of("c").col, 3);
    }

    #[test]
    fn syntax_errors_have_positions() {
        let e = parse("f.yaml", "a: b: c\n").unwrap_err();
        assert_eq!((e.pos.line, e.pos.col), (1, 5));
        assert!(e.message.starts_with("invalid YAML"));
    }

    #[test]
    fn duplicate_keys_are_errors() {
        let e = parse("f.yaml", "a: 1\na: 2\n").unwrap_err();
        assert_eq!(e.pos.line, 2);
    }

    #[test]
    fn unknown_fields_suggest_the_closest() {
        let docs = parse("f.yaml", "capcity: 1\n").unwrap();
        let f = docs[0].as_map("r").unwrap();
        let errs = f.unknown(&["capacity", "rate"], "resource `api`");
        assert_eq!(
            errs[0].to_string(),
            "f.yaml:1:1: unknown field `capcity` in resource `api`, did you mean `capacity`?"
        );
    }
}
