//! One bash process per page, so variables set in one block are there in
//! the next, as in a reader's terminal; long-running programs in the
//! background of it; everything killed when the page is done.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

/// What bash prints after each command, with its exit status or the pid
/// of what it started in the background.
const MARK: &str = "__DOCTEST_MARK__";

/// A bash process in its own process group, reading commands from a pipe.
pub struct Session {
    child: Child,
    stdin: ChildStdin,
    marks: Receiver<String>,
    work: PathBuf,
    started: usize,
}

/// A program started in the background.
pub struct Background {
    /// The pid bash reported for it.
    pub pid: u32,
    /// Where its standard output and error go.
    pub log: PathBuf,
}

/// How a background program's start went.
pub enum Start {
    /// It logged that it listens.
    Ready(String),
    /// It exited first, having printed this.
    Exited(String),
}

impl Session {
    /// Starts bash in `dir` with `env` added to a copy of the test's
    /// environment from which every `TOLLGATE_*` and `OTEL_*` variable is
    /// removed (the page must say what it sets).
    pub fn start(dir: &Path, env: &[(String, String)]) -> Session {
        let work = dir.join(".doctest");
        std::fs::create_dir_all(&work).unwrap();
        let mut cmd = Command::new("bash");
        cmd.args(["--noprofile", "--norc"])
            .current_dir(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .process_group(0);
        crate::common::without_callers_settings(&mut cmd);
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        let mut child = cmd.spawn().expect("bash runs");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, marks) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix(MARK) {
                    let _ = tx.send(rest.trim().to_owned());
                }
            }
        });
        Session {
            child,
            stdin,
            marks,
            work,
            started: 0,
        }
    }

    /// Runs `command` to its end (at most `limit`); its exit status (`None`
    /// when it had to be killed) and its output, both streams together.
    pub fn run(&mut self, command: &str, limit: Duration) -> Result<(Option<i32>, String), String> {
        let out = self.work.join("out");
        let script = format!(
            "{{\n{command}\n}} > {} 2>&1 < /dev/null\necho \"{MARK} $?\"\n",
            out.display()
        );
        self.send(&script)?;
        let code = match self.marks.recv_timeout(limit) {
            Ok(code) => code.parse().ok(),
            Err(_) => {
                let printed = std::fs::read_to_string(&out).unwrap_or_default();
                return Err(format!(
                    "still running after {limit:?} (or bash is waiting for the rest of it); it printed:\n{printed}"
                ));
            }
        };
        let printed = std::fs::read(&out).unwrap_or_default();
        Ok((code, String::from_utf8_lossy(&printed).into_owned()))
    }

    /// Starts `command` in the background.
    pub fn spawn(&mut self, command: &str) -> Result<Background, String> {
        self.started += 1;
        let log = self.work.join(format!("background-{}.log", self.started));
        let script = format!(
            "{{\n{command}\n}} > {} 2>&1 < /dev/null &\necho \"{MARK} $!\"\n",
            log.display()
        );
        self.send(&script)?;
        let pid = self
            .marks
            .recv_timeout(Duration::from_secs(30))
            .map_err(|_| "bash did not start it".to_owned())?
            .parse()
            .map_err(|e| format!("bash reported no pid: {e}"))?;
        Ok(Background { pid, log })
    }

    /// Waits (at most a minute) until `bg` logs a line with "listening" in
    /// it, or exits.
    pub fn ready(&self, bg: &Background) -> Start {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let log = std::fs::read_to_string(&bg.log).unwrap_or_default();
            if log.contains("listening") {
                return Start::Ready(log);
            }
            if !alive(bg.pid) {
                // What it printed after the check above, too.
                return Start::Exited(std::fs::read_to_string(&bg.log).unwrap_or_default());
            }
            if Instant::now() >= deadline {
                return Start::Exited(format!("{log}\n(no \"listening\" line within a minute)"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops background programs: SIGTERM to each and what it started,
    /// then waits for them to go.
    pub fn stop(&mut self, started: &[Background]) {
        for bg in started {
            for pid in children(bg.pid).into_iter().chain([bg.pid]) {
                signal(&pid.to_string(), "TERM");
            }
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while started.iter().any(|bg| alive(bg.pid)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn send(&mut self, script: &str) -> Result<(), String> {
        self.stdin
            .write_all(script.as_bytes())
            .and_then(|()| self.stdin.flush())
            .map_err(|e| format!("bash has gone: {e}"))
    }
}

impl Drop for Session {
    /// Kills bash and everything the page started (one process group).
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        signal(&group, "TERM");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        signal(&group, "KILL");
        let _ = self.child.wait();
    }
}

/// Sends SIG`name` to `pid` (a process group when it starts with `-`).
fn signal(pid: &str, name: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{name}"), "--", pid])
        .stderr(Stdio::null())
        .status();
}

/// The processes whose parent is `pid` (a background block's subshell
/// runs the program as its child unless bash replaced itself with it).
fn children(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|stat| {
                stat.rsplit_once(") ")
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                    == Some(pid)
            })
        })
        .collect()
}

/// Whether `pid` is a live process (not gone, not a zombie).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesized command name.
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}
