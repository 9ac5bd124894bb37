//! What proves a member dead: the launcher's notice (`dead/<r>.<inc>`,
//! read at once), or, where silence may prove it, a heartbeat that stood
//! still for the probe's limit; and the heartbeat fallbacks the agreement
//! paces its looks with.

use std::collections::BTreeSet;
use std::ops::Range;
use std::time::{Duration, Instant};

use anyhow::Result;

use super::{Beats, Clock, Death, Membership, OPEN, Round, WAIT, process_name};
use crate::group::{BEAT, PROBE_EVERY};

impl Membership<'_> {
    /// Steps of phase `i` are about to run: the lowest active rank, which
    /// will most likely lead the agreement after them, reads the phase's
    /// heartbeats now (one request). Where no launcher's notice proves a
    /// death (torchrun), a rank masked in those steps was waited on for the
    /// fault timeout, so by the agreement its heartbeat has had the time to
    /// show whether it still beats: the leader then decides at once.
    pub fn steps_begin(&self, i: usize) -> Result<()> {
        let active = &self.members(i) - &self.phase_gone(i)?;
        let lowest = active.iter().next() == Some(&self.me);
        let snapshot = match lowest && !self.group.launcher {
            true => Some((
                Clock::start(self.group),
                self.group.heartbeats_of(&self.names(active, i))?,
            )),
            false => None,
        };
        self.state().steps_began = snapshot;
        Ok(())
    }

    /// Which of `ranks` (members of phase `i`) are proven dead now: the
    /// launcher noticed them, or (read at most every [`PROBE_EVERY`]) their
    /// heartbeat stood still for the probe's limit. What a process without
    /// kernels to time out masks (`--check-connection`).
    pub fn found_dead(&self, ranks: &[u32], i: usize) -> Result<BTreeSet<u32>> {
        let mut dead = self.noticed_among(ranks, i)?;
        let now = Instant::now();
        let due = self.state().next_silence_look.is_none_or(|t| now >= t);
        if due {
            self.state().next_silence_look = Some(now + PROBE_EVERY);
            let silent = self
                .group
                .silent_among(&self.names(ranks.iter().copied(), i))?;
            dead.extend(silent.into_iter().map(|r| r as u32));
        }
        Ok(dead)
    }

    /// Whether process `<r>.<inc>` is proven dead while the current phase
    /// begins: the launcher's notice (one request, every call), or, at
    /// most every [`PROBE_EVERY`] (`next_look`), a heartbeat silent for the
    /// probe's limit where silence proves it ([`Self::silence_proves`]).
    pub(super) fn proven_dead(&self, r: u32, inc: usize, next_look: &mut Instant) -> Result<bool> {
        if self.noticed(r, inc)? {
            return Ok(true);
        }
        let phase = self.state().phase;
        let starting = phase.is_some_and(|i| !self.silence_proves(inc, i, None));
        if starting || Instant::now() < *next_look {
            return Ok(false);
        }
        *next_look = Instant::now() + PROBE_EVERY;
        let name = [(r as usize, process_name(r, inc))];
        Ok(!self.group.silent_among(&name)?.is_empty())
    }

    /// Whether process `<r>.<inc>`, which we failed to reach, is dead: the
    /// launcher's notice, or its heartbeat silent for the probe's limit
    /// (where silence proves it: not for a process still starting under
    /// our launcher, see the module docs); looked for up to that limit and
    /// a second more (a live peer's failure is then ours to report).
    pub fn is_dead(&self, r: u32, inc: usize) -> Result<bool> {
        let until = Instant::now() + crate::group::SILENT_AFTER + Duration::from_secs(1);
        let mut next_look = Instant::now();
        while Instant::now() < until {
            if self.proven_dead(r, inc, &mut next_look)? {
                return Ok(true);
            }
            std::thread::sleep(WAIT);
        }
        Ok(false)
    }

    /// Whether the launcher noticed process `<r>.<inc>` die or stop.
    pub(super) fn noticed(&self, r: u32, inc: usize) -> Result<bool> {
        Ok(self.death(r, inc)?.is_some())
    }

    /// Whether a heartbeat silent for the probe's limit proves that a
    /// process started in phase `inc` died, judged in phase `i`'s round
    /// `step` (`None`: while the phase begins, before its rounds). Where no
    /// launcher watches, always: silence is the only evidence there. Under
    /// our launcher, not while the process is starting, that is in its
    /// first phase up to and including the phase's opening round: a
    /// starting process loads NIXL and UCX, creates its agent and makes its
    /// first connections, and on a loaded machine its heartbeat can stand
    /// still for longer than the limit while it is alive. That stall is its
    /// own, so our beats, which stretch the limit when the whole machine is
    /// slow, do not stretch with it (a joiner whose card came late, its
    /// heartbeat standing still meanwhile, was once agreed gone this way).
    /// The launcher sees a child die or stop at once and writes its notice,
    /// so a starting process that dies is still named at once.
    pub(super) fn silence_proves(&self, inc: usize, i: usize, step: Option<u64>) -> bool {
        !self.group.launcher || inc != i || step.is_some_and(|s| s != OPEN)
    }

    /// Those of `ranks` (members of phase `i`) whose silence may prove them
    /// dead in round `step` ([`Self::silence_proves`]), as the group names
    /// their processes.
    pub(super) fn judged_by_silence(
        &self,
        ranks: impl IntoIterator<Item = u32>,
        i: usize,
        step: u64,
    ) -> Vec<(usize, String)> {
        let judged = ranks
            .into_iter()
            .filter(|&r| self.silence_proves(self.inc(r, i), i, Some(step)));
        self.names(judged, i)
    }

    /// The launcher's notice of process `<r>.<inc>`'s death, if it wrote one.
    pub fn death(&self, r: u32, inc: usize) -> Result<Option<Death>> {
        self.group.try_get(&self.group.keys.death(r, inc))
    }

    /// When the launcher killed or saw the death of rank `r`'s process of
    /// phase `i` (unix ns), if it did and said so.
    pub fn died_at(&self, i: usize, r: u32) -> Result<Option<u64>> {
        Ok(self.death(r, self.inc(r, i))?.map(|d| d.at_ns))
    }

    /// Which of `ranks` (members of phase `i`) the launcher noticed dead:
    /// one request (its death counter) unless a death is new since the
    /// last look; nothing where no launcher watches (torchrun).
    pub(super) fn noticed_among(&self, ranks: &[u32], i: usize) -> Result<BTreeSet<u32>> {
        let g = self.group;
        if !g.launcher {
            return Ok(BTreeSet::new());
        }
        let deaths = g.add(&g.keys.deaths(), 0)?;
        let fresh = std::mem::replace(&mut self.state().deaths_seen, deaths) != deaths;
        if fresh {
            // A new notice: read those of every process of this phase and
            // the next (rare: once per death). The next phase's joiners run
            // already, and one that dies before it begins is a member whose
            // notice no later move of the counter would make us read.
            let mut found = BTreeSet::new();
            for p in self.processes_of(i..(i + 2).min(self.plan.len())) {
                if self.noticed(p.0, p.1)? {
                    found.insert(p);
                }
            }
            self.state().noticed.extend(found);
        }
        let st = self.state();
        Ok((ranks.iter().copied())
            .filter(|&r| st.noticed.contains(&(r, self.inc(r, i))))
            .collect())
    }

    /// The processes, as (rank, incarnation), that are members of the
    /// `phases`, not yet known to be noticed dead.
    pub(super) fn processes_of(&self, phases: Range<usize>) -> BTreeSet<(u32, usize)> {
        let st = self.state();
        (phases.flat_map(|j| self.plan.members(j).into_iter().map(move |r| (r, j))))
            .map(|(r, j)| (r, self.inc(r, j)))
            .filter(|p| !st.noticed.contains(p))
            .collect()
    }

    /// The cause of `err`, a failure to reach rank `r`'s process started
    /// in phase `inc`: its death if its heartbeat says so (see
    /// [`crate::group::Member::blame`]).
    pub fn blame(&self, r: u32, inc: usize, err: anyhow::Error) -> anyhow::Error {
        self.group.blame(r as usize, &process_name(r, inc), err)
    }
}

