//! Elastic plans: which ranks run in each phase, which join, leave or are
//! killed — upstream NIXL EP's plan files (`examples/device/ep/tests/elastic/
//! *.json`), read unchanged.
//!
//! A plan is a JSON list of phases, each a list of ranks:
//!
//! ```text
//! [[0,1],[0,1,2,3],[0,1,-2,3],[0,3]]
//! ```
//!
//! Phase 0 runs ranks 0 and 1; in phase 1 ranks 2 and 3 join; in phase 2
//! rank 2 is killed (`-2`: a member when the phase begins, killed during
//! it); at the end of phase 2 rank 1 leaves cleanly (it is absent from
//! phase 3), and phase 3 runs ranks 0 and 3. A rank id that comes back
//! after it was killed or left is a new process (a new *incarnation*: the
//! index of the phase that started it). `-0` is `0` in JSON, so rank 0
//! cannot be killed by a plan (a plan that writes `-0` is refused).
//!
//! The arithmetic, for phase `i` (`members` are absolute values):
//! - `killed(i)`: the negative entries; `survivors(i) = members(i) − killed(i)`;
//! - `joiners(i) = members(i) − survivors(i−1)` (phase 0: all its members);
//! - `leavers(i) = survivors(i) − members(i+1)` (the last phase: none; its
//!   survivors simply finish).
//!
//! Without `--plan`, `--ranks N` is the plan `[[0,…,N−1]]` ([`Plan::fixed`]):
//! one code path.

use std::collections::BTreeSet;
use std::ops::Range;
use std::path::Path;

use crate::cli::UsageError;

/// Most ranks a run may have (`--capacity`, the largest rank + 1): the
/// programs' device-side masks of ranks are one 64-bit word.
pub const MAX_CAPACITY: u32 = 64;

/// One phase: its members and those killed during it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Phase {
    /// Every rank of the phase, in the file's order (absolute values).
    pub members: Vec<u32>,
    /// The ranks written `-r`: members at the start, killed during the phase.
    pub killed: BTreeSet<u32>,
}

/// A validated plan: at least one phase, each non-empty, ranks below 64.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    phases: Vec<Phase>,
}

impl Plan {
    /// `[[0, …, n−1]]`: `n` ranks for one phase, nobody killed (`--ranks n`).
    pub fn fixed(n: u32) -> Self {
        Self {
            phases: vec![Phase {
                members: (0..n).collect(),
                killed: BTreeSet::new(),
            }],
        }
    }

