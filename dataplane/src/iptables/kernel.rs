//! The only I/O of the iptables backend: iptables-save, iptables-restore and the
//! route_localnet sysctl, behind a trait with a fake twin; and choosing between the
//! iptables-nft and iptables-legacy back ends as the kube-proxy image's wrapper does.

use super::diff::{parse_save, SaveParseError, Saved, Style};
use super::plan::TableName;
use crate::backend::BackendError;
use crate::model::IpFamily;
use std::collections::BTreeSet;

/// What can go wrong talking to iptables.
#[derive(Debug, thiserror::Error)]
pub enum IptablesError {
    #[error(transparent)]
    Direct(#[from] super::direct::DirectError),
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("{program} failed: {stderr}{}", line.as_ref().map(|l| format!("\n  offending input: {l}")).unwrap_or_default())]
    Rejected {
        program: String,
        stderr: String,
        /// The input line the command complained about, when it named one.
        line: Option<String>,
    },
    #[error("{program}: {stderr}")]
    Save { program: String, stderr: String },
    #[error("{program}: {source}")]
    Parse {
        program: String,
        source: SaveParseError,
    },
    #[error(
        "cannot enable net.ipv4.conf.all.route_localnet (needed for NodePorts on 127.0.0.1): {0}"
    )]
    Sysctl(std::io::Error),
    #[error("fake iptables refused the input: {0}")]
    Fake(String),
}

impl From<IptablesError> for BackendError {
    fn from(e: IptablesError) -> BackendError {
        let reason = match &e {
            IptablesError::Rejected { .. } | IptablesError::Fake(_) => "rejected",
            IptablesError::Spawn { .. } => "spawn",
            IptablesError::Sysctl(_) => "sysctl",
            _ => "read",
        };
        // Each family has its own program; the error names the one that failed.
        let family = match &e {
            IptablesError::Spawn { program, .. }
            | IptablesError::Rejected { program, .. }
            | IptablesError::Save { program, .. }
            | IptablesError::Parse { program, .. } => Some(if program.starts_with("ip6") {
                IpFamily::V6
            } else {
                IpFamily::V4
            }),
            IptablesError::Sysctl(_) => Some(IpFamily::V4),
            _ => None,
        };
        let program = match &e {
            IptablesError::Spawn { program, .. } => Some(program.clone()),
            _ => None,
        };
        let mut out = BackendError::new(reason, e);
        if let Some(f) = family {
            out = out.in_family(f);
        }
        if let Some(p) = program {
            out = out.program_not_run(&p);
        }
        out
    }
}

/// Which iptables implementation programs the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// iptables-nft: xtables rules carried in nf_tables.
    Nft,
    /// iptables-legacy: the x_tables blob interface.
    Legacy,
}

impl Variant {
    pub fn as_str(self) -> &'static str {
        match self {
            Variant::Nft => "nft",
            Variant::Legacy => "legacy",
        }
    }

    pub fn parse(s: &str) -> Option<Variant> {
        match s {
            "nft" => Some(Variant::Nft),
            "legacy" => Some(Variant::Legacy),
            _ => None,
        }
    }
}

/// Reads and writes a family's iptables rules.
pub trait IptablesExecutor {
    /// Every table of the family, as iptables-save prints it.
    fn save(&mut self, family: IpFamily) -> Result<Saved, IptablesError>;
    /// One `iptables-restore --noflush` of `input`: each table in it commits atomically.
    fn restore(&mut self, family: IpFamily, input: &str) -> Result<(), IptablesError>;
    /// Let IPv4 packets to 127.0.0.0/8 be routed (NodePorts on localhost).
    fn enable_route_localnet(&mut self) -> Result<(), IptablesError>;
    /// How restore inputs should be laid out for this executor's iptables-restore.
    fn style(&self) -> Style {
        Style::Plain
    }
    /// Whether `chain` exists in `table`: the canary probe, far cheaper than a save.
    fn chain_exists(
        &mut self,
        family: IpFamily,
        table: TableName,
        chain: &str,
    ) -> Result<bool, IptablesError>;
    /// Creates `chains`, none of which exists yet, with their rules, in one transaction
    /// ([`Style::NftDirect`]'s [`super::diff::Input::Create`]).
    fn create_chains(
        &mut self,
        family: IpFamily,
        table: TableName,
        chains: &[(&str, &[String])],
    ) -> Result<(), IptablesError> {
        let _ = (family, table, chains);
        Err(super::direct::DirectError::Unsupported("no direct writes here".into()).into())
    }
}