/// The heartbeat fallback's pace inside one wait: when it may look next,
/// and the heartbeats at its first look.
pub(super) struct Fallback {
    pub(super) next: Instant,
    pub(super) every: Duration,
    pub(super) before: Option<Beats>,
}

impl Fallback {
    pub(super) fn new(first_after: Duration) -> Self {
        Self {
            next: Instant::now() + first_after,
            every: PROBE_EVERY,
            before: None,
        }
    }

    /// Whether a look is due now (and if so, the next one is scheduled).
    pub(super) fn due(&mut self) -> bool {
        if Instant::now() < self.next {
            return false;
        }
        self.next = Instant::now() + self.every;
        true
    }
}

/// Without the launcher's notices: the windows of two beats over which a
/// masked rank's heartbeat must move to count as alive.
pub(super) struct Windows {
    pub(super) base: Beats,
    pub(super) window: Clock,
    pub(super) round: usize,
}

impl Windows {
    pub(super) fn start(el: &Membership, round: &Round, open: &BTreeSet<u32>) -> Result<Self> {
        let began = el.state().steps_began.take();
        let (base, window) = match began {
            Some(b) => (b.1, b.0),
            None if el.group.launcher => (Beats::new(), Clock::start(el.group)),
            None => (
                el.group
                    .heartbeats_of(&el.names(open.iter().copied(), round.i))?,
                Clock::start(el.group),
            ),
        };
        Ok(Self {
            base,
            window,
            round: round.i,
        })
    }

    /// Once the window passed: keeps in `open` the ranks whose heartbeat
    /// moved within it (alive, waited for), drops those still or whose key
    /// is gone (they left), and starts the next window.
    pub(super) fn judge(&mut self, el: &Membership, open: &mut BTreeSet<u32>) -> Result<()> {
        let g = el.group;
        if !self.window.passed(g, 2 * BEAT) {
            return Ok(());
        }
        let now = g.heartbeats_of(&el.names(open.iter().copied(), self.round))?;
        open.retain(|r| {
            let at = now.get(&(*r as usize));
            at.is_some() && at != self.base.get(&(*r as usize))
        });
        (self.base, self.window) = (now, Clock::start(g));
        Ok(())
    }
}