    /// Reads and validates a plan file. Errors ([`UsageError`], exit 2) name
    /// the file and the reason: unreadable, not JSON (with line and column),
    /// not a list of lists of integers, or [`Plan::from_phases`]'s checks.
    pub fn load(path: &Path) -> Result<Self, UsageError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| UsageError(format!("--plan {}: cannot read it: {e}", path.display())))?;
        Self::parse(&text).map_err(|e| UsageError(format!("--plan {}: {}", path.display(), e.0)))
    }

    /// [`Plan::load`] from the file's text.
    pub fn parse(text: &str) -> Result<Self, UsageError> {
        if has_negative_zero(text) {
            return Err(UsageError(
                "-0 is 0 in JSON, so rank 0 cannot be killed by a plan: kill another rank".into(),
            ));
        }
        let raw: Vec<Vec<i64>> = serde_json::from_str(text).map_err(|e| {
            UsageError(format!(
                "not a plan (a JSON list of phases, each a list of ranks, e.g. [[0,1],[0,1,2,3],[0,1,-2,3],[0,3]]): \
                 {e}"
            ))
        })?;
        Self::from_phases(&raw)
    }

    /// A plan from its phases as written (`-r`: killed during the phase).
    /// Errors: no phase; an empty phase; a rank of 64 or more; a rank twice
    /// in one phase; a kill of a rank not running when the phase began (not
    /// a survivor of the phase before; in phase 0 every member runs); a
    /// phase whose every member is killed (it leaves no rank).
    pub fn from_phases(raw: &[Vec<i64>]) -> Result<Self, UsageError> {
        if raw.is_empty() {
            return Err(UsageError(
                "the plan has no phase: write at least one, e.g. [[0,1]]".into(),
            ));
        }
        let mut phases: Vec<Phase> = Vec::with_capacity(raw.len());
        for (i, entries) in raw.iter().enumerate() {
            let phase = parse_phase(i, entries)?;
            check_kills(i, &phase, phases.last())?;
            phases.push(phase);
        }
        Ok(Self { phases })
    }

    /// A kill/rejoin loop of `cycles` cycles over `ranks` ranks (at least
    /// 2): phase 0 runs them all; then each cycle kills one rank (1, 2, …,
    /// ranks−1 in turn, never rank 0) in one phase and starts it again in
    /// the next, so the plan has `2·cycles + 1` phases and every phase
    /// after the first either loses or regains a rank.
    pub fn kill_loop(ranks: u32, cycles: u32) -> Self {
        assert!(
            (2..=MAX_CAPACITY).contains(&ranks),
            "a kill loop needs 2..=64 ranks"
        );
        let all: Vec<i64> = (0..i64::from(ranks)).collect();
        let mut raw = vec![all.clone()];
        for c in 0..cycles {
            let victim = 1 + i64::from(c % (ranks - 1));
            raw.push(
                all.iter()
                    .map(|&r| if r == victim { -r } else { r })
                    .collect(),
            );
            raw.push(all.clone());
        }
        Self::from_phases(&raw).expect("a kill loop is a valid plan")
    }

    /// The plan as upstream's JSON (`[[0,1],[0,-1]]`).
    pub fn to_json(&self) -> String {
        let phases: Vec<Vec<i64>> = (self.phases.iter())
            .map(|p| {
                (p.members.iter())
                    .map(|&r| {
                        if p.killed.contains(&r) {
                            -i64::from(r)
                        } else {
                            i64::from(r)
                        }
                    })
                    .collect()
            })
            .collect();
        serde_json::to_string(&phases).expect("integers serialize")
    }

    /// How many phases.
    pub fn len(&self) -> usize {
        self.phases.len()
    }

    /// Never true: a plan has at least one phase.
    pub fn is_empty(&self) -> bool {
        self.phases.is_empty()
    }

    /// Phase `i`.
    pub fn phase(&self, i: usize) -> &Phase {
        &self.phases[i]
    }

    /// The ranks of phase `i` (killed ones included), ascending.
    pub fn members(&self, i: usize) -> BTreeSet<u32> {
        self.phases[i].members.iter().copied().collect()
    }

    /// The ranks killed during phase `i`.
    pub fn killed(&self, i: usize) -> BTreeSet<u32> {
        self.phases[i].killed.clone()
    }

    /// The members of phase `i` that are not killed during it.
    pub fn survivors(&self, i: usize) -> BTreeSet<u32> {
        &self.members(i) - &self.phases[i].killed
    }

    /// The ranks started for phase `i`: members not surviving phase `i−1`.
    pub fn joiners(&self, i: usize) -> BTreeSet<u32> {
        match i {
            0 => self.members(0),
            _ => &self.members(i) - &self.survivors(i - 1),
        }
    }

    /// The survivors of phase `i` that are not members of phase `i+1`:
    /// they leave cleanly at its end. The last phase has none.
    pub fn leavers(&self, i: usize) -> BTreeSet<u32> {
        match i + 1 < self.len() {
            true => &self.survivors(i) - &self.members(i + 1),
            false => BTreeSet::new(),
        }
    }

    /// The incarnation of `rank` in phase `i`: the phase that started the
    /// process holding that id then; `None` when it is not a member.
    pub fn incarnation(&self, rank: u32, i: usize) -> Option<usize> {
        if !self.members(i).contains(&rank) {
            return None;
        }
        (0..=i).rev().find(|&j| self.joiners(j).contains(&rank))
    }

    /// The phases of the process that holds `rank` from phase `incarnation`
    /// on: from there while it survives and stays a member. Empty when
    /// `rank` does not join in that phase.
    pub fn life(&self, rank: u32, incarnation: usize) -> Range<usize> {
        if incarnation >= self.len() || !self.joiners(incarnation).contains(&rank) {
            return incarnation..incarnation;
        }
        let mut end = incarnation;
        while end + 1 < self.len()
            && self.survivors(end).contains(&rank)
            && self.members(end + 1).contains(&rank)
        {
            end += 1;
        }
        incarnation..end + 1
    }

    /// Every process of the plan, as (rank, incarnation), by incarnation
    /// then rank.
    pub fn processes(&self) -> Vec<(u32, usize)> {
        (0..self.len())
            .flat_map(|i| self.joiners(i).into_iter().map(move |r| (r, i)))
            .collect()
    }

    /// The largest rank any phase names.
    pub fn largest_rank(&self) -> u32 {
        (self.phases.iter())
            .flat_map(|p| p.members.iter().copied())
            .max()
            .unwrap_or(0)
    }

    /// The most members any phase has.
    pub fn largest_phase(&self) -> usize {
        self.phases
            .iter()
            .map(|p| p.members.len())
            .max()
            .unwrap_or(0)
    }

    /// `--capacity`'s default: the largest rank + 1.
    pub fn default_capacity(&self) -> u32 {
        self.largest_rank() + 1
    }

    /// `--capacity` checked against the plan: 1..=64 and above every rank
    /// it names; `None` gives [`Plan::default_capacity`].
    pub fn capacity(&self, given: Option<u32>) -> Result<u32, UsageError> {
        let need = self.default_capacity();
        match given {
            None => Ok(need),
            Some(c) if !(1..=MAX_CAPACITY).contains(&c) => Err(UsageError(format!(
                "--capacity {c}: between 1 and {MAX_CAPACITY} ranks are supported"
            ))),
            Some(c) if c < need => Err(UsageError(format!(
                "--capacity {c} but the plan names rank {}: the capacity must be at least {need} (the largest rank + 1)",
                need - 1
            ))),
            Some(c) => Ok(c),
        }
    }
}

