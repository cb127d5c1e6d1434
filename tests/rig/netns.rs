//! Bounded external commands, named network namespaces and running code inside one.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::sched::CloneFlags;

/// Default bound on helper commands (`ip`, `nft`, `sysctl`).
pub const CMD_TIMEOUT: Duration = Duration::from_secs(15);

/// The result of a finished (or killed) command.
#[derive(Debug, Clone)]
pub struct CmdOutput {
    pub command: String,
    /// Exit code; `None` when killed by a signal or by the timeout.
    pub code: Option<i32>,
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
}

impl CmdOutput {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// A human-readable transcript for panic messages.
    pub fn transcript(&self) -> String {
        format!(
            "$ {}\nexit: {}{}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.command,
            self.code
                .map(|c| c.to_string())
                .unwrap_or_else(|| "none (signal)".into()),
            if self.timed_out {
                " (TIMED OUT, killed)"
            } else {
                ""
            },
            self.stdout.trim_end(),
            self.stderr.trim_end()
        )
    }
}

/// Runs `program args...`, feeding `stdin`, killing it after `timeout`.
pub fn run(program: &str, args: &[&str], stdin: Option<&str>, timeout: Duration) -> CmdOutput {
    let command = std::iter::once(program)
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ");
    let mut child = match Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            return CmdOutput {
                command,
                code: None,
                timed_out: false,
                stdout: String::new(),
                stderr: format!("failed to spawn: {e}"),
            }
        }
    };
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // Commands here read all of their (small) input before producing output.
        let _ = pipe.write_all(input.as_bytes());
    }
    let mut out_pipe = child.stdout.take().expect("stdout is piped");
    let mut err_pipe = child.stderr.take().expect("stderr is piped");
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out_pipe.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err_pipe.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + timeout;
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() >= deadline => {
                timed_out = true;
                let _ = child.kill();
                break child.wait().ok();
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(_) => break None,
        }
    };
    CmdOutput {
        command,
        code: if timed_out {
            None
        } else {
            status.and_then(|s| s.code())
        },
        timed_out,
        stdout: out_reader.join().unwrap_or_default(),
        stderr: err_reader.join().unwrap_or_default(),
    }
}

/// Runs a command that must succeed; panics with its transcript otherwise.
pub fn must(program: &str, args: &[&str], stdin: Option<&str>) -> CmdOutput {
    let out = run(program, args, stdin, CMD_TIMEOUT);
    assert!(out.success(), "command failed:\n{}", out.transcript());
    out
}

/// Runs an `ip -batch` script inside namespace `ns` (`-force` off: stops at the first error).
pub fn ip_batch(ns: &str, lines: &[String]) {
    if lines.is_empty() {
        return;
    }
    let script = lines.join("\n") + "\n";
    let out = run("ip", &["-n", ns, "-batch", "-"], Some(&script), CMD_TIMEOUT);
    assert!(
        out.success(),
        "ip batch in {ns} failed:\n{}\n--- script ---\n{script}",
        out.transcript()
    );
}

/// Sets sysctls inside `ns` (before its interfaces exist, so `default.*` applies to them).
pub fn sysctls(ns: &str, settings: &[&str]) {
    let mut args = vec!["netns", "exec", ns, "sysctl", "-q", "-w"];
    args.extend_from_slice(settings);
    must("ip", &args, None);
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A fresh per-process unique namespace prefix `sy-<pid>-<counter>-`.
pub fn unique_prefix() -> String {
    format!(
        "sy-{}-{}-",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    )
}

/// Names of all named network namespaces.
pub fn list_namespaces() -> Vec<String> {
    let out = run("ip", &["netns", "list"], None, CMD_TIMEOUT);
    out.stdout
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// Deletes `sy-<pid>-*` namespaces whose process no longer exists (leftovers of killed runs).
pub fn delete_stale_namespaces() {
    for name in list_namespaces() {
        let Some(rest) = name.strip_prefix("sy-") else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = run("ip", &["netns", "delete", &name], None, CMD_TIMEOUT);
        }
    }
}

/// Creates a named namespace with loopback up. `Err` carries the reason on failure.
pub fn create_namespace(name: &str) -> Result<(), String> {
    let out = run("ip", &["netns", "add", name], None, CMD_TIMEOUT);
    if !out.success() {
        return Err(format!(
            "`ip netns add {name}` failed: {}",
            out.stderr.trim()
        ));
    }
    let out = run(
        "ip",
        &["-n", name, "link", "set", "lo", "up"],
        None,
        CMD_TIMEOUT,
    );
    if !out.success() {
        return Err(format!("bringing up lo in {name}: {}", out.stderr.trim()));
    }
    Ok(())
}

/// A new namespace `<unique prefix><tag>`. Where one cannot be made (no root) the test is
/// skipped: `None` and a SKIP line, unless SWITCHYARD_REQUIRE_NETNS=1 (CI), where that fails.
pub fn create_or_skip(tag: &str) -> Option<String> {
    let name = format!("{}{tag}", unique_prefix());
    match create_namespace(&name) {
        Ok(()) => Some(name),
        Err(e) => {
            assert!(
                std::env::var("SWITCHYARD_REQUIRE_NETNS").as_deref() != Ok("1"),
                "SWITCHYARD_REQUIRE_NETNS=1 but: {e}"
            );
            println!("SKIP {tag}: needs root and network namespaces: {e}");
            None
        }
    }
}

pub fn delete_namespace(name: &str) {
    let _ = run("ip", &["netns", "delete", name], None, CMD_TIMEOUT);
}

/// Runs `f` on a fresh thread that has joined network namespace `ns`.
///
/// Only that thread switches namespace; sockets it creates stay in `ns` wherever they are
/// used afterwards, so callers typically create sockets here and use them on their own thread.
pub fn in_netns<T, F>(ns: &str, f: F) -> std::io::Result<T>
where
    T: Send,
    F: FnOnce() -> std::io::Result<T> + Send,
{
    let path = format!("/run/netns/{ns}");
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                let file = File::open(&path)?;
                nix::sched::setns(&file, CloneFlags::CLONE_NEWNET)
                    .map_err(|e| std::io::Error::other(format!("setns({path}): {e}")))?;
                f()
            })
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("netns thread panicked")))
    })
}

/// Whether the current process runs as root (effective uid 0).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// The iptables-nft savers of both families.
pub const NFT_SAVE: &[&str] = &["iptables-nft-save", "ip6tables-nft-save"];

/// Every rule iptables-save shows in both families, by table and chain in the order it has
/// there; chains without rules left out (a partial sync leaves emptied chains to the next
/// full sync, and nothing jumps to them).
pub fn saved_rules(ns: &str, savers: &[&str]) -> BTreeMap<(String, String), Vec<String>> {
    let mut out: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for save in savers {
        let run = run("ip", &["netns", "exec", ns, save], None, CMD_TIMEOUT);
        assert!(run.success(), "{}", run.transcript());
        let mut table = String::new();
        for line in run.stdout.lines() {
            if let Some(t) = line.strip_prefix('*') {
                table = format!("{save} {t}");
            } else if let Some(rule) = line.strip_prefix("-A ") {
                let chain = rule
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_string();
                out.entry((table.clone(), chain))
                    .or_default()
                    .push(rule.to_string());
            }
        }
    }
    out
}
