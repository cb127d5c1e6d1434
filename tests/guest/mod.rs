//! Runs one test of the calling test binary inside a QEMU guest that boots Debian's 6.1
//! kernel, for what the host kernel lacks (IPVS, the dummy link type).
//!
//! The guest sees this machine's root file system read-only over 9p, so the test binary,
//! `switchyard` and the host's tools run there unchanged; /tmp and /run are the guest's
//! own, and a second, writable 9p share carries the script to run and its output back.
//! The kernel comes from `tests/guest/prepare-kernel.sh` (`.ci/run` calls it). Software
//! emulation (`-accel tcg`): KVM on these machines is paravirtual and hangs.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Set by the guest's init for the test it runs: tests meant for the guest check it.
pub const IN_GUEST_ENV: &str = "SWITCHYARD_IN_GUEST";

/// Modules the init loads before it can mount the shares.
const BOOT_MODULES: &[&str] = &["virtio_pci", "9pnet_virtio", "9p"];

/// Modules loaded once the root is mounted: what the tests use, so that nothing waits on
/// the kernel's on-demand loading (which also works, through a wrapper).
const TEST_MODULES: &[&str] = &[
    "crc32c_generic",
    "ip_vs",
    "ip_vs_rr",
    "ip_vs_wrr",
    "ip_vs_lc",
    "ip_vs_wlc",
    "ip_vs_sh",
    "ip_vs_dh",
    "ip_vs_sed",
    "ip_vs_nq",
    "ip_vs_lblc",
    "ip_vs_lblcr",
    "ip_vs_fo",
    "ip_vs_ovf",
    "ip_vs_mh",
    "dummy",
    "veth",
    "bridge",
    "br_netfilter",
    "nf_tables",
    "nft_compat",
    "nft_chain_nat",
    "nft_reject_inet",
    "nft_reject_ipv4",
    "nft_reject_ipv6",
    "nft_ct",
    "nft_nat",
    "nft_masq",
    "nft_numgen",
    "nft_fib_inet",
    "nft_fib_ipv4",
    "nft_fib_ipv6",
    "nf_conntrack_netlink",
    "ip_set",
    "ip_set_hash_ip",
    "ip_set_hash_ipport",
    "ip_set_hash_ipportip",
    "ip_set_hash_ipportnet",
    "ip_set_hash_net",
    "ip_set_bitmap_port",
    "xt_set",
    "xt_mark",
    "xt_MASQUERADE",
    "xt_addrtype",
    "xt_comment",
    "xt_conntrack",
    "xt_physdev",
    "xt_statistic",
    "xt_recent",
    "xt_nat",
    "xt_tcpudp",
    "ipt_REJECT",
    "ip6t_REJECT",
    "iptable_nat",
    "iptable_filter",
    "ip6table_nat",
    "ip6table_filter",
];

/// An unpacked guest kernel.
#[derive(Debug, Clone)]
pub struct Kernel {
    /// The unpacked package: boot/vmlinuz-*, lib/modules/<version>.
    pub root: PathBuf,
    pub version: String,
}

impl Kernel {
    fn vmlinuz(&self) -> PathBuf {
        self.root.join(format!("boot/vmlinuz-{}", self.version))
    }

    fn modules(&self) -> PathBuf {
        self.root.join("lib/modules").join(&self.version)
    }
}

