//! The periodic check's look at the sets too large to read back: each element we committed
//! is looked up in the kernel, a few hundred at a time between syncs.
//!
//! A dump of a set restarts its walk for every reply, so reading one back costs the kernel
//! time quadratic in its size (15 s of system time for a 1M-element map declared with a
//! size, measured with `nft list map`); lookups are linear. They run on the event loop,
//! between our commits, so the kernel they ask holds exactly what we committed unless
//! someone else changed it: nothing of ours is in flight to leave out.
//!
//! What lookups cannot see is an element someone added under a key we never committed. In
//! the sets this applies to, the backend maps (`front end . slot : endpoint`), no packet
//! reaches such an element: a front end's slots are numbered below its endpoint count, and
//! front ends come from the smaller maps, which the check reads whole.

use super::budget::Budget;
use super::getelem::Found;
use super::kernel::{NftError, Unread};
use super::tables::Ruleset;
use crate::model::IpFamily;
use std::time::{Duration, Instant};

/// Looks keys of a set up in the kernel ([`super::kernel::NftExecutor::look_up`]).
pub type LookUp<'a> = dyn FnMut(IpFamily, &str, &[&str]) -> Result<Found, NftError> + 'a;

/// Keys per call of the executor; the step checks its budget between calls.
const PER_CALL: usize = 128;

/// How far the lookups have come.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookups {
    sets: Vec<(IpFamily, String)>,
    /// The set being looked at (an index into `sets`), and the last key looked up in it.
    at: usize,
    after: Option<String>,
    /// Elements looked up, steps taken and the longest of them, for the log.
    pub looked_up: usize,
    pub steps: usize,
    pub longest: Duration,
}

/// What one step came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    More,
    /// Finished: the differences found (the lookups stop at the first call that finds any;
    /// a repair follows anyway).
    Done(Vec<String>),
}

impl Lookups {
    pub fn new(sets: Unread) -> Lookups {
        Lookups {
            sets: sets.into_iter().collect(),
            at: 0,
            after: None,
            looked_up: 0,
            steps: 0,
            longest: Duration::ZERO,
        }
    }

    /// Look elements of `committed` up with `look_up` until `budget` is spent or the sets
    /// are done.
    pub fn step(
        &mut self,
        committed: &Ruleset,
        budget: Duration,
        look_up: &mut LookUp<'_>,
    ) -> Result<Step, NftError> {
        let started = Instant::now();
        self.steps += 1;
        let step = self.look_until(committed, Budget::new(budget, started), look_up);
        self.longest = self.longest.max(started.elapsed());
        step
    }

    fn look_until(
        &mut self,
        committed: &Ruleset,
        mut budget: Budget,
        look_up: &mut LookUp<'_>,
    ) -> Result<Step, NftError> {
        loop {
            let Some((family, name)) = self.sets.get(self.at) else {
                return Ok(Step::Done(Vec::new()));
            };
            let ours: Vec<(String, Option<String>)> = committed
                .table(*family)
                .and_then(|t| t.sets.get(name))
                .map(|s| {
                    s.elements
                        .after(self.after.as_deref())
                        .take(PER_CALL)
                        .map(|(k, v)| (k.text(), v.map(|v| v.text())))
                        .collect()
                })
                .unwrap_or_default();
            if ours.is_empty() {
                self.at += 1;
                self.after = None;
                continue;
            }
            let keys: Vec<&str> = ours.iter().map(|(k, _)| k.as_str()).collect();
            let found = look_up(*family, name, &keys)?;
            self.looked_up += keys.len();
            let differences: Vec<String> = ours
                .iter()
                .enumerate()
                .filter_map(|(i, (key, value))| {
                    let theirs = found.get(i).cloned().flatten();
                    difference(*family, name, key, Some(value.as_deref()), theirs)
                })
                .collect();
            if !differences.is_empty() {
                return Ok(Step::Done(differences));
            }
            self.after = keys.last().map(|k| k.to_string());
            if !budget.another_fits() {
                return Ok(Step::More);
            }
        }
    }
}

