//! The fuzzing engine shared by `tests/fuzz.rs` and `dataplane/tests/fuzz_iptables_save.rs`
//! (each includes this file as a module), on proptest and the stable toolchain: how many
//! cases a target runs (`SWITCHYARD_FUZZ_CASES`) and from which seed (`SWITCHYARD_FUZZ_SEED`),
//! the seed corpora under `tests/fuzz/corpus/<target>/`, structure-aware mutations of those
//! seeds (byte flips, truncations, splices, inserted tokens, repeats, deep nesting), plain
//! random bytes and text, and a bound on one case's time, so that a hang fails the test
//! with its input instead of hanging it.
#![allow(dead_code)]

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::{select, Index};
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestError, TestRunner};
use std::fmt;
use std::path::Path;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// Cases per target; the default keeps every target together well under a minute in a
/// debug build on two cores.
pub const CASES_ENV: &str = "SWITCHYARD_FUZZ_CASES";
pub const DEFAULT_CASES: u32 = 256;
/// The random seed (a u64); random when unset, printed either way so a run can be replayed.
pub const SEED_ENV: &str = "SWITCHYARD_FUZZ_SEED";
/// No generated input is longer.
pub const MAX_INPUT: usize = 64 * 1024;
/// One case taking longer than this is taken for a hang: the test stops with its input.
pub const CASE_LIMIT: Duration = Duration::from_secs(30);

/// The number of cases each target runs.
pub fn cases() -> u32 {
    match std::env::var(CASES_ENV) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{CASES_ENV}={v:?} is not a number of cases")),
        Err(_) => DEFAULT_CASES,
    }
}

fn seed() -> u64 {
    match std::env::var(SEED_ENV) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{SEED_ENV}={v:?} is not a u64")),
        Err(_) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            t.as_secs()
                ^ u64::from(t.subsec_nanos()).rotate_left(32)
                ^ u64::from(std::process::id())
        }
    }
}

/// An input, printed as a byte-string literal that a regression test can take as it is.
#[derive(Clone, PartialEq, Eq)]
pub struct Bytes(pub Vec<u8>);

impl Bytes {
    /// The input as text, invalid UTF-8 replaced, for the parsers that take `&str`.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0).into_owned()
    }
}

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "b\"{}\" ({} bytes)", self.0.escape_ascii(), self.0.len())
    }
}

/// Every file of `<root>/<target>/` (hidden ones aside), sorted by name.
pub fn corpus(root: &Path, target: &str) -> Vec<Vec<u8>> {
    let dir = root.join(target);
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| {
            p.is_file()
                && !p
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with('.'))
        })
        .collect();
    paths.sort();
    let seeds: Vec<Vec<u8>> = paths
        .iter()
        .map(|p| std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .collect();
    assert!(!seeds.is_empty(), "{}: no seed inputs", dir.display());
    seeds
}

/// Bytes worth inserting into any input: control and format characters, a byte-order
/// mark, invalid UTF-8 (the parsers that take text see it replaced), numbers past every
/// integer type, and quoting.
pub const GENERIC: &[&[u8]] = &[
    b"\0",
    b"\xef\xbb\xbf",
    b"\r\n",
    b"\r",
    b"\n",
    b"\t",
    b" ",
    b"\x7f",
    b"\x1b",
    b"\xff",
    b"\xc3",
    b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80",
    "\u{2028}".as_bytes(),
    "\u{202e}".as_bytes(),
    "\u{fffd}".as_bytes(),
    "é".as_bytes(),
    b"99999999999999999999999999999999999999",
    b"-9223372036854775809",
    b"18446744073709551616",
    b"4294967296",
    b"2147483648",
    b"65536",
    b"-1",
    b"-0",
    b"0",
    b"1e999",
    b"-1e-999",
    b"0x1f",
    b"NaN",
    b"\"",
    b"'",
    b"\\",
    b"%00",
    b"%ff",
];

/// What one mutation does to an input.
#[derive(Debug, Clone)]
enum Mutation {
    FlipBit(Index, u8),
    SetByte(Index, u8),
    Truncate(Index),
    Delete(Index, u16),
    Insert(Index, Vec<u8>),
    /// A piece of another seed, copied in.
    Splice {
        at: Index,
        seed: Index,
        from: Index,
        len: u16,
    },
    /// A piece of the input repeated: long strings and many lines.
    Repeat {
        at: Index,
        len: u8,
        times: u16,
    },
    /// `depth` opening tokens then as many closing ones.
    Nest {
        at: Index,
        pair: (&'static str, &'static str),
        depth: u16,
    },
}