/// The prepared kernel, or `None` (with a note) when there is none and none is required;
/// panics when `SWITCHYARD_REQUIRE_GUEST=1` and the kernel or QEMU is missing.
pub fn kernel() -> Option<Kernel> {
    let dir = std::env::var_os("SWITCHYARD_GUEST_KERNEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/guest-kernel"));
    let root = dir.join("root");
    let version = std::fs::read_dir(root.join("lib/modules"))
        .ok()
        .and_then(|mut d| d.next())
        .and_then(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned());
    let qemu = Command::new("qemu-system-x86_64")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let required = std::env::var("SWITCHYARD_REQUIRE_GUEST").as_deref() == Ok("1");
    match version {
        Some(version) if qemu => Some(Kernel { root, version }),
        _ if required => panic!(
            "SWITCHYARD_REQUIRE_GUEST=1 but the guest cannot boot: kernel in {} {}, qemu-system-x86_64 {}; \
             run tests/guest/prepare-kernel.sh and install qemu-system-x86",
            dir.display(),
            if root.exists() { "present" } else { "missing" },
            if qemu { "present" } else { "missing" },
        ),
        _ => {
            eprintln!(
                "SKIPPED: no guest kernel in {} or no qemu-system-x86_64 (tests/guest/prepare-kernel.sh)",
                dir.display()
            );
            None
        }
    }
}

/// The boot modules and what they need, dependencies first, as `modules.dep` lists them.
fn load_order(modules: &Path, wanted: &[&str]) -> Vec<String> {
    let dep = std::fs::read_to_string(modules.join("modules.dep")).expect("modules.dep");
    let deps: std::collections::BTreeMap<String, Vec<String>> = dep
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(m, d)| {
            (
                m.to_string(),
                d.split_whitespace().map(str::to_string).collect(),
            )
        })
        .collect();
    let by_name = |name: &str| {
        deps.keys()
            .find(|p| {
                Path::new(p).file_stem().and_then(|s| s.to_str()) == Some(name)
                    || Path::new(p).file_name().and_then(|s| s.to_str())
                        == Some(&format!("{name}.ko"))
            })
            .cloned()
            .unwrap_or_else(|| panic!("module {name} not in modules.dep"))
    };
    fn visit(
        m: &str,
        deps: &std::collections::BTreeMap<String, Vec<String>>,
        seen: &mut BTreeSet<String>,
        out: &mut Vec<String>,
    ) {
        if !seen.insert(m.to_string()) {
            return;
        }
        // modules.dep lists a module's dependencies so that loading them right to left works.
        for d in deps.get(m).into_iter().flatten().rev() {
            visit(d, deps, seen, out);
        }
        out.push(m.to_string());
    }
    let (mut seen, mut out) = (BTreeSet::new(), Vec::new());
    for w in wanted {
        visit(&by_name(w), &deps, &mut seen, &mut out);
    }
    out
}

/// A newc cpio archive, as the kernel unpacks an initramfs.
#[derive(Default)]
struct Cpio {
    buf: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.ino += 1;
        let header = format!(
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            self.ino,
            mode,
            0,
            0,
            1,
            0,
            data.len(),
            0,
            0,
            0,
            0,
            name.len() + 1,
            0
        );
        self.buf.extend_from_slice(header.as_bytes());
        self.buf.extend_from_slice(name.as_bytes());
        self.buf.push(0);
        self.pad();
        self.buf.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }

    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040755, &[]);
    }

    fn file(&mut self, name: &str, data: &[u8], exec: bool) {
        self.entry(name, if exec { 0o100755 } else { 0o100644 }, data);
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[]);
        self.buf
    }
}

/// The first components under /tmp of `paths` (canonical), which the guest's own /tmp
/// would hide: a checkout or target directory there must stay reachable.
fn host_tmp_dirs(paths: &[&Path]) -> Vec<String> {
    let mut out = BTreeSet::new();
    for p in paths {
        let p = p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
        if let Ok(rest) = p.strip_prefix("/tmp") {
            if let Some(first) = rest.components().next() {
                out.insert(first.as_os_str().to_string_lossy().into_owned());
            }
        }
    }
    out.into_iter().collect()
}

