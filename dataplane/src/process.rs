//! Running the kernel tools (nft, iptables-save, iptables-restore): one child process, its
//! input fed from a thread, its output collected.

use std::io::Write;
use std::process::{Command, Stdio};

/// What a finished command said.
#[derive(Debug, Clone)]
pub struct Output {
    pub success: bool,
    pub stdout: String,
    /// Trimmed.
    pub stderr: String,
}

/// Runs `program args`, feeding `stdin`. An error only when the program cannot be started
/// or waited for; a non-zero exit is an [`Output`] with `success` false.
pub fn run(program: &str, args: &[&str], stdin: Option<&str>) -> std::io::Result<Output> {
    run_with(program, args, stdin, Stdio::piped())
}

/// [`run`] for a command whose output is of no use: `stdout` comes back empty.
pub fn run_discarding_stdout(
    program: &str,
    args: &[&str],
    stdin: Option<&str>,
) -> std::io::Result<Output> {
    run_with(program, args, stdin, Stdio::null())
}

fn run_with(
    program: &str,
    args: &[&str],
    stdin: Option<&str>,
    stdout: Stdio,
) -> std::io::Result<Output> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()?;
    // Written from another thread: a command that reports on stdout or stderr while it
    // reads would otherwise block on a full pipe while we block on its stdin.
    let writer = match (stdin, child.stdin.take()) {
        (Some(text), Some(mut pipe)) => {
            let text = text.to_string();
            // A write error means the command exited early; its stderr says why.
            Some(std::thread::spawn(move || {
                let _ = pipe.write_all(text.as_bytes());
            }))
        }
        _ => None,
    };
    let out = child.wait_with_output()?;
    if let Some(w) = writer {
        let _ = w.join();
    }
    Ok(Output {
        success: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
    })
}