fn mutation(
    dict: &'static [&'static str],
    nests: &'static [(&'static str, &'static str)],
) -> BoxedStrategy<Mutation> {
    let token = token(dict);
    let mut choices: Vec<(u32, BoxedStrategy<Mutation>)> = vec![
        (
            3,
            (any::<Index>(), 0u8..8)
                .prop_map(|(i, b)| Mutation::FlipBit(i, b))
                .boxed(),
        ),
        (
            2,
            (any::<Index>(), any::<u8>())
                .prop_map(|(i, b)| Mutation::SetByte(i, b))
                .boxed(),
        ),
        (1, any::<Index>().prop_map(Mutation::Truncate).boxed()),
        (
            2,
            (any::<Index>(), 1u16..64)
                .prop_map(|(i, n)| Mutation::Delete(i, n))
                .boxed(),
        ),
        (
            6,
            (any::<Index>(), token)
                .prop_map(|(i, t)| Mutation::Insert(i, t))
                .boxed(),
        ),
        (
            2,
            (any::<Index>(), any::<Index>(), any::<Index>(), 1u16..512)
                .prop_map(|(at, seed, from, len)| Mutation::Splice {
                    at,
                    seed,
                    from,
                    len,
                })
                .boxed(),
        ),
        (
            1,
            (any::<Index>(), 1u8..32, 2u16..4096)
                .prop_map(|(at, len, times)| Mutation::Repeat { at, len, times })
                .boxed(),
        ),
    ];
    if !nests.is_empty() {
        choices.push((
            1,
            (any::<Index>(), select(nests), 1u16..2048)
                .prop_map(|(at, pair, depth)| Mutation::Nest { at, pair, depth })
                .boxed(),
        ));
    }
    proptest::strategy::Union::new_weighted(choices).boxed()
}

/// One token: from the target's dictionary, the generic one, or a few random bytes.
fn token(dict: &'static [&'static str]) -> BoxedStrategy<Vec<u8>> {
    let own: Vec<Vec<u8>> = dict.iter().map(|t| t.as_bytes().to_vec()).collect();
    let generic: Vec<Vec<u8>> = GENERIC.iter().map(|t| t.to_vec()).collect();
    let mut choices: Vec<(u32, BoxedStrategy<Vec<u8>>)> = vec![
        (3, select(generic).boxed()),
        (1, vec(any::<u8>(), 1..16).boxed()),
    ];
    if !own.is_empty() {
        choices.push((6, select(own).boxed()));
    }
    proptest::strategy::Union::new_weighted(choices).boxed()
}

fn apply(input: &mut Vec<u8>, m: &Mutation, seeds: &[Vec<u8>]) {
    let at = |i: &Index, input: &Vec<u8>| i.index(input.len() + 1);
    match m {
        Mutation::FlipBit(i, b) if !input.is_empty() => {
            let i = i.index(input.len());
            input[i] ^= 1 << b;
        }
        Mutation::SetByte(i, v) if !input.is_empty() => {
            let i = i.index(input.len());
            input[i] = *v;
        }
        Mutation::FlipBit(..) | Mutation::SetByte(..) => {}
        Mutation::Truncate(i) => input.truncate(at(i, input)),
        Mutation::Delete(i, n) => {
            let start = at(i, input);
            let end = (start + usize::from(*n)).min(input.len());
            input.drain(start..end);
        }
        Mutation::Insert(i, t) => {
            let i = at(i, input);
            input.splice(i..i, t.iter().copied());
        }
        Mutation::Splice {
            at: i,
            seed,
            from,
            len,
        } => {
            let other = &seeds[seed.index(seeds.len())];
            let start = from.index(other.len() + 1);
            let end = (start + usize::from(*len)).min(other.len());
            let i = at(i, input);
            input.splice(i..i, other[start..end].iter().copied());
        }
        Mutation::Repeat { at: i, len, times } => {
            let start = at(i, input);
            let end = (start + usize::from(*len)).min(input.len());
            let piece = input[start..end].to_vec();
            let n = usize::from(*times).min(MAX_INPUT / piece.len().max(1));
            let repeated = piece.repeat(n);
            input.splice(start..start, repeated);
        }
        Mutation::Nest {
            at: i,
            pair: (open, close),
            depth,
        } => {
            let depth = usize::from(*depth);
            let mut nested = open.repeat(depth).into_bytes();
            nested.extend(close.repeat(depth).into_bytes());
            let i = at(i, input);
            input.splice(i..i, nested);
        }
    }
    input.truncate(MAX_INPUT);
}