/// The real executor: the iptables binaries of one variant.
#[derive(Debug, Clone)]
pub struct IptablesCommand {
    pub variant: Variant,
    /// Seconds to wait for /run/xtables.lock (iptables-legacy takes it; nft ignores it).
    pub lock_wait: u32,
}

fn program(family: IpFamily, variant: Variant, op: &str) -> String {
    let fam = match family {
        IpFamily::V4 => "iptables",
        IpFamily::V6 => "ip6tables",
    };
    if op.is_empty() {
        format!("{fam}-{}", variant.as_str())
    } else {
        format!("{fam}-{}-{op}", variant.as_str())
    }
}

/// Whether this node's iptables-nft encodes rules as [`super::direct`] writes them: only
/// 1.8.9 is checked byte for byte (1.8.7 cannot read native port matches back; 1.8.11
/// adds rule userdata), so any other version, or none, keeps every chain in the restore.
fn encodes_like_direct_writes() -> bool {
    static CHECKED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CHECKED.get_or_init(|| {
        let version = run("iptables-nft", &["--version"], None)
            .map(|(ok, stdout, _)| if ok { stdout } else { String::new() })
            .unwrap_or_default();
        let known = version.starts_with("iptables v1.8.9 (nf_tables)");
        if !known {
            tracing::info!(
                "iptables-nft {:?}: chains go through iptables-nft-restore only (direct \
                 writes are checked against 1.8.9)",
                version.trim()
            );
        }
        known
    })
}