/// Phase `i`'s entries as a [`Phase`]: non-empty, ranks 0..64, none twice.
fn parse_phase(i: usize, entries: &[i64]) -> Result<Phase, UsageError> {
    if entries.is_empty() {
        return Err(UsageError(format!(
            "phase {i} is empty: every phase needs at least one rank"
        )));
    }
    let mut phase = Phase {
        members: Vec::with_capacity(entries.len()),
        killed: BTreeSet::new(),
    };
    for &e in entries {
        let r = e.unsigned_abs();
        if r >= u64::from(MAX_CAPACITY) {
            return Err(UsageError(format!(
                "phase {i} names rank {r}: ranks 0..{} are supported (at most {MAX_CAPACITY} ranks)",
                MAX_CAPACITY - 1
            )));
        }
        let r = r as u32;
        if phase.members.contains(&r) {
            return Err(UsageError(format!(
                "phase {i} names rank {r} twice: each rank once per phase (-{r} to kill it)"
            )));
        }
        phase.members.push(r);
        if e < 0 {
            phase.killed.insert(r);
        }
    }
    Ok(phase)
}

/// A kill in phase `i` must hit a rank running when the phase began (a
/// survivor of the phase before), and some rank must survive the phase.
fn check_kills(i: usize, phase: &Phase, before: Option<&Phase>) -> Result<(), UsageError> {
    if let Some(prev) = before {
        let running: BTreeSet<u32> = (prev.members.iter())
            .filter(|r| !prev.killed.contains(r))
            .copied()
            .collect();
        if let Some(r) = phase.killed.iter().find(|r| !running.contains(r)) {
            return Err(UsageError(format!(
                "phase {i} kills rank {r}, which was not running when the phase began (it is not a survivor of \
                 phase {}): a rank is started in one phase and killed in a later one",
                i - 1
            )));
        }
    }
    if phase.killed.len() == phase.members.len() {
        return Err(UsageError(format!(
            "phase {i} kills every member: it leaves no rank"
        )));
    }
    Ok(())
}

