//! The only I/O of the nftables backend: nf_tables over netlink, behind a trait with a fake
//! twin.

use super::diff::{apply, Op, Transaction};
use super::elements::Elements;
use super::generations::{next_generation, Generations, TouchedKey, Touches};
use super::listing::{parse_table, ListingError};
use super::netlink::Reader;
use super::pacing::Pacer;
use super::skeleton::MAP_AFFINITY;
use super::tables::{family_name, Ruleset, Table, TABLE};
use super::wire::{CommitError, EncodeError};
use crate::backend::{BackendError, Subscribe, WaitForChange};
use crate::model::IpFamily;
use crate::netlink::NetlinkError;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

/// What can go wrong talking to nft.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("committing the transaction ({ops} operations) failed: {reason}")]
    Rejected { ops: usize, reason: String },
    #[error("nft list table {family} {TABLE} failed: {stderr}")]
    List {
        family: &'static str,
        stderr: String,
    },
    #[error(transparent)]
    Listing(#[from] ListingError),
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    #[error(transparent)]
    Encode(#[from] EncodeError),
    #[error("fake nft refused the transaction: {0}")]
    Fake(String),
    #[error("{family} table: {source} (the other family's table was programmed)")]
    Family {
        family: IpFamily,
        source: Box<NftError>,
    },
}

impl NftError {
    /// Whether the kernel has no nf_tables to talk to (EPROTONOSUPPORT, EOPNOTSUPP).
    pub fn no_nftables(&self) -> bool {
        let errno = match self {
            NftError::Netlink(NetlinkError::Kernel { errno, .. }) => Some(*errno),
            NftError::Netlink(NetlinkError::Socket { error, .. }) => error.raw_os_error(),
            _ => None,
        };
        matches!(errno, Some(93 | 95))
    }
}

impl From<CommitError> for NftError {
    fn from(e: CommitError) -> NftError {
        match e {
            CommitError::Encode(e) => NftError::Encode(e),
            CommitError::Netlink(e) => NftError::Netlink(e),
        }
    }
}

impl From<NftError> for BackendError {
    fn from(e: NftError) -> BackendError {
        let reason = match &e {
            NftError::Rejected { .. } | NftError::Family { .. } | NftError::Encode(_) => "rejected",
            NftError::Spawn { .. } => "spawn",
            _ => "read",
        };
        let (family, program) = match &e {
            NftError::Family { family, .. } => (Some(*family), None),
            NftError::Spawn { program, .. } => (None, Some(program.clone())),
            _ => (None, None),
        };
        let mut out = BackendError::new(reason, e);
        if let Some(f) = family {
            out = out.in_family(f).other_family_programmed();
        }
        if let Some(p) = program {
            out = out.program_not_run(&p);
        }
        out
    }
}

/// A read of the kernel for another thread: our tables, and the generation they were read
/// at when no commit overlapped the read.
pub type BackgroundRead = Box<dyn FnOnce() -> Result<(Ruleset, Option<u32>), NftError> + Send>;

/// For another thread: given the generation at which the kernel last held what we
/// committed, the elements of our sets someone else added or deleted since, whether they
/// added or deleted chains or rules of our table, and the last generation the change
/// listener saw; `None` when anything else may have changed.
pub type TouchedSince = Box<dyn FnOnce(u32) -> Option<Touches> + Send>;

/// Sets to read back without their elements.
pub type Unread = BTreeSet<(IpFamily, String)>;

/// Which sets to read back without their elements.
pub type Unreadable<'a> = &'a dyn Fn(IpFamily, &str) -> bool;

/// Reads and writes Switchyard's tables.
pub trait NftExecutor {
    /// Our tables as the kernel holds them; a family without a table is absent.
    fn read(&mut self) -> Result<Ruleset, NftError>;
    /// [`Self::read`], with the sets `unread` names declared but their elements not read
    /// ([`super::tables::Set::unread`]); an executor that cannot leave them out reads them.
    fn read_without(&mut self, _unread: Unreadable<'_>) -> Result<Ruleset, NftError> {
        self.read()
    }
    /// Commit a transaction atomically.
    fn apply(&mut self, tx: &Transaction) -> Result<(), NftError>;
    /// The kernel's ruleset generation. Every commit to nftables in the network namespace,
    /// by anyone and to any table, moves it on by exactly one (an aborted one does not), so
    /// it tells whether someone else committed between two of our commits. `None` when this
    /// executor cannot tell.
    fn generation(&mut self) -> Result<Option<u32>, NftError> {
        Ok(None)
    }
    /// Whether every generation after `from` up to `to` is known to have left our tables
    /// as they were: ours, or someone else's commit to other tables. False when this
    /// executor cannot tell.
    fn unchanged_between(&self, _from: u32, _to: u32) -> bool {
        false
    }
    /// A read of our tables (and the generation it saw, when no commit overlapped it),
    /// without the elements of the sets `unread` names, that can run on another thread,
    /// for the periodic check; `None` when this executor has none.
    fn background_read(&self, _unread: Unread) -> Option<BackgroundRead> {
        None
    }
    /// What the change listener saw others change in our tables since a generation
    /// ([`TouchedSince`]); `None` when this executor cannot tell.
    fn touched_since(&self) -> Option<TouchedSince> {
        None
    }
    /// A check looked up every element [`Self::touched_since`] named after `held` up to
    /// `to` (and read our chains and rules back, if it said those were touched) and found
    /// each as we committed it: those commits left our tables as they were.
    fn verified(&mut self, _held: u32, _to: u32) {}
    /// The elements of our set `set` in `family` with `keys`, looked up one by one rather
    /// than dumped ([`super::getelem::look_up_on`]).
    fn look_up(
        &mut self,
        family: IpFamily,
        set: &str,
        keys: &[&str],
    ) -> Result<super::getelem::Found, NftError>;
    /// The kernel's notifications of commits naming our table; `None` when this executor
    /// has none (a fake: its tests call the agent's handlers directly).
    fn change_notifications(&self) -> Option<Subscribe> {
        None
    }
    /// What the packet path remembered for sessionAffinity in `family`.
    fn remembered(&mut self, _family: IpFamily) -> Result<Elements, NftError> {
        Ok(Elements::default())
    }
    /// Forget remembered clients; one already expired is no error.
    fn forget(&mut self, _family: IpFamily, _keys: &[String]) -> Result<(), NftError> {
        Ok(())
    }
}

/// Transactions with more elements and rules than this are committed with our listener out
/// of the notification group: while anyone listens, the kernel builds a notification per
/// element a batch adds, which made a 10k x 10 load take seconds longer in the kernel
/// (perf: allocate_slab, __nlmsg_put). Smaller ones are announced to it, so that it sees
/// every generation (ours it knows by the socket's port, and they do not wake it).
const QUIET_ABOVE: usize = 1000;

/// The real executor: nf_tables over netlink, reads and writes alike; no `nft` process.
/// Commits, generation requests and the reads of the sync's own thread go through one
/// socket kept open (see [`crate::netlink::Batch::commit_on`]), in the network namespace of
/// the thread that used it first; the periodic check's background reads through another,
/// also kept. Closing an nfnetlink socket takes nf_tables' commit mutex while it waits for
/// the clean-up of earlier commits, so a socket closed after each read held our next
/// commit: at 10k x 10 with a check every second, the agent's loop was sampled waiting in
/// `nf_tables_valid_genid` while a worker thread closing its read's socket sat in
/// `nft_rcv_nl_event` / `__flush_work` (kernel stacks every 2 ms).
#[derive(Default)]
pub struct NftKernel {
    socket: Option<crate::netlink::Socket>,
    /// Our own change listener's membership, once it listens: it leaves the notification
    /// group while a large commit of ours runs ([`QUIET_ABOVE`]).
    listening: Arc<Mutex<Option<crate::netlink::Membership>>>,
    /// The generations the listener saw, and what each did to our tables.
    seen: Arc<Mutex<Generations>>,
    /// The background reads' socket, kept open between checks.
    background: Arc<Mutex<Option<crate::netlink::Socket>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl std::fmt::Debug for NftKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NftKernel::default()")
            .field("socket_open", &self.socket.is_some())
            .finish()
    }
}