/// Inputs for a target: mostly seeds from `seeds` with up to eight mutations (none: the
/// seed as it is), and some soups of the dictionary's tokens, random bytes and random text.
/// `nests` are the (open, close) pairs that nest in the target's language.
pub fn inputs(
    seeds: Vec<Vec<u8>>,
    dict: &'static [&'static str],
    nests: &'static [(&'static str, &'static str)],
) -> BoxedStrategy<Bytes> {
    let seeds = Arc::new(seeds);
    let mutated = {
        let seeds = seeds.clone();
        (any::<Index>(), vec(mutation(dict, nests), 0..8)).prop_map(move |(seed, ms)| {
            let mut input = seeds[seed.index(seeds.len())].clone();
            for m in &ms {
                apply(&mut input, m, &seeds);
            }
            Bytes(input)
        })
    };
    let soup = vec(token(dict), 0..96).prop_map(|ts| {
        let mut input = ts.concat();
        input.truncate(MAX_INPUT);
        Bytes(input)
    });
    let random = vec(any::<u8>(), 0..2048).prop_map(Bytes);
    let text = vec(any::<char>(), 0..512)
        .prop_map(|cs| Bytes(cs.into_iter().collect::<String>().into_bytes()));
    prop_oneof![
        12 => mutated,
        4 => soup,
        1 => random,
        1 => text,
    ]
    .boxed()
}

/// What a check says of one case: `Err` with the reason when the property does not hold.
pub type Verdict = Result<(), String>;

/// Run `check` on `cases()` inputs from `strategy`, each on its own thread (2 MiB of stack,
/// as a tokio worker has) within [`CASE_LIMIT`]. A failing or panicking case is shrunk and
/// the test fails with the smallest input found; a case past the limit stops the test at
/// once with its input. Before each case the input is written to
/// `<tmp>/fuzz-<target>.last`, so a case that kills the process (a stack overflow) can be
/// found there. Prints the case count, the seed and the time taken.
pub fn fuzz<T, S>(
    target: &'static str,
    tmp: &Path,
    strategy: S,
    check: impl Fn(T) -> Verdict + Send + Sync + 'static,
) where
    S: Strategy<Value = T>,
    T: Clone + fmt::Debug + Send + 'static,
{
    let cases = cases();
    let seed = seed();
    let config = Config {
        cases,
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(seed),
        max_shrink_iters: 2048,
        max_shrink_time: 60_000,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let check = Arc::new(check);
    let last = tmp.join(format!("fuzz-{target}.last"));
    // (cases run, the slowest one's time and input)
    let stats = Mutex::new((0u64, Duration::ZERO, String::new()));
    let start = Instant::now();
    let result = runner.run(&strategy, |input| {
        let _ = std::fs::write(&last, format!("{input:?}\n"));
        let (tx, rx) = mpsc::channel();
        let (c, i) = (check.clone(), input.clone());
        let began = Instant::now();
        std::thread::Builder::new()
            .name(target.to_string())
            .stack_size(2 << 20)
            .spawn(move || {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| c(i)));
                let _ = tx.send(r);
            })
            .map_err(|e| TestCaseError::fail(format!("cannot start a thread: {e}")))?;
        let outcome = rx.recv_timeout(CASE_LIMIT);
        let took = began.elapsed();
        {
            let mut s = stats.lock().unwrap_or_else(|p| p.into_inner());
            s.0 += 1;
            if took > s.1 {
                s.1 = took;
                s.2 = format!("{input:?}").chars().take(160).collect();
            }
        }
        match outcome {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(why))) => Err(TestCaseError::fail(why)),
            Ok(Err(panic)) => Err(TestCaseError::fail(format!(
                "panicked: {}",
                panic_message(panic.as_ref())
            ))),
            Err(_) => {
                eprintln!(
                    "fuzz {target}: a case ran past {CASE_LIMIT:?} (a hang?); seed {seed}; input: {input:?}"
                );
                std::process::exit(1);
            }
        }
    });
    let (ran, slowest, slowest_input) = stats.into_inner().unwrap_or_else(|p| p.into_inner());
    println!(
        "fuzz {target}: {ran} cases in {:.1?}, {CASES_ENV}={cases}, {SEED_ENV}={seed}; slowest {slowest:.1?}: {slowest_input}",
        start.elapsed()
    );
    match result {
        Ok(()) => {}
        Err(TestError::Fail(why, input)) => panic!(
            "fuzz {target}: {why}\nsmallest failing input: {input:?}\nreplay: {SEED_ENV}={seed} {CASES_ENV}={cases}"
        ),
        Err(TestError::Abort(why)) => panic!("fuzz {target}: aborted: {why}"),
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(not a string)".into())
}
