//! `tollgate check-config`: validate, show warnings and the normalized
//! config.

use std::path::PathBuf;

/// Arguments of `tollgate check-config`.
#[derive(clap::Args, Debug)]
pub struct CheckConfigArgs {
    /// The config: a file, or a directory of *.yaml files.
    pub config: PathBuf,
    /// Print only errors and warnings, not the normalized config.
    #[arg(long, short)]
    pub quiet: bool,
}

/// Validates; prints warnings on stderr and the normalized config on
/// stdout. Returns whether the config is valid.
pub fn run(args: &CheckConfigArgs) -> bool {
    match tollgate_config::load_path(&args.config) {
        Ok(loaded) => {
            for w in &loaded.warnings {
                eprintln!("warning: {w}");
            }
            if !args.quiet {
                print!("{}", tollgate_config::emit::to_yaml(&loaded.config));
            }
            true
        }
        Err(e) => {
            eprintln!("{e}");
            false
        }
    }
}