/// The guest's init: mount the shares, load modules, run the script in a chroot of the
/// host's root, record its status, power off.
fn init_script(k: &Kernel, boot: &[String]) -> String {
    let inserts: String = boot
        .iter()
        .map(|m| {
            let name = Path::new(m).file_name().unwrap().to_string_lossy();
            format!("insmod /mod/{name} || echo \"guest: insmod {name} failed\"\n")
        })
        .collect();
    let kroot = k.root.display();
    let modules = TEST_MODULES.join(" ");
    let exe = std::env::current_exe().expect("current binary");
    let host_tmp = host_tmp_dirs(&[&exe, Path::new(env!("CARGO_MANIFEST_DIR")), &k.root]).join(" ");
    format!(
        r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
{inserts}
R=/newroot
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=loose,ro hostroot $R || {{ echo "guest: cannot mount the host root"; poweroff -f; }}
# /tmp becomes the guest's own, but what the tests need from the host's /tmp (a checkout,
# a target dir, the kernel) stays visible, bound over from the read-only root.
mkdir -p /hosttmp
mount -o bind $R/tmp /hosttmp
mount -t tmpfs tmp $R/tmp
for d in {host_tmp}; do mkdir -p "$R/tmp/$d" && mount -o bind "/hosttmp/$d" "$R/tmp/$d" || echo "guest: cannot bind /tmp/$d"; done
mount -t tmpfs run $R/run
mkdir -p $R/run/guest-share $R/run/netns
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 share $R/run/guest-share
mount -t proc proc $R/proc || echo "guest: proc mount failed"
mount -t sysfs sys $R/sys
mount -t devtmpfs dev $R/dev
mkdir -p $R/dev/shm $R/dev/pts
mount -t tmpfs shm $R/dev/shm
mount -t devpts devpts $R/dev/pts
# The kernel runs its module loader from init's root (this initramfs), not the chroot.
printf '#!/bin/sh\nexec /bin/chroot /newroot /usr/sbin/modprobe -d {kroot} "$@"\n' > /modprobe
chmod +x /modprobe
echo /modprobe > /proc/sys/kernel/modprobe
for m in {modules}; do chroot $R /usr/sbin/modprobe -d {kroot} $m 2>/dev/null || echo "guest: no module $m"; done
chroot $R /bin/sh -c 'ip link set lo up'
chroot $R /bin/sh /run/guest-share/run.sh > $R/run/guest-share/output 2>&1
echo $? > $R/run/guest-share/status
sync
umount $R/run/guest-share
poweroff -f
"#
    )
}

/// What a guest run left.
#[derive(Debug)]
pub struct GuestRun {
    /// The test's exit status; `None` when the guest never got to write it.
    pub status: Option<i32>,
    /// The test's stdout and stderr.
    pub output: String,
    /// The serial console: kernel messages and init's notes.
    pub console: String,
    pub timed_out: bool,
    pub elapsed: Duration,
}

impl GuestRun {
    pub fn passed(&self) -> bool {
        self.status == Some(0)
    }

    pub fn transcript(&self) -> String {
        format!(
            "guest status {:?}{} after {:.1} s\n--- test output ---\n{}\n--- console (tail) ---\n{}",
            self.status,
            if self.timed_out { " (TIMED OUT, killed)" } else { "" },
            self.elapsed.as_secs_f64(),
            tail(&self.output, 400),
            tail(&self.console, 60)
        )
    }
}