/// How the kernel's element under `key` (`theirs`: its value, `None` when it has none)
/// differs from ours (`ours`: likewise), as a line for the log; `None` when it does not.
fn difference(
    family: IpFamily,
    set: &str,
    key: &str,
    ours: Option<Option<&str>>,
    theirs: Option<Option<String>>,
) -> Option<String> {
    let what = match (ours, theirs) {
        (Some(o), Some(t)) if o == t.as_deref() => return None,
        (None, None) => return None,
        (Some(_), Some(_)) => "changed",
        (Some(_), None) => "missing",
        (None, Some(_)) => "not ours",
    };
    Some(format!("{family} set {set}: element {key} {what}"))
}

/// Elements a read that overlapped commits found different, looked up again between our
/// commits: a dump of a set that changes meanwhile can miss elements that never moved, and
/// the same ones again in a second read (those at the edges of its replies), so reading
/// twice does not settle it; a lookup does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confirmation {
    /// Family, set and key, in that order.
    keys: Vec<(IpFamily, String, String)>,
    at: usize,
    confirmed: Vec<String>,
}

impl Confirmation {
    pub fn new(mut keys: Vec<(IpFamily, String, String)>) -> Confirmation {
        keys.sort();
        keys.dedup();
        Confirmation {
            keys,
            at: 0,
            confirmed: Vec::new(),
        }
    }