/// Runs `prog args`, feeding `stdin`; (success, stdout, stderr).
fn run(
    prog: &str,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<(bool, String, String), IptablesError> {
    let out = crate::process::run(prog, args, stdin).map_err(|source| IptablesError::Spawn {
        program: prog.to_string(),
        source,
    })?;
    Ok((out.success, out.stdout, out.stderr))
}

/// The input line iptables-restore names in "line N failed".
fn offending_line(stderr: &str, input: &str) -> Option<String> {
    // "line 12 failed" (legacy) or "Error occurred at line: 12" (nft).
    let at = stderr.find("line")? + 4;
    let digits: String = stderr[at..]
        .trim_start_matches([':', ' '])
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    let n: usize = digits.parse().ok()?;
    input.lines().nth(n.checked_sub(1)?).map(str::to_string)
}

impl IptablesCommand {
    pub fn new(variant: Variant) -> Self {
        IptablesCommand {
            variant,
            lock_wait: 5,
        }
    }

    /// `variant`, or the one the node uses when `None`.
    pub fn for_variant(variant: Option<Variant>) -> Self {
        match variant {
            Some(v) => IptablesCommand::new(v),
            None => {
                let cmd = IptablesCommand::detect();
                tracing::info!("iptables back end: {} (detected)", cmd.variant.as_str());
                cmd
            }
        }
    }

    /// The variant the node already uses (see [`choose_variant`]).
    pub fn detect() -> Self {
        let dump = |family, variant, args: &[&str]| {
            // The legacy tools instantiate empty legacy tables just by looking (and then
            // iptables-nft warns about them forever): skip them when the kernel lists none.
            let names = match family {
                IpFamily::V4 => "/proc/net/ip_tables_names",
                IpFamily::V6 => "/proc/net/ip6_tables_names",
            };
            if variant == Variant::Legacy
                && std::fs::read_to_string(names).map_or(true, |n| n.trim().is_empty())
            {
                return String::new();
            }
            run(&program(family, variant, "save"), args, None)
                .ok()
                .filter(|(ok, _, _)| *ok)
                .map(|(_, out, _)| out)
                .unwrap_or_default()
        };
        let both = |variant, args: &[&str]| {
            format!(
                "{}{}",
                dump(IpFamily::V4, variant, args),
                dump(IpFamily::V6, variant, args)
            )
        };
        let mangle = ["-t", "mangle"];
        let variant = choose_variant(
            &both(Variant::Nft, &mangle),
            &both(Variant::Legacy, &mangle),
            || (both(Variant::Nft, &[]), both(Variant::Legacy, &[])),
        );
        IptablesCommand::new(variant)
    }
}

/// kube-proxy's image wrapper rule: kubelet's marker chains (KUBE-IPTABLES-HINT, else
/// KUBE-KUBELET-CANARY) in the mangle table say which back end the node uses, nft first;
/// without them, the back end holding more rules wins, nft on a tie.
pub fn choose_variant(
    nft_mangle: &str,
    legacy_mangle: &str,
    full_dumps: impl FnOnce() -> (String, String),
) -> Variant {
    let has = |dump: &str, chain: &str| {
        dump.lines().any(|l| {
            l.strip_prefix(':')
                .and_then(|d| d.split_whitespace().next())
                == Some(chain)
        })
    };
    for marker in ["KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"] {
        if has(nft_mangle, marker) {
            return Variant::Nft;
        }
        if has(legacy_mangle, marker) {
            return Variant::Legacy;
        }
    }
    let (nft, legacy) = full_dumps();
    let rules = |dump: &str| dump.lines().filter(|l| l.starts_with('-')).count();
    if rules(&legacy) > rules(&nft) {
        Variant::Legacy
    } else {
        Variant::Nft
    }
}

impl IptablesExecutor for IptablesCommand {
    fn save(&mut self, family: IpFamily) -> Result<Saved, IptablesError> {
        let prog = program(family, self.variant, "save");
        let (ok, stdout, stderr) = run(&prog, &[], None)?;
        if !ok {
            return Err(IptablesError::Save {
                program: prog,
                stderr,
            });
        }
        parse_save(&stdout).map_err(|source| IptablesError::Parse {
            program: prog,
            source,
        })
    }

    fn restore(&mut self, family: IpFamily, input: &str) -> Result<(), IptablesError> {
        let prog = program(family, self.variant, "restore");
        if let Some(errno) = crate::fault::injected_at(|| format!("iptables-restore:{family}")) {
            return Err(IptablesError::Rejected {
                program: prog,
                stderr: format!(
                    "{} (injected by SWITCHYARD_FAULTS)",
                    std::io::Error::from_raw_os_error(errno)
                ),
                line: None,
            });
        }
        let wait = self.lock_wait.to_string();
        // Whole-table blocks print the table (`-S`): nothing to keep.
        let out =
            crate::process::run_discarding_stdout(&prog, &["--noflush", "-w", &wait], Some(input))
                .map_err(|source| IptablesError::Spawn {
                    program: prog.to_string(),
                    source,
                })?;
        let (ok, stderr) = (out.success, out.stderr);
        if ok {
            return Ok(());
        }
        Err(IptablesError::Rejected {
            line: offending_line(&stderr, input),
            program: prog,
            stderr,
        })
    }

    fn style(&self) -> Style {
        match self.variant {
            Variant::Nft if encodes_like_direct_writes() => Style::NftDirect,
            Variant::Nft => Style::Nft,
            Variant::Legacy => Style::Plain,
        }
    }

    fn create_chains(
        &mut self,
        family: IpFamily,
        table: TableName,
        chains: &[(&str, &[String])],
    ) -> Result<(), IptablesError> {
        use super::direct::{send, Batch, DirectError};
        if self.variant != Variant::Nft {
            return Err(DirectError::Unsupported("iptables-legacy has no nf_tables".into()).into());
        }
        let mut batch = Batch::new(family, table)?;
        for (chain, _) in chains {
            batch.chain(chain);
        }
        for (chain, rules) in chains {
            for rule in rules.iter() {
                if !batch.rule(chain, rule) {
                    return Err(DirectError::Unsupported(format!(
                        "cannot encode {chain} rule {rule}"
                    ))
                    .into());
                }
            }
        }
        send(batch.finish())?;
        Ok(())
    }

    fn chain_exists(
        &mut self,
        family: IpFamily,
        table: TableName,
        chain: &str,
    ) -> Result<bool, IptablesError> {
        let prog = program(family, self.variant, "");
        let wait = self.lock_wait.to_string();
        let (ok, _, stderr) = run(
            &prog,
            &["-w", &wait, "-t", table.as_str(), "-S", chain],
            None,
        )?;
        if ok {
            return Ok(true);
        }
        // iptables-nft 1.8.9 calls a missing chain "incompatible" once the table has lost
        // its built-in chains too (`-F` then `-X`); either way ours is not there as written.
        if ["No chain", "does not exist", "incompatible"]
            .iter()
            .any(|m| stderr.contains(m))
        {
            return Ok(false);
        }
        Err(IptablesError::Save {
            program: prog,
            stderr,
        })
    }

    fn enable_route_localnet(&mut self) -> Result<(), IptablesError> {
        let path = "/proc/sys/net/ipv4/conf/all/route_localnet";
        if std::fs::read_to_string(path).is_ok_and(|v| v.trim() == "1") {
            return Ok(());
        }
        std::fs::write(path, "1").map_err(IptablesError::Sysctl)
    }
}

/// A fake kernel for unit tests: holds each family's tables as the restores left them,
/// applying each restore input all or nothing, and records every input.
#[derive(Debug, Default, Clone)]
pub struct FakeIptables {
    pub families: std::collections::BTreeMap<IpFamily, Saved>,
    pub inputs: Vec<(IpFamily, String)>,
    pub saves: usize,
    pub route_localnet: bool,
    /// Reject the next restore with this message.
    pub fail_next: Option<String>,
    /// Every save and restore of IPv6 fails, as on a node with IPv6 disabled.
    pub fail_v6: bool,
    /// The layout asked of the inputs; with [`Style::Nft`], a block that starts with `-S`
    /// is refused a rule in a chain the table does not hold yet, as iptables-nft-restore
    /// 1.8.9 refuses one in a built-in chain the kernel does not have.
    pub style: Style,
    /// Refuse `-S` in a restore, naming its line, as an iptables-nft that takes no list
    /// command there would.
    pub refuse_listing: bool,
    /// Chains created directly, per call.
    pub created: Vec<(IpFamily, Vec<String>)>,
    /// Refuse direct writes, as a kernel without nf_tables netlink access would.
    pub refuse_direct: bool,
}

impl FakeIptables {
    /// Apply a restore input to `saved` as `iptables-restore --noflush` would.
    fn apply(saved: &mut Saved, input: &str) -> Result<(), String> {
        let mut work = saved.clone();
        let mut table: Option<String> = None;
        // Chains the kernel had when the current block began, in a block that began `-S`.
        let mut whole_table: Option<BTreeSet<String>> = None;
        for line in input.lines() {
            if let Some(t) = line.strip_prefix('*') {
                work.tables.entry(t.to_string()).or_default();
                table = Some(t.to_string());
                whole_table = None;
                continue;
            }
            if line == "COMMIT" {
                table = None;
                continue;
            }
            if line == "-S" {
                let held = table.as_ref().and_then(|t| work.tables.get(t));
                whole_table = Some(held.map(|t| t.chains.clone()).unwrap_or_default());
                continue;
            }
            if let (Some(had), Some(rest)) = (
                &whole_table,
                line.strip_prefix("-A ").or(line.strip_prefix("-I ")),
            ) {
                let chain = rest.split(' ').next().unwrap_or_default();
                let builtin = chain.chars().all(|c| c.is_ascii_uppercase());
                if builtin && !had.contains(chain) {
                    return Err(format!("RULE_APPEND failed: no built-in chain {chain}"));
                }
            }
            let t = table
                .as_ref()
                .and_then(|t| work.tables.get_mut(t))
                .ok_or_else(|| format!("line outside a table: {line}"))?;
            if let Some(decl) = line.strip_prefix(':') {
                let name = decl
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_string();
                t.rules.retain(|(c, _)| *c != name);
                t.chains.insert(name);
            } else if let Some(rest) = line.strip_prefix("-A ") {
                let (chain, rule) = rest.split_once(' ').unwrap_or((rest, ""));
                if !t.chains.contains(chain) {
                    return Err(format!("no chain {chain}"));
                }
                t.rules.push((chain.to_string(), rule.to_string()));
            } else if let Some(rest) = line.strip_prefix("-I ") {
                let mut it = rest.splitn(3, ' ');
                let chain = it.next().unwrap_or_default().to_string();
                let _position = it.next();
                let rule = it.next().unwrap_or_default().to_string();
                t.chains.insert(chain.clone());
                let at = t.rules.iter().position(|(c, _)| *c == chain).unwrap_or(0);
                t.rules.insert(at, (chain, rule));
            } else if let Some(rest) = line.strip_prefix("-D ") {
                let (chain, rule) = rest.split_once(' ').unwrap_or((rest, ""));
                let at = t
                    .rules
                    .iter()
                    .position(|(c, r)| c == chain && r == rule)
                    .ok_or_else(|| format!("no such rule: {line}"))?;
                t.rules.remove(at);
            } else if let Some(chain) = line.strip_prefix("-X ") {
                let referenced = t
                    .rules
                    .iter()
                    .any(|(c, r)| c != chain && super::diff::rule_target(r) == Some(chain));
                if referenced {
                    return Err(format!("chain {chain} is still referenced"));
                }
                if t.rules.iter().any(|(c, _)| c == chain) {
                    return Err(format!("chain {chain} is not empty"));
                }
                t.chains.remove(chain);
            } else {
                return Err(format!("unknown line {line}"));
            }
        }
        *saved = work;
        Ok(())
    }
}

impl IptablesExecutor for FakeIptables {
    fn save(&mut self, family: IpFamily) -> Result<Saved, IptablesError> {
        self.saves += 1;
        if self.fail_v6 && family == IpFamily::V6 {
            return Err(IptablesError::Fake("ip6tables: IPv6 is disabled".into()));
        }
        Ok(self.families.get(&family).cloned().unwrap_or_default())
    }

    fn restore(&mut self, family: IpFamily, input: &str) -> Result<(), IptablesError> {
        self.inputs.push((family, input.to_string()));
        if self.fail_v6 && family == IpFamily::V6 {
            return Err(IptablesError::Fake("ip6tables: IPv6 is disabled".into()));
        }
        if let Some(msg) = self.fail_next.take() {
            return Err(IptablesError::Fake(msg));
        }
        if self.refuse_listing && input.lines().any(|l| l == "-S") {
            return Err(IptablesError::Rejected {
                program: "iptables-nft-restore".into(),
                stderr: "iptables-nft-restore: unknown option \"-S\"".into(),
                line: Some("-S".into()),
            });
        }
        let saved = self.families.entry(family).or_default();
        FakeIptables::apply(saved, input).map_err(IptablesError::Fake)
    }

    fn enable_route_localnet(&mut self) -> Result<(), IptablesError> {
        self.route_localnet = true;
        Ok(())
    }

    fn style(&self) -> Style {
        self.style
    }

    fn create_chains(
        &mut self,
        family: IpFamily,
        table: TableName,
        chains: &[(&str, &[String])],
    ) -> Result<(), IptablesError> {
        use super::direct::DirectError;
        self.created
            .push((family, chains.iter().map(|(c, _)| c.to_string()).collect()));
        if self.refuse_direct || family != IpFamily::V4 {
            return Err(DirectError::Unsupported("refused".into()).into());
        }
        let t = self
            .families
            .entry(family)
            .or_default()
            .tables
            .entry(table.as_str().to_string())
            .or_default();
        let mut work = t.clone();
        for (chain, _) in chains {
            if !work.chains.insert(chain.to_string()) {
                return Err(DirectError::Unsupported(format!("{chain} exists")).into());
            }
        }
        for (chain, rules) in chains {
            for rule in rules.iter() {
                let target_missing = super::diff::rule_target(rule)
                    .is_some_and(|t| t.starts_with("KUBE-") && !work.chains.contains(t));
                if !super::rule_parse::encodable(rule) || target_missing {
                    return Err(DirectError::Unsupported(format!("{chain}: {rule}")).into());
                }
                work.rules.push((chain.to_string(), rule.to_string()));
            }
        }
        *t = work;
        Ok(())
    }

    fn chain_exists(
        &mut self,
        family: IpFamily,
        table: TableName,
        chain: &str,
    ) -> Result<bool, IptablesError> {
        Ok(self
            .families
            .get(&family)
            .and_then(|s| s.table(table))
            .is_some_and(|t| t.chains.contains(chain)))
    }
}