impl NftKernel {
    /// The kept socket, opened first if need be.
    fn socket(&mut self) -> Result<&mut crate::netlink::Socket, NetlinkError> {
        if self.socket.is_none() {
            let socket =
                crate::netlink::Socket::open(crate::netlink::NETLINK_NETFILTER, "nfnetlink")?;
            lock(&self.seen).own_port(Some(socket.port()?));
            self.socket = Some(socket);
        }
        self.socket.as_mut().ok_or_else(|| NetlinkError::Malformed {
            op: "nfnetlink socket".into(),
            detail: "not open".into(),
        })
    }

    /// Commits `tx` on the kept socket, a large one with our listener out of the group
    /// meanwhile; an error drops the socket.
    fn commit(&mut self, tx: &Transaction) -> Result<(), CommitError> {
        let stats = tx.stats();
        let size = stats.elements_added + stats.elements_deleted + stats.rules_written;
        // A flush deletes as many elements as the set holds, each announced.
        let flushes = tx.ops.iter().any(|op| matches!(op, Op::FlushSet { .. }));
        let listener = lock(&self.listening)
            .clone()
            .filter(|_| flushes || size > QUIET_ABOVE);
        if listener.is_some() {
            // Until the next generation request, what the listener sees may lack its start.
            lock(&self.seen).leaving();
        }
        let left = listener.as_ref().is_some_and(|m| m.leave().is_ok());
        let result = match self.socket() {
            Ok(socket) => super::wire::commit_on(tx, socket),
            Err(e) => Err(e.into()),
        };
        if let (true, Some(m)) = (left, &listener) {
            if let Err(e) = m.join() {
                tracing::warn!("cannot listen to the kernel's change notifications again ({e}); changes by others are found by the periodic check only");
            }
        }
        if result.is_err() {
            self.drop_socket();
        }
        result
    }

