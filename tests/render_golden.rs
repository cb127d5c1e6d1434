//! Golden tests of `switchyard render`: small scenarios whose rendered transaction is kept as
//! readable text in tests/golden/*.nft (nftables mode) and *.iptables (iptables-restore input
//! in iptables mode). `SWITCHYARD_UPDATE_GOLDEN=1` rewrites them.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn render(name: &str, mode: &str) -> String {
    let dir = golden_dir();
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .arg("render")
        .arg("--config")
        .arg(dir.join(format!("{name}.config.yaml")))
        .arg("--manifests")
        .arg(dir.join(format!("{name}.yaml")))
        .args(["--proxy-mode", mode])
        .output()
        .expect("run switchyard render");
    assert!(
        out.status.success(),
        "render {name} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("render output is UTF-8")
}

fn check(name: &str) {
    check_mode(name, "nftables", "nft");
}

fn check_mode(name: &str, mode: &str, ext: &str) {
    let got = render(name, mode);
    let path = golden_dir().join(format!("{name}.{ext}"));
    if std::env::var_os("SWITCHYARD_UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &got).expect("write golden file");
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run with SWITCHYARD_UPDATE_GOLDEN=1 to create it",
            path.display()
        )
    });
    if got != want {
        let first = got
            .lines()
            .zip(want.lines())
            .position(|(g, w)| g != w)
            .unwrap_or(got.lines().count().min(want.lines().count()));
        panic!(
            "render of {name} differs from {} at line {}:\n  got:  {:?}\n  want: {:?}\n(SWITCHYARD_UPDATE_GOLDEN=1 rewrites it after review)",
            path.display(),
            first + 1,
            got.lines().nth(first),
            want.lines().nth(first)
        );
    }
    // Same input, same bytes.
    assert_eq!(
        render(name, mode),
        got,
        "render of {name} is not deterministic"
    );
}

#[test]
fn golden_clusterip() {
    check("clusterip");
}

#[test]
fn golden_nodeport_lb() {
    check("nodeport-lb");
}

#[test]
fn golden_ipv6() {
    check("ipv6");
}

#[test]
fn golden_nodeport_lb_iptables() {
    check_mode("nodeport-lb", "iptables", "iptables");
}

#[test]
fn golden_ipv6_iptables() {
    check_mode("ipv6", "iptables", "iptables");
}