fn tail(s: &str, lines: usize) -> String {
    let v: Vec<&str> = s.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

/// Boots the guest and runs test `name` of this test binary there (with `--exact`, ignored
/// tests included, one thread), with `env` set; killed after `timeout`.
pub fn run_test(k: &Kernel, name: &str, env: &[(&str, &str)], timeout: Duration) -> GuestRun {
    let exe = std::env::current_exe().expect("current test binary");
    let mut script = String::from(
        "set -u\ncd /tmp\nexport PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n",
    );
    script.push_str(&format!("export {IN_GUEST_ENV}=1 RUST_BACKTRACE=0\n"));
    for (k, v) in env {
        script.push_str(&format!("export {k}='{v}'\n"));
    }
    script.push_str(&format!(
        "exec '{}' --exact '{name}' --include-ignored --nocapture --test-threads=1\n",
        exe.display()
    ));
    run_script(k, &script, timeout)
}

/// Boots the guest and runs the shell `script` there, in a chroot of the host's root.
pub fn run_script(k: &Kernel, script: &str, timeout: Duration) -> GuestRun {
    let share = tempfile::Builder::new()
        .prefix("switchyard-guest-")
        .tempdir()
        .expect("share dir");
    let modules = k.modules();
    let boot = load_order(&modules, BOOT_MODULES);
    let mut cpio = Cpio::default();
    for d in ["bin", "dev", "proc", "sys", "newroot", "mod"] {
        cpio.dir(d);
    }
    let busybox = std::fs::read("/bin/busybox").expect("/bin/busybox (busybox-static)");
    cpio.file("bin/busybox", &busybox, true);
    for m in &boot {
        let data = std::fs::read(modules.join(m)).expect("module file");
        let name = Path::new(m).file_name().unwrap().to_string_lossy();
        cpio.file(&format!("mod/{name}"), &data, false);
    }
    cpio.file("init", init_script(k, &boot).as_bytes(), true);
    let initrd = share.path().join("initramfs.cpio");
    std::fs::write(&initrd, cpio.finish()).expect("write initramfs");

    std::fs::write(share.path().join("run.sh"), script).expect("write run.sh");

    let start = Instant::now();
    let mut child = Command::new("qemu-system-x86_64")
        .args([
            "-accel",
            "tcg",
            "-m",
            "2048",
            "-smp",
            "2",
            "-nographic",
            "-no-reboot",
        ])
        .args(["-nic", "none", "-monitor", "none", "-serial", "stdio"])
        .arg("-kernel")
        .arg(k.vmlinuz())
        .arg("-initrd")
        .arg(&initrd)
        .args([
            "-append",
            "console=ttyS0 rdinit=/init panic=-1 loglevel=4 net.ifnames=0",
        ])
        .args([
            "-virtfs",
            "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
        ])
        .arg("-virtfs")
        .arg(format!(
            "local,path={},mount_tag=share,security_model=none",
            share.path().display()
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start qemu-system-x86_64");
    let mut stdout = child.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stdout.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    let mut timed_out = false;
    loop {
        if child.try_wait().ok().flatten().is_some() {
            break;
        }
        if start.elapsed() > timeout {
            timed_out = true;
            let _ = child.kill();
            let _ = child.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut console = reader.join().unwrap_or_default();
    if let Some(mut e) = child.stderr.take() {
        let mut s = String::new();
        let _ = e.read_to_string(&mut s);
        console.push_str(&s);
    }
    let read = |f: &str| std::fs::read_to_string(share.path().join(f)).unwrap_or_default();
    GuestRun {
        status: read("status").trim().parse().ok(),
        output: read("output"),
        console,
        timed_out,
        elapsed: start.elapsed(),
    }
}

/// Boots the guest for `test` of this test binary (the `guest_*` partner of an
/// `*_in_guest` test) and fails with its transcript unless it ran there and passed.
/// Skips (returns) when there is no guest and none is required.
pub fn test_in_guest(test: &str, env: &[(&str, &str)], timeout: Duration) {
    let Some(kernel) = kernel() else {
        return;
    };
    let run = run_test(&kernel, test, env, timeout);
    if let Ok(path) = std::env::var("SWITCHYARD_GUEST_LOG") {
        let _ = std::fs::write(path, &run.output);
    }
    eprintln!("{}", run.transcript());
    assert!(run.passed(), "{test} failed in the guest");
    // With --nocapture the test's own output lands between "test NAME ..." and "ok", so
    // the summary line is what proves the one test ran and passed.
    assert!(
        run.output.contains(&format!("test {test} ..."))
            && run.output.contains("test result: ok. 1 passed"),
        "{test} did not run in the guest"
    );
}

/// The guard of a `guest_*` test: it runs only inside the guest.
pub fn require_guest() {
    assert_eq!(
        std::env::var(IN_GUEST_ENV).as_deref(),
        Ok("1"),
        "runs only inside the QEMU guest (through its *_in_guest partner)"
    );
}