    /// `read` on the kept socket; an error drops it.
    fn with_reader<T>(
        &mut self,
        read: impl FnOnce(&mut Reader) -> Result<T, NftError>,
    ) -> Result<T, NftError> {
        self.socket()?;
        let Some(socket) = self.socket.take() else {
            return Err(NftError::Netlink(NetlinkError::Malformed {
                op: "nfnetlink socket".into(),
                detail: "not open".into(),
            }));
        };
        let mut reader = Reader::on(socket);
        let result = read(&mut reader);
        match result {
            Ok(_) => self.socket = Some(reader.into_socket()),
            Err(_) => lock(&self.seen).own_port(None),
        }
        result
    }

    /// Closes the kept socket; the next request opens another, with another port.
    fn drop_socket(&mut self) {
        self.socket = None;
        lock(&self.seen).own_port(None);
    }

    /// Delete another program's table (kube-proxy's `kube-proxy` tables on a node moving to
    /// Switchyard); `Ok(false)` when there is none.
    pub fn delete_foreign_table(&mut self, family: IpFamily, name: &str) -> Result<bool, NftError> {
        let mut batch = crate::netlink::Batch::new();
        batch.push(
            crate::netlink::NFT_MSG_DELTABLE,
            0,
            crate::netlink::nfproto(family),
            |a| a.str(crate::netlink::NFTA_TABLE_NAME, name),
        );
        let what = format!("deleting table {} {name}", family_name(family));
        match batch.commit(&what, &|_| what.clone()) {
            Ok(()) => Ok(true),
            Err(NetlinkError::Kernel { errno: 2, .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

/// Our tables as `nft -j list table` shows them, `program` being nft: the slow, independent
/// reader the tests check the netlink reader and writer against. Never used in a sync.
pub fn read_with_nft(program: &str) -> Result<Ruleset, NftError> {
    let mut rs = Ruleset::default();
    for family in IpFamily::ALL {
        let fam = family_name(family);
        let out = crate::process::run(program, &["-j", "list", "table", fam, TABLE], None)
            .map_err(|source| NftError::Spawn {
                program: program.to_string(),
                source,
            })?;
        if !out.success {
            if out.stderr.contains("No such file or directory") {
                continue;
            }
            return Err(NftError::List {
                family: fam,
                stderr: out.stderr,
            });
        }
        rs.tables.insert(family, parse_table(&out.stdout)?);
    }
    Ok(rs)
}

/// Our tables as the kernel holds them, over nfnetlink, from the calling thread's network
/// namespace; usable from any thread. With the generation the read saw, when no commit
/// happened during it; `None` when one did: a dump of a set that changes meanwhile can miss
/// elements that never moved.
pub fn read_kernel() -> Result<(Ruleset, Option<u32>), NftError> {
    read_kernel_without(&|_, _| false)
}

/// [`read_kernel`], leaving out the elements of the sets `unread` names.
pub fn read_kernel_without(unread: Unreadable<'_>) -> Result<(Ruleset, Option<u32>), NftError> {
    read_on(&mut Reader::open()?, unread)
}

/// [`read_kernel_without`] with `reader`.
fn read_on(
    reader: &mut Reader,
    unread: Unreadable<'_>,
) -> Result<(Ruleset, Option<u32>), NftError> {
    let before = reader.generation()?;
    let mut rs = Ruleset::default();
    for family in IpFamily::ALL {
        let skip = |name: &str| unread(family, name);
        if let Some(t) = reader.table_without(family, &skip)? {
            rs.tables.insert(family, t);
        }
    }
    let after = reader.generation()?;
    Ok((rs, (before == after).then_some(after)))
}

impl NftExecutor for NftKernel {
    fn read(&mut self) -> Result<Ruleset, NftError> {
        self.read_without(&|_, _| false)
    }

    fn read_without(&mut self, unread: Unreadable<'_>) -> Result<Ruleset, NftError> {
        // Our syncs do not run concurrently with this read; see [`NftBackend`] for the
        // generation check that covers everyone else's commits.
        self.with_reader(|r| read_on(r, unread).map(|(rs, _)| rs))
    }

    fn generation(&mut self) -> Result<Option<u32>, NftError> {
        // On the kept socket: asked after every commit, and a socket closed then would
        // wait for that commit's clean-up.
        let result = super::netlink::generation_on(self.socket()?);
        match result {
            Ok(g) => lock(&self.seen).back_at(g),
            Err(_) => self.drop_socket(),
        }
        Ok(Some(result?))
    }

    fn unchanged_between(&self, from: u32, to: u32) -> bool {
        lock(&self.seen).unchanged_between(from, to)
    }

    fn touched_since(&self) -> Option<TouchedSince> {
        let seen = self.seen.clone();
        Some(Box::new(move |held| lock(&seen).touched_since(held)))
    }

    fn verified(&mut self, held: u32, to: u32) {
        lock(&self.seen).verified(held, to);
    }

    fn background_read(&self, unread: Unread) -> Option<BackgroundRead> {
        let kept = self.background.clone();
        let seen = self.seen.clone();
        Some(Box::new(move || {
            // Kept open from one check to the next, as the commit socket is: closing it
            // would hold our next commit (see `NftKernel`). One check reads at a time.
            let mut kept = lock(&kept);
            let reader = match kept.take() {
                Some(socket) => Reader::on(socket),
                None => Reader::open()?,
            };
            let mut reader = reader.paced(Pacer::new(seen));
            let read = read_on(&mut reader, &|f, name| {
                unread.contains(&(f, name.to_string()))
            })?;
            let waited = reader.waited();
            if !waited.is_zero() {
                tracing::debug!(
                    "periodic check: the read waited {waited:?} for other programs' commits to settle"
                );
            }
            *kept = Some(reader.into_socket());
            Ok(read)
        }))
    }

    fn look_up(
        &mut self,
        family: IpFamily,
        set: &str,
        keys: &[&str],
    ) -> Result<super::getelem::Found, NftError> {
        // On the kept socket, between our commits: what it finds is what they left.
        let result = super::getelem::look_up_on(self.socket()?, family, set, keys);
        if result.is_err() {
            self.drop_socket();
        }
        Ok(result?)
    }

    /// nf_tables' commit notifications (NFNLGRP_NFTABLES), only those naming our table.
    fn change_notifications(&self) -> Option<Subscribe> {
        let (listening, seen) = (self.listening.clone(), self.seen.clone());
        Some(Box::new(move || {
            let mut commits =
                super::commits::Commits::subscribe().map_err(|e| BackendError::new("read", e))?;
            // A batch announced while the listener joined shows only its end.
            lock(&seen).partly_seen_through(super::commits::generation_now());
            *lock(&listening) = Some(commits.membership());
            let wait: WaitForChange = Box::new(move || {
                commits
                    .wait(&seen)
                    .map(|_| ())
                    .map_err(|e| BackendError::new("read", e))
            });
            Ok(wait)
        }))
    }

    fn remembered(&mut self, family: IpFamily) -> Result<Elements, NftError> {
        self.with_reader(|r| Ok(r.elements(family, MAP_AFFINITY, false)?))
    }

    fn forget(&mut self, family: IpFamily, keys: &[String]) -> Result<(), NftError> {
        let mut delete = |keys: &[String]| {
            let tx = Transaction {
                ops: vec![Op::DeleteElements {
                    family,
                    set: MAP_AFFINITY.to_string(),
                    keys: keys.to_vec(),
                }],
            };
            self.commit(&tx).map_err(NftError::from)
        };
        if keys.is_empty() || delete(keys).is_ok() {
            return Ok(());
        }
        // One batch failed whole (an entry expired meanwhile): one entry at a time, where
        // one already gone is no error.
        for key in keys {
            match delete(std::slice::from_ref(key)) {
                Ok(()) | Err(NftError::Netlink(NetlinkError::Kernel { errno: 2, .. })) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn apply(&mut self, tx: &Transaction) -> Result<(), NftError> {
        self.commit(tx).map_err(|e| match e {
            CommitError::Encode(e) => NftError::Encode(e),
            CommitError::Netlink(e) => NftError::Rejected {
                ops: tx.ops.len(),
                reason: e.to_string(),
            },
        })
    }
}

/// An in-memory kernel: applies transactions atomically and remembers the last one.
#[derive(Debug, Clone, Default)]
pub struct FakeNft {
    pub state: Ruleset,
    pub last: Option<Transaction>,
    pub applied: usize,
    /// Refuse the next transaction, as nft would on a bad rule.
    pub fail_next: bool,
    /// Moves on with every commit, ours or [`FakeNft::foreign`].
    pub generation: u32,
    /// Refuse every transaction that touches this family (a family the kernel lacks).
    pub fail_family: Option<IpFamily>,
    /// The affinity map's entries, as the packet path would have filled them.
    pub remembered: BTreeMap<IpFamily, Elements>,
    /// What a change listener would have seen of every commit.
    pub seen: Generations,
    /// Right after our next commit, before we ask the generation, someone else commits to
    /// our table, and the listener has not seen it yet ([`FakeNft::catch_up`]).
    pub foreign_after_next_commit: bool,
    /// Generations committed that the listener has not seen yet.
    pub unseen: Vec<u32>,
    /// Keys looked up so far.
    pub looked_up: usize,
    /// Elements read back by background reads so far.
    pub elements_read: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl FakeNft {
    /// Someone else commits to our tables.
    pub fn foreign(&mut self, change: impl FnOnce(&mut Ruleset)) {
        change(&mut self.state);
        self.generation = next_generation(self.generation);
        self.seen.announced(u32::MAX, true);
        self.seen.committed(self.generation);
    }

    /// Someone else adds or deletes elements of our sets (`keys`, as the listener would
    /// read them from the notifications), and nothing else.
    pub fn foreign_elements(&mut self, keys: Vec<TouchedKey>, change: impl FnOnce(&mut Ruleset)) {
        change(&mut self.state);
        self.generation = next_generation(self.generation);
        self.seen.announced_elements(u32::MAX, keys);
        self.seen.committed(self.generation);
    }

    /// Someone else adds or deletes chains or rules of our table (and elements: `keys`), and
    /// nothing else.
    pub fn foreign_rules(&mut self, keys: Vec<TouchedKey>, change: impl FnOnce(&mut Ruleset)) {
        change(&mut self.state);
        self.generation = next_generation(self.generation);
        self.seen.announced_rules(u32::MAX);
        self.seen.announced_elements(u32::MAX, keys);
        self.seen.committed(self.generation);
    }

    /// Someone else commits to a table of their own.
    pub fn foreign_elsewhere(&mut self) {
        self.generation = next_generation(self.generation);
        self.seen.committed(self.generation);
    }

    /// The listener sees what it had not yet (someone else's commits to our table).
    pub fn catch_up(&mut self) {
        for g in std::mem::take(&mut self.unseen) {
            self.seen.announced(u32::MAX, true);
            self.seen.committed(g);
        }
    }
}

impl NftExecutor for FakeNft {
    fn read(&mut self) -> Result<Ruleset, NftError> {
        Ok(self.state.clone())
    }

    fn read_without(&mut self, unread: Unreadable<'_>) -> Result<Ruleset, NftError> {
        let mut rs = self.state.clone();
        for (family, t) in rs.tables.iter_mut() {
            for (_, s) in t.sets.iter_mut().filter(|(n, _)| unread(*family, n)) {
                s.elements = Elements::default();
                s.unread = true;
            }
        }
        Ok(rs)
    }

    fn apply(&mut self, tx: &Transaction) -> Result<(), NftError> {
        if std::mem::take(&mut self.fail_next) {
            return Err(NftError::Fake("injected failure".into()));
        }
        if let Some(f) = self.fail_family.filter(|f| tx.families().contains(f)) {
            return Err(NftError::Fake(format!("no {f} tables here")));
        }
        self.state = apply(&self.state, tx).map_err(|e| NftError::Fake(e.0))?;
        self.last = Some(tx.clone());
        self.applied += 1;
        self.generation = next_generation(self.generation);
        self.seen.committed(self.generation);
        if std::mem::take(&mut self.foreign_after_next_commit) {
            self.generation = next_generation(self.generation);
            self.unseen.push(self.generation);
        }
        Ok(())
    }

    fn generation(&mut self) -> Result<Option<u32>, NftError> {
        Ok(Some(self.generation))
    }

    fn unchanged_between(&self, from: u32, to: u32) -> bool {
        self.seen.unchanged_between(from, to)
    }

    fn touched_since(&self) -> Option<TouchedSince> {
        let seen = self.seen.clone();
        Some(Box::new(move |held| seen.touched_since(held)))
    }

    fn verified(&mut self, held: u32, to: u32) {
        self.seen.verified(held, to);
    }

    fn background_read(&self, unread: Unread) -> Option<BackgroundRead> {
        let mut fake = self.clone();
        let read = fake.read_without(&|f, name| unread.contains(&(f, name.to_string())));
        let generation = self.generation;
        let counted = self.elements_read.clone();
        Some(Box::new(move || {
            let read = read?;
            let n = read.tables.values().map(Table::element_count).sum();
            counted.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            Ok((read, Some(generation)))
        }))
    }

    fn look_up(
        &mut self,
        family: IpFamily,
        set: &str,
        keys: &[&str],
    ) -> Result<super::getelem::Found, NftError> {
        self.looked_up += keys.len();
        let elements = self
            .state
            .table(family)
            .and_then(|t| t.sets.get(set))
            .map(|s| &s.elements);
        Ok(keys
            .iter()
            .map(|k| elements.and_then(|e| e.get(k)).map(|v| v.map(|v| v.text())))
            .collect())
    }

    fn remembered(&mut self, family: IpFamily) -> Result<Elements, NftError> {
        Ok(self.remembered.get(&family).cloned().unwrap_or_default())
    }

    fn forget(&mut self, family: IpFamily, keys: &[String]) -> Result<(), NftError> {
        if let Some(entries) = self.remembered.get_mut(&family) {
            for k in keys {
                entries.remove(k);
            }
        }
        Ok(())
    }
}
