//! The per-resource, per-domain tallies `tollgate replay` prints at the end.

use std::collections::BTreeMap;
use std::io::{self, Write};

use serde::Serialize;

/// Counts for one (namespace, resource, domain).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Tally {
    /// Requests seen.
    pub requests: u64,
    /// Hits asked for.
    pub hits: u64,
    /// Hits granted.
    pub granted: u64,
    /// Requests rejected.
    pub rejected: u64,
    /// Requests that were errors (unknown resource, ...).
    pub errors: u64,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        self.requests = self.requests.saturating_add(other.requests);
        self.hits = self.hits.saturating_add(other.hits);
        self.granted = self.granted.saturating_add(other.granted);
        self.rejected = self.rejected.saturating_add(other.rejected);
        self.errors = self.errors.saturating_add(other.errors);
    }
}

/// All tallies, ordered by namespace, resource, domain.
#[derive(Debug, Default)]
pub struct Summary {
    rows: BTreeMap<(String, String, String), Tally>,
    /// Trace lines that could not be parsed.
    pub malformed: u64,
}

/// How many domains per resource the table shows; the JSON has them all.
const TABLE_DOMAINS: usize = 50;

impl Summary {
    /// Records one request's result.
    pub fn record(
        &mut self,
        ns: &str,
        resource: &str,
        domain: &str,
        hits: u64,
        granted: u64,
        allowed: bool,
    ) {
        // A trace may ask for any number of hits: the tallies saturate
        // rather than overflow.
        let t = self.entry(ns, resource, domain);
        t.add(&Tally {
            requests: 1,
            hits,
            granted,
            rejected: u64::from(!allowed),
            errors: 0,
        });
    }

    /// Records a request that failed.
    pub fn record_error(&mut self, ns: &str, resource: &str, domain: &str, hits: u64) {
        let t = self.entry(ns, resource, domain);
        t.add(&Tally {
            requests: 1,
            hits,
            granted: 0,
            rejected: 0,
            errors: 1,
        });
    }

    fn entry(&mut self, ns: &str, resource: &str, domain: &str) -> &mut Tally {
        self.rows
            .entry((ns.to_owned(), resource.to_owned(), domain.to_owned()))
            .or_default()
    }

    /// Totals per (namespace, resource).
    pub fn per_resource(&self) -> BTreeMap<(String, String), (Tally, usize)> {
        let mut out: BTreeMap<(String, String), (Tally, usize)> = BTreeMap::new();
        for ((ns, r, _), t) in &self.rows {
            let e = out.entry((ns.clone(), r.clone())).or_default();
            e.0.add(t);
            e.1 += 1;
        }
        out
    }

    /// Writes a table: per resource a total row (`*`), then its busiest
    /// domains.
    pub fn write_table(&self, mut out: impl Write) -> io::Result<()> {
        let mut lines = vec![[
            "namespace".to_string(),
            "resource".into(),
            "domain".into(),
            "requests".into(),
            "hits".into(),
            "granted".into(),
            "rejected".into(),
            "errors".into(),
        ]];
        let row = |ns: &str, r: &str, d: &str, t: &Tally| {
            [
                ns.to_string(),
                r.to_string(),
                d.to_string(),
                t.requests.to_string(),
                t.hits.to_string(),
                t.granted.to_string(),
                t.rejected.to_string(),
                t.errors.to_string(),
            ]
        };
        let mut notes = Vec::new();
        for ((ns, r), (total, domains)) in self.per_resource() {
            lines.push(row(&ns, &r, "*", &total));
            let mut rows: Vec<_> = self
                .rows
                .iter()
                .filter(|((n, res, _), _)| *n == ns && *res == r)
                .collect();
            rows.sort_by(|a, b| b.1.requests.cmp(&a.1.requests).then(a.0.cmp(b.0)));
            for ((_, _, d), t) in rows.iter().take(TABLE_DOMAINS) {
                lines.push(row(&ns, &r, d, t));
            }
            if domains > TABLE_DOMAINS {
                notes.push(format!(
                    "{ns}/{r}: {} more domains not shown (use --summary json)",
                    domains - TABLE_DOMAINS
                ));
            }
        }
        let widths: Vec<usize> = (0..8)
            .map(|c| {
                lines
                    .iter()
                    .map(|l| l[c].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for l in &lines {
            let mut s = String::new();
            for (c, cell) in l.iter().enumerate() {
                if c > 0 {
                    s.push_str("  ");
                }
                if c >= 3 {
                    s.push_str(&format!("{cell:>w$}", w = widths[c]));
                } else {
                    s.push_str(&format!("{cell:<w$}", w = widths[c]));
                }
            }
            writeln!(out, "{}", s.trim_end())?;
        }
        for n in notes {
            writeln!(out, "{n}")?;
        }
        if self.malformed > 0 {
            writeln!(out, "{} malformed trace lines skipped", self.malformed)?;
        }
        Ok(())
    }

    /// Writes everything as one JSON document.
    pub fn write_json(&self, mut out: impl Write) -> io::Result<()> {
        #[derive(Serialize)]
        struct Row<'a> {
            namespace: &'a str,
            resource: &'a str,
            domain: &'a str,
            #[serde(flatten)]
            tally: &'a Tally,
        }
        #[derive(Serialize)]
        struct Doc<'a> {
            rows: Vec<Row<'a>>,
            malformed: u64,
        }
        let doc = Doc {
            rows: self
                .rows
                .iter()
                .map(|((ns, r, d), t)| Row {
                    namespace: ns,
                    resource: r,
                    domain: d,
                    tally: t,
                })
                .collect(),
            malformed: self.malformed,
        };
        serde_json::to_writer_pretty(&mut out, &doc)?;
        writeln!(out)
    }
}
