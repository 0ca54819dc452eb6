//! `tollgate completions SHELL` and `tollgate man`: shell completion
//! scripts and a roff man page, generated from the same clap definition
//! that parses the command line, so they cannot fall out of date.

use std::io::Write;

use anyhow::{Context, Result};
use clap::Args;

/// Arguments of `tollgate completions`.
#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Arguments of `tollgate man`.
#[derive(Args, Debug)]
pub struct ManArgs {
    /// A subcommand's page (`tollgate-serve(1)`) instead of tollgate(1).
    pub subcommand: Option<String>,
}

/// Prints the completion script for `args.shell` of `cli`.
pub fn completions(args: &CompletionsArgs, mut cli: clap::Command) -> Result<()> {
    let mut out = Vec::new();
    clap_complete::generate(args.shell, &mut cli, "tollgate", &mut out);
    std::io::stdout()
        .write_all(&out)
        .context("cannot write the completion script")
}

/// Prints the man page of `cli`, or of one of its subcommands.
pub fn man(args: &ManArgs, cli: clap::Command) -> Result<()> {
    let cli = cli.version(crate::VERSION);
    let page = match &args.subcommand {
        None => cli,
        Some(name) => {
            let names: Vec<String> = cli
                .get_subcommands()
                .map(|c| c.get_name().to_owned())
                .collect();
            let Some(sub) = cli.find_subcommand(name) else {
                anyhow::bail!("no subcommand `{name}`; one of: {}", names.join(", "));
            };
            // `tollgate-serve` is how man pages of subcommands are named
            // (git-commit(1)).
            sub.clone()
                .display_name(format!("tollgate-{name}"))
                .bin_name(format!("tollgate {name}"))
                .version(crate::VERSION)
        }
    };
    let mut out = Vec::new();
    clap_mangen::Man::new(page)
        .render(&mut out)
        .context("cannot render the man page")?;
    std::io::stdout()
        .write_all(&out)
        .context("cannot write the man page")
}