    /// Look the keys up until `budget` is spent; once all are, those whose element in the
    /// kernel still differs from `committed`.
    pub fn step(
        &mut self,
        committed: &Ruleset,
        budget: Duration,
        look_up: &mut LookUp<'_>,
    ) -> Result<Option<Vec<String>>, NftError> {
        let mut budget = Budget::starting(budget);
        while let Some((family, set, _)) = self.keys.get(self.at) {
            let (family, set) = (*family, set.clone());
            let batch: Vec<&str> = self.keys[self.at..]
                .iter()
                .take_while(|(f, s, _)| *f == family && *s == set)
                .take(PER_CALL)
                .map(|(_, _, k)| k.as_str())
                .collect();
            let found = look_up(family, &set, &batch)?;
            let ours = committed
                .table(family)
                .and_then(|t| t.sets.get(&set))
                .map(|s| &s.elements);
            for (i, key) in batch.iter().enumerate() {
                let ours = ours.and_then(|e| e.get(key)).map(|v| v.map(|v| v.text()));
                let theirs = found.get(i).cloned().flatten();
                let ours = ours.as_ref().map(|v| v.as_deref());
                self.confirmed
                    .extend(difference(family, &set, key, ours, theirs));
            }
            self.at += batch.len();
            if !budget.another_fits() {
                return Ok(None);
            }
        }
        Ok(Some(std::mem::take(&mut self.confirmed)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::elements::Elements;
    use crate::nft::tables::{Set, Table};

    fn ruleset(elements: Elements) -> Ruleset {
        let mut table = Table::default();
        table.sets.insert(
            "backends".into(),
            Set {
                map: true,
                elements,
                ..Set::default()
            },
        );
        let mut rs = Ruleset::default();
        rs.tables.insert(IpFamily::V4, table);
        rs
    }

    fn backends(rs: &mut Ruleset) -> &mut Elements {
        let table = rs.tables.get_mut(&IpFamily::V4).expect("an IPv4 table");
        &mut table.sets.get_mut("backends").expect("the map").elements
    }

    fn elements(n: usize) -> Elements {
        (0..n)
            .map(|i| {
                (
                    format!("10.96.0.1 . tcp . 80 . {i:04}"),
                    Some(format!("10.1.{}.1 . 80", i % 200)),
                )
            })
            .collect()
    }

    fn large() -> Unread {
        [(IpFamily::V4, "backends".to_string())].into()
    }

    /// Looks keys up in `kernel`, as the real one answers.
    fn kernel_of(
        kernel: &Ruleset,
    ) -> impl FnMut(IpFamily, &str, &[&str]) -> Result<Found, NftError> + '_ {
        move |family, set, keys| {
            let e = kernel
                .table(family)
                .and_then(|t| t.sets.get(set))
                .map(|s| &s.elements);
            Ok(keys.iter().map(|k| e.and_then(|e| e.text_of(k))).collect())
        }
    }

    #[test]
    fn every_element_is_looked_up_once_across_steps_and_a_kernel_that_holds_them_all_passes() {
        let ours = ruleset(elements(1000));
        let mut asked = Vec::new();
        let mut look = |family: IpFamily, set: &str, keys: &[&str]| -> Result<Found, NftError> {
            asked.extend(keys.iter().map(|k| k.to_string()));
            kernel_of(&ours)(family, set, keys)
        };
        let mut lookups = Lookups::new(large());
        let mut steps = 0;
        let found = loop {
            steps += 1;
            // No budget: one call per step.
            match lookups.step(&ours, Duration::ZERO, &mut look).unwrap() {
                Step::More => continue,
                Step::Done(d) => break d,
            }
        };
        assert!(found.is_empty(), "{found:?}");
        assert_eq!(steps, 1000usize.div_ceil(PER_CALL) + 1);
        let all: Vec<String> = ours.tables[&IpFamily::V4].sets["backends"]
            .elements
            .keys()
            .map(|k| k.text())
            .collect();
        assert_eq!(asked, all, "each key once, in order");
    }

    #[test]
    fn a_missing_or_changed_element_is_found_and_ends_the_lookups() {
        let ours = ruleset(elements(1000));
        for change in ["missing", "changed"] {
            let mut theirs = ours.clone();
            let set = backends(&mut theirs);
            let key = "10.96.0.1 . tcp . 80 . 0700";
            match change {
                "missing" => drop(set.remove(key)),
                _ => drop(set.insert(key, Some("10.9.9.9 . 80"))),
            }
            let mut lookups = Lookups::new(large());
            let mut look = kernel_of(&theirs);
            let found = loop {
                match lookups
                    .step(&ours, Duration::from_secs(5), &mut look)
                    .unwrap()
                {
                    Step::More => continue,
                    Step::Done(d) => break d,
                }
            };
            assert_eq!(
                found,
                [format!(
                    "{} set backends: element {key} {change}",
                    IpFamily::V4
                )]
            );
        }
    }

    #[test]
    fn a_set_no_longer_committed_is_skipped_and_an_error_is_passed_on() {
        let ours = ruleset(elements(10));
        let mut sets = large();
        sets.insert((IpFamily::V6, "backends".to_string()));
        let mut lookups = Lookups::new(sets);
        let mut look = kernel_of(&ours);
        assert_eq!(
            lookups
                .step(&ours, Duration::from_secs(5), &mut look)
                .unwrap(),
            Step::Done(vec![])
        );

        let mut failing = |_: IpFamily, _: &str, _: &[&str]| -> Result<Found, NftError> {
            Err(NftError::Fake("socket gone".into()))
        };
        let mut lookups = Lookups::new(large());
        assert!(lookups
            .step(&ours, Duration::from_secs(5), &mut failing)
            .is_err());
    }

    #[test]
    fn a_confirmation_keeps_only_the_differences_the_kernel_still_shows() {
        let ours = ruleset(elements(300));
        let mut theirs = ours.clone();
        let set = backends(&mut theirs);
        set.remove("10.96.0.1 . tcp . 80 . 0250");
        set.insert("10.96.0.9 . tcp . 80 . 0000", Some("10.9.9.9 . 80"));
        // What a read that overlapped commits claimed: two real, two artifacts of the dump.
        let suspects = [
            "10.96.0.1 . tcp . 80 . 0250",
            "10.96.0.9 . tcp . 80 . 0000",
            "10.96.0.1 . tcp . 80 . 0100",
            "10.96.0.1 . tcp . 80 . 0007",
        ]
        .map(|k| (IpFamily::V4, "backends".to_string(), k.to_string()))
        .to_vec();
        let mut confirmation = Confirmation::new(suspects);
        let mut look = kernel_of(&theirs);
        let found = loop {
            match confirmation.step(&ours, Duration::ZERO, &mut look).unwrap() {
                None => continue,
                Some(found) => break found,
            }
        };
        let v4 = IpFamily::V4;
        assert_eq!(
            found,
            [
                format!("{v4} set backends: element 10.96.0.1 . tcp . 80 . 0250 missing"),
                format!("{v4} set backends: element 10.96.0.9 . tcp . 80 . 0000 not ours"),
            ]
        );
    }
}