/// Whether the text writes `-0` as a number (JSON reads it as 0).
fn has_negative_zero(text: &str) -> bool {
    let b = text.as_bytes();
    (0..b.len().saturating_sub(1)).any(|k| {
        b[k] == b'-'
            && b[k + 1] == b'0'
            && !b
                .get(k + 2)
                .is_some_and(|c| c.is_ascii_digit() || *c == b'.')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(v: &[u32]) -> BTreeSet<u32> {
        v.iter().copied().collect()
    }

    fn plan(text: &str) -> Plan {
        Plan::parse(text).unwrap()
    }

    fn err(text: &str) -> String {
        Plan::parse(text).unwrap_err().0
    }

    #[test]
    fn expansion_fault_contraction_arithmetic() {
        let p = plan("[[0,1],[0,1,2,3],[0,1,-2,3],[0,3]]");
        assert_eq!(p.len(), 4);
        assert_eq!(p.members(2), set(&[0, 1, 2, 3]));
        assert_eq!(p.killed(2), set(&[2]));
        assert_eq!(p.survivors(2), set(&[0, 1, 3]));
        assert_eq!(p.joiners(0), set(&[0, 1]));
        assert_eq!(p.joiners(1), set(&[2, 3]));
        assert_eq!(p.joiners(2), set(&[]));
        assert_eq!(p.joiners(3), set(&[]));
        assert_eq!(p.leavers(1), set(&[]));
        assert_eq!(p.leavers(2), set(&[1]));
        assert_eq!(p.leavers(3), set(&[]));
        assert_eq!(p.life(0, 0), 0..4);
        assert_eq!(p.life(1, 0), 0..3);
        assert_eq!(p.life(2, 1), 1..3);
        assert_eq!(p.life(3, 1), 1..4);
        assert_eq!(p.life(2, 0), 0..0, "rank 2 does not start in phase 0");
        assert_eq!(p.incarnation(2, 2), Some(1));
        assert_eq!(p.incarnation(2, 3), None);
        assert_eq!(p.largest_phase(), 4);
        assert_eq!(p.default_capacity(), 4);
        assert_eq!(p.processes(), vec![(0, 0), (1, 0), (2, 1), (3, 1)]);
        assert_eq!(p.to_json(), "[[0,1],[0,1,2,3],[0,1,-2,3],[0,3]]");
    }

    #[test]
    fn a_rank_id_comes_back_as_a_new_incarnation() {
        let p = plan("[[0,1,2],[0,1,-2],[0,1,2]]");
        assert_eq!(p.joiners(2), set(&[2]));
        assert_eq!(p.life(2, 0), 0..2);
        assert_eq!(p.life(2, 2), 2..3);
        assert_eq!(p.incarnation(2, 1), Some(0));
        assert_eq!(p.incarnation(2, 2), Some(2));
        // Upstream's expansion_contraction: 5 leaves, 6 is killed, both return.
        let p = plan("[[0,1,2,3],[0,1,2,3,4,5,6,7],[0,1,2,3,4,-6,7],[0,1,2,3,4,5,6,7]]");
        assert_eq!(p.leavers(1), set(&[5]));
        assert_eq!(p.joiners(3), set(&[5, 6]));
        assert_eq!(p.life(5, 1), 1..2);
        assert_eq!(p.life(6, 1), 1..3);
        assert_eq!(p.processes().len(), 10);
    }

    #[test]
    fn fixed_and_capacity() {
        let p = Plan::fixed(3);
        assert_eq!(p.to_json(), "[[0,1,2]]");
        assert_eq!(p.life(2, 0), 0..1);
        assert_eq!(p.capacity(None).unwrap(), 3);
        assert_eq!(p.capacity(Some(8)).unwrap(), 8);
        assert!(p.capacity(Some(2)).unwrap_err().0.contains("at least 3"));
        assert!(
            p.capacity(Some(65))
                .unwrap_err()
                .0
                .contains("between 1 and 64")
        );
        assert!(
            p.capacity(Some(0))
                .unwrap_err()
                .0
                .contains("between 1 and 64")
        );
    }

    #[test]
    fn bad_plans_are_refused_with_the_reason() {
        for (text, needle) in [
            ("[[0,1]", "not a plan"),
            ("{\"a\":1}", "not a plan"),
            ("[[0,1.5]]", "not a plan"),
            ("[]", "no phase"),
            ("[[0,1],[]]", "phase 1 is empty"),
            ("[[0,64]]", "names rank 64"),
            ("[[0,-70]]", "names rank 70"),
            ("[[0,1,1]]", "rank 1 twice"),
            ("[[0,1,-1]]", "rank 1 twice"),
            ("[[0,1],[0,1,-2]]", "kills rank 2, which was not running"),
            ("[[0,-1],[0,-1]]", "kills rank 1, which was not running"),
            ("[[-1]]", "leaves no rank"),
            ("[[0,1],[-0,1]]", "rank 0 cannot be killed"),
        ] {
            let e = err(text);
            assert!(e.contains(needle), "{text}: {e}");
        }
        // -0 inside a larger number is not -0.
        assert!(!has_negative_zero("[[0,-10]]") && has_negative_zero("[[-0]]"));
    }

    #[test]
    fn a_missing_file_is_named() {
        let e = Plan::load(Path::new("/nonexistent/plan.json"))
            .unwrap_err()
            .0;
        assert!(
            e.contains("/nonexistent/plan.json") && e.contains("cannot read"),
            "{e}"
        );
    }

    #[test]
    fn the_kill_loop_kills_and_restarts_in_turn() {
        let p = Plan::kill_loop(4, 20);
        assert_eq!(p.len(), 41);
        for c in 0..20usize {
            let victim = 1 + (c as u32 % 3);
            assert_eq!(p.killed(1 + 2 * c), set(&[victim]));
            assert_eq!(p.joiners(2 + 2 * c), set(&[victim]));
        }
        assert_eq!(p.life(0, 0), 0..41);
        assert_eq!(p.processes().len(), 24);
    }

    #[test]
    fn upstreams_plan_files_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/elastic");
        for (name, phases, capacity) in [
            ("no_expansion", 1, 4),
            ("single_expansion", 2, 8),
            ("expansion_contraction", 4, 8),
            ("expansion_fault_contraction", 4, 4),
        ] {
            let p = Plan::load(&dir.join(format!("{name}.json"))).unwrap();
            assert_eq!(
                (p.len(), p.default_capacity()),
                (phases, capacity),
                "{name}"
            );
        }
    }
}
