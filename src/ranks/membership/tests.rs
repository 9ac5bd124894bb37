use super::*;
use crate::deadline::{Pace, poll};
use crate::group::{Bytes, Value};
use crate::ranks::env::RankEnv;
use crate::store::Store;
use crate::store::memory::MemoryStore;

const PROGRAM: crate::ranks::Program = crate::ranks::Program {
    name: "test",
    namespace: "nixl_test",
};

/// Rank `r` of `world` under torchrun (no launcher's notices: the
/// heartbeats tell), rank 0 hosting the store.
fn env(r: u32, world: u32) -> RankEnv {
    let vars = [
        ("RANK", r.to_string()),
        ("WORLD_SIZE", world.to_string()),
        ("MASTER_PORT", "1".to_string()),
    ];
    RankEnv::from_vars(PROGRAM, |k| {
        vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
    })
    .unwrap()
    .unwrap()
}

/// Every rank of phase 0 of `plan` on a thread: begin, connected, one
/// agreement with `masked(r)`, then — once every rank has its decision
/// or its dismissal, so that no survivor's cleanup runs ahead of a rank
/// still reading — `rest`; their results in rank order. Rank `absent`
/// dies once connected, before agreeing: it never beats (it runs
/// outside [`Member::run`](crate::group::Member::run)) and leaves its
/// keys behind.
fn phase0<T: Send>(
    store: &MemoryStore,
    plan: &Plan,
    on_death: OnDeath,
    absent: Option<u32>,
    masked: impl Fn(u32) -> BTreeSet<u32> + Sync,
    rest: impl Fn(&Membership, Decision) -> Result<T> + Sync,
) -> Vec<Result<T>> {
    let world = plan.default_capacity();
    let agreed = std::sync::atomic::AtomicUsize::new(0);
    let n = plan.members(0).len();
    std::thread::scope(|s| {
        let runs: Vec<_> = (plan.members(0).into_iter())
            .map(|r| {
                let (masked, rest, agreed) = (&masked, &rest, &agreed);
                s.spawn(move || {
                    let g = Group::new(store, &env(r, world), Duration::from_secs(30));
                    let live = || {
                        let e = Membership::new(&g, plan, 0, Duration::from_secs(2), on_death)?;
                        let new = e.begin_phase(0, &Bytes(vec![r as u8]), || Ok(()))?;
                        assert_eq!(new.peers.len(), plan.members(0).len() - 1);
                        assert!(new.peers.iter().all(|p| p.payload.0 == [p.rank as u8]));
                        e.opened(0, &new.gone)?;
                        if absent == Some(r) {
                            agreed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            bail!("absent");
                        }
                        let d = e.agree(0, 0, &masked(r));
                        agreed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let d = d?;
                        while agreed.load(std::sync::atomic::Ordering::SeqCst) < n {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        rest(&e, d)
                    };
                    // The absent rank dies: no heartbeat, no cleanup.
                    match absent == Some(r) {
                        true => live(),
                        false => g.run(live),
                    }
                })
            })
            .collect();
        runs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Ends phase 0 and returns the step's decision (`phase0`'s `rest`).
fn end_phase(e: &Membership, d: Decision) -> Result<Decision> {
    e.end_phase(0)?;
    Ok(d)
}

const SURVIVE: OnDeath = OnDeath::Survive;

/// Rank `who` masked rank `whom`; the others masked nobody.
fn masks(who: u32, whom: u32) -> impl Fn(u32) -> BTreeSet<u32> + Sync {
    move |r| match r == who {
        true => BTreeSet::from([whom]),
        false => BTreeSet::new(),
    }
}

#[test]
fn a_quiet_phase_agrees_on_nobody_and_leaves_no_key() {
    let store = MemoryStore::new(Duration::from_secs(30));
    let plan = Plan::fixed(3);
    let out = phase0(&store, &plan, SURVIVE, None, |_| BTreeSet::new(), end_phase);
    for d in &out {
        let d = d.as_ref().unwrap();
        assert!(d.gone.is_empty() && d.new.is_empty());
        assert_eq!((d.leader, d.reports, d.survivors), (0, 3, 3));
    }
    assert_eq!(store.keys(), Vec::<String>::new(), "keys left behind");
}

/// Rank 2 (killed by the plan) ends after connecting; rank 1 masked
/// it, so the union has it, and no report comes: it is gone.
#[test]
fn a_masked_rank_that_never_reports_is_in_every_survivors_decision() {
    let store = MemoryStore::new(Duration::from_secs(30));
    let plan = Plan::parse("[[0,1,-2]]").unwrap();
    let out = phase0(&store, &plan, SURVIVE, Some(2), masks(1, 2), end_phase);
    for d in &out[..2] {
        let d = d.as_ref().unwrap();
        assert_eq!(d.gone, BTreeSet::from([2]));
        assert!(d.forgiven.is_empty());
        assert_eq!((d.leader, d.reports, d.survivors), (0, 2, 2));
    }
}

/// Rank 0 masked rank 1 (it was late, say, having waited on a dead
/// rank itself), but rank 1 reports: alive, so not gone; every rank
/// learns it was forgiven, and the phase ends normally.
#[test]
fn a_masked_rank_that_reports_is_forgiven() {
    let store = MemoryStore::new(Duration::from_secs(30));
    let plan = Plan::fixed(3);
    let out = phase0(&store, &plan, SURVIVE, None, masks(0, 1), end_phase);
    for d in &out {
        let d = d.as_ref().unwrap();
        assert!(d.gone.is_empty(), "{d:?}");
        assert_eq!(d.forgiven, BTreeSet::from([1]));
        assert_eq!((d.reports, d.survivors), (3, 3));
    }
    assert_eq!(store.keys(), Vec::<String>::new(), "keys left behind");
}

/// A member that dies is agreed gone and the survivors end the phase
/// without it (the membership knows no plan); where deaths fail the
/// run, every survivor fails naming it.
#[test]
fn a_death_is_survived_or_named() {
    for on_death in [OnDeath::Survive, OnDeath::Fail] {
        let store = MemoryStore::new(Duration::from_secs(30));
        let plan = Plan::fixed(3);
        let out = phase0(&store, &plan, on_death, Some(1), masks(0, 1), |e, d| {
            assert_eq!(d.gone, BTreeSet::from([1]));
            e.end_phase(0)
        });
        for r in [0, 2] {
            match (on_death, &out[r]) {
                (OnDeath::Survive, Ok(end)) => assert_eq!(end.survivors, 2),
                (OnDeath::Fail, Err(e)) => {
                    assert!(
                        format!("{e:#}").contains("rank 1 stopped responding in phase 0"),
                        "{e:#}"
                    )
                }
                (_, other) => panic!("{on_death:?}: rank {r}: {other:?}"),
            }
        }
    }
}

/// Connecting ahead (plan `[[0,1],[0,1,2]]`): while the members step
/// phase 0, rank 2's payload is missing until it publishes, then ready;
/// rank 2, waiting for phase 0 to end, finds both members' payloads
/// ready (phase 0 goes on until it has); at phase 1's begin each gets
/// what it connected to ahead.
#[test]
fn peers_are_ready_ahead_of_the_phase_that_brings_them() {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let store = MemoryStore::new(Duration::from_secs(30));
    let plan = Plan::parse("[[0,1],[0,1,2]]").unwrap();
    let (publishing, saw_both) = (AtomicBool::new(false), AtomicBool::new(false));
    let nobody = |_: u32, _: usize| false;
    let member = |r: u32| -> Result<Vec<u32>> {
        let g = Group::new(&store, &env(r, 3), Duration::from_secs(30));
        g.run(|| {
            let e = Membership::new(&g, &plan, 0, Duration::from_secs(2), SURVIVE)?;
            let new = e.begin_phase(0, &Bytes(vec![r as u8]), || Ok(()))?;
            e.opened(0, &new.gone)?;
            let early = e.ready_peers::<Bytes>(1, nobody)?;
            assert!(publishing.load(SeqCst) || early.peers.is_empty());
            let pace = Pace::Every(Duration::from_millis(1));
            let ready = poll(
                Duration::from_secs(20),
                pace,
                || {
                    let ready = e.ready_peers::<Bytes>(1, nobody)?;
                    Ok(ready.missing.is_empty().then_some(ready))
                },
                |_| anyhow!("rank 2 never published"),
            )?;
            assert_eq!((ready.peers[0].rank, ready.peers[0].incarnation), (2, 1));
            assert!(
                e.ready_peers::<Bytes>(1, |r, i| (r, i) == (2, 1))?
                    .peers
                    .is_empty()
            );
            e.agree(0, 0, &BTreeSet::new())?;
            while !saw_both.load(SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
            e.end_phase(0)?;
            let new = e.begin_phase(1, &Bytes(vec![r as u8]), || Ok(()))?;
            e.opened(1, &new.gone)?;
            e.end_phase(1)?;
            Ok(new.peers.iter().map(|p| p.rank).collect())
        })
    };
    let joiner = || -> Result<Vec<u32>> {
        let env = RankEnv {
            incarnation: 1,
            ..env(2, 3)
        };
        let g = Group::new(&store, &env, Duration::from_secs(30));
        g.run(|| {
            let e = Membership::new(&g, &plan, 1, Duration::from_secs(2), SURVIVE)?;
            let mut seen = BTreeSet::new();
            // Set before the payload goes out: while unset, none is there.
            publishing.store(true, SeqCst);
            let new = e.begin_phase(1, &Bytes(vec![2]), || {
                let ready = e.ready_peers::<Bytes>(1, nobody)?;
                seen.extend(ready.peers.iter().map(|p| p.rank));
                saw_both.store(seen.len() == 2, SeqCst);
                Ok(())
            })?;
            assert_eq!(new.peers.len(), 2);
            e.opened(1, &new.gone)?;
            e.end_phase(1)?;
            Ok(seen.into_iter().collect())
        })
    };
    let got: Vec<Vec<u32>> = std::thread::scope(|s| {
        let runs = [
            s.spawn(|| member(0)),
            s.spawn(|| member(1)),
            s.spawn(joiner),
        ];
        runs.map(|h| h.join().unwrap().unwrap()).into()
    });
    assert_eq!(got, [vec![2], vec![2], vec![0, 1]]);
}

/// Rank `r` of `world` started by our launcher (which hosts the store
/// and writes death notices).
fn launched(r: u32, world: u32) -> RankEnv {
    RankEnv {
        incarnation: 0,
        launcher_store: true,
        ..env(r, world)
    }
}

/// A joiner that dies before its phase begins (plan `[[0,1],[0,1,2]]`):
/// its notice moves the death counter while the members step phase 0,
/// and phase 1's opening round still finds it. The joiner's heartbeat
/// goes on (it never reports), so only the notice can prove it gone:
/// missed, the round would wait until the run's timeout and fail.
#[test]
fn a_joiner_that_dies_before_its_phase_is_found_by_its_notice() {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    // A hang guard, not a timing assumption: the flags come in ms.
    let until = |flag: &AtomicBool| {
        let t0 = Instant::now();
        while !flag.load(SeqCst) && t0.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(1));
        }
        flag.load(SeqCst)
    };
    let store = MemoryStore::new(Duration::from_secs(30));
    let plan = Plan::parse("[[0,1],[0,1,2]]").unwrap();
    let keys = crate::ranks::keys::Keys::new(launched(0, 3).key_prefix());
    let (published, released) = (AtomicBool::new(false), AtomicBool::new(false));
    let member = |r: u32| -> Result<Decision> {
        let g = Group::new(&store, &launched(r, 3), Duration::from_secs(30));
        g.run(|| {
            let e = Membership::new(&g, &plan, 0, Duration::from_secs(2), SURVIVE)?;
            let new = e.begin_phase(0, &Bytes(vec![r as u8]), || Ok(()))?;
            e.opened(0, &new.gone)?;
            if r == 0 {
                // The launcher's notice of the joiner, written now.
                anyhow::ensure!(until(&published), "the joiner never published");
                let death = Death {
                    how: "SIGKILL".into(),
                    at_ns: unix_ns(),
                    planned: false,
                };
                store.set(keys.death(2, 1).key(), &death.encode())?;
                store.add(&keys.deaths(), 1)?;
                anyhow::ensure!(e.found_dead(&[1], 0)?.is_empty(), "rank 1 found dead");
            }
            e.agree(0, 0, &BTreeSet::new())?;
            e.end_phase(0)?;
            let new = e.begin_phase(1, &Bytes(vec![r as u8]), || Ok(()))?;
            let d = e.opened(1, &new.gone)?;
            e.end_phase(1)?;
            Ok(d)
        })
    };
    let joiner = || -> Result<()> {
        let env = RankEnv {
            incarnation: 1,
            ..launched(2, 3)
        };
        let g = Group::new(&store, &env, Duration::from_secs(30));
        // Beats, publishes its card, then stops answering: no report.
        g.with_heartbeat(|| {
            let e = Membership::new(&g, &plan, 1, Duration::from_secs(2), SURVIVE)?;
            e.begin_phase(1, &Bytes(vec![2]), || {
                published.store(true, SeqCst);
                Ok(())
            })?;
            until(&released);
            Ok(())
        })
    };
    let decided: Vec<Decision> = std::thread::scope(|s| {
        let j = s.spawn(joiner);
        let m = [s.spawn(|| member(0)), s.spawn(|| member(1))];
        // Released whatever the members' results, so that a failure
        // fails the test rather than hanging it.
        let out = m.map(|h| h.join().unwrap());
        released.store(true, SeqCst);
        // The joiner plays a process the launcher declared dead: whether
        // its own begin still finds the members' cards depends on whether
        // they had finished (and deleted them) first. What is tested is
        // the members' decision, so its result is not.
        let _ = j.join().unwrap();
        out.map(|d| d.unwrap()).into()
    });
    for d in decided {
        assert_eq!(d.gone, BTreeSet::from([2]), "{d:?}");
    }
}

/// A joiner whose heartbeat stands still while it starts (it beat
/// once, then loaded its libraries and created its agent on a loaded
/// machine) is not agreed gone by its silence under our launcher: the
/// members wait for its card and connect to it (plan
/// `[[0,1],[0,1,2]]`). Its card comes only once the members have waited
/// past the probe's limit, by the wall clock and by their own beats
/// (their heartbeat counters in the store); where silence judged a
/// starting process too, they found it gone before it came.
#[test]
fn a_starting_joiner_whose_heartbeat_stands_still_is_waited_for() {
    use crate::group::{SILENT_AFTER, SILENT_BEATS};
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let store = MemoryStore::new(Duration::from_secs(30));
    let plan = Plan::parse("[[0,1],[0,1,2]]").unwrap();
    let prefix = launched(0, 3).key_prefix();
    let waiting = [AtomicBool::new(false), AtomicBool::new(false)];
    let member = |r: u32| -> Result<Newcomers<Bytes>> {
        let g = Group::new(&store, &launched(r, 3), Duration::from_secs(30));
        g.run(|| {
            let e = Membership::new(&g, &plan, 0, Duration::from_secs(2), SURVIVE)?;
            let new = e.begin_phase(0, &Bytes(vec![r as u8]), || Ok(()))?;
            e.opened(0, &new.gone)?;
            e.end_phase(0)?;
            waiting[r as usize].store(true, SeqCst);
            let new = e.begin_phase(1, &Bytes(vec![r as u8]), || Ok(()))?;
            e.opened(1, &new.gone)?;
            e.end_phase(1)?;
            Ok(new)
        })
    };
    let beats = || -> Vec<i64> {
        (0..2)
            .map(|r| store.add(&format!("{prefix}alive/{r}.0"), 0).unwrap())
            .collect()
    };
    let joiner = || -> Result<()> {
        // It beat once, and then stood still while it started.
        store.add(&format!("{prefix}alive/2.1"), 1)?;
        let t0 = Instant::now();
        let hang_guard = |what: &str| {
            anyhow::ensure!(t0.elapsed() < Duration::from_secs(60), "{what}");
            std::thread::sleep(Duration::from_millis(10));
            Ok(())
        };
        while !waiting.iter().all(|w| w.load(SeqCst)) {
            hang_guard("phase 0 never ended")?;
        }
        let (since, before) = (Instant::now(), beats());
        let limit = SILENT_BEATS as i64 + 2;
        while since.elapsed() < SILENT_AFTER + Duration::from_secs(1)
            || beats().iter().zip(&before).any(|(now, b)| now - b < limit)
        {
            hang_guard("the members stopped beating")?;
        }
        let env = RankEnv {
            incarnation: 1,
            ..launched(2, 3)
        };
        let g = Group::new(&store, &env, Duration::from_secs(30));
        g.run(|| {
            let e = Membership::new(&g, &plan, 1, Duration::from_secs(2), SURVIVE)?;
            let new = e.begin_phase(1, &Bytes(vec![2]), || Ok(()))?;
            e.opened(1, &new.gone)?;
            e.end_phase(1).map(drop)
        })
    };
    let (members, joined) = std::thread::scope(|s| {
        let j = s.spawn(joiner);
        let m = [s.spawn(|| member(0)), s.spawn(|| member(1))];
        (m.map(|h| h.join().unwrap()), j.join().unwrap())
    });
    joined.unwrap();
    for new in members {
        let new = new.unwrap();
        assert!(new.gone.is_empty(), "{new:?}");
        assert_eq!(new.peers.iter().map(|p| p.rank).collect::<Vec<_>>(), [2]);
    }
}

/// How a rank's process ends in a drawn trial: `None` lives; else it dies
/// at that step, before or after reporting it.
type Fate = Option<(u64, bool)>;

/// What a rank decided at a step: the step and the ranks gone then.
type StepGone = (u64, BTreeSet<u32>);

/// One drawn trial: `world` ranks step `steps` times, each reporting
/// late by a drawn 0-2 ms and masking the ranks it finds dead; the
/// doomed die at their step, before or after their report (heartbeat
/// stopped, keys left), and a launcher thread writes each death's
/// notice 0-3 ms later. Returns every rank's decisions (step, gone),
/// the phase's end as step `END`.
fn trial(world: u32, steps: u64, fates: &[Fate], seed: u64) -> Vec<Result<Vec<StepGone>>> {
    let store = MemoryStore::new(Duration::from_secs(30));
    let plan = Plan::fixed(world);
    let keys = crate::ranks::keys::Keys::new(launched(0, world).key_prefix());
    let (tx, rx) = std::sync::mpsc::channel::<u32>();
    std::thread::scope(|s| {
        let (store, keys) = (&store, &keys);
        s.spawn(move || {
            let mut rng = crate::rng::SplitMix64::new(seed ^ 0xdead);
            for r in rx {
                std::thread::sleep(Duration::from_micros(rng.next_u64() % 3000));
                let death = Death {
                    how: "SIGKILL".into(),
                    at_ns: unix_ns(),
                    planned: false,
                };
                store.set(keys.death(r, 0).key(), &death.encode()).unwrap();
                store.add(&keys.deaths(), 1).unwrap();
            }
        });
        let runs: Vec<_> = (0..world)
            .map(|r| {
                let (tx, plan) = (tx.clone(), &plan);
                s.spawn(move || {
                    let g = Group::new(store, &launched(r, world), Duration::from_secs(30));
                    let fate = fates[r as usize];
                    let mut rng = crate::rng::SplitMix64::new(seed ^ u64::from(r));
                    let body = || steps_of(&g, plan, steps, fate, &tx, &mut rng);
                    match fate {
                        // Dies: its heartbeat stops, its keys stay.
                        Some(_) => g.with_heartbeat(body),
                        None => g.run(body),
                    }
                })
            })
            .collect();
        drop(tx);
        runs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// One rank of [`trial`]: its decisions until it dies or the phase ends.
fn steps_of(
    g: &Group,
    plan: &Plan,
    steps: u64,
    fate: Fate,
    dead: &std::sync::mpsc::Sender<u32>,
    rng: &mut crate::rng::SplitMix64,
) -> Result<Vec<(u64, BTreeSet<u32>)>> {
    let e = Membership::new(g, plan, 0, Duration::from_secs(2), OnDeath::Survive)?;
    let new = e.begin_phase(0, &Bytes(vec![g.rank as u8]), || Ok(()))?;
    e.opened(0, &new.gone)?;
    let (mut seen, mut masked) = (Vec::new(), BTreeSet::new());
    for k in 0..steps {
        if fate == Some((k, false)) {
            dead.send(g.rank).unwrap();
            return Ok(seen);
        }
        std::thread::sleep(Duration::from_micros(rng.next_u64() % 2000));
        let others: Vec<u32> = e.active(0).into_iter().filter(|&r| r != g.rank).collect();
        masked.extend(e.found_dead(&others, 0)?);
        let d = e.agree(0, k, &masked)?;
        masked.retain(|r| d.gone.contains(r));
        seen.push((k, d.gone));
        if fate == Some((k, true)) {
            dead.send(g.rank).unwrap();
            return Ok(seen);
        }
    }
    seen.push((END, e.end_phase(0)?.gone));
    Ok(seen)
}

/// Drawn trials (seeds printed on failure): 3-6 ranks, any of them
/// doomed but one, rank 0 included, each at a drawn step, before or after
/// its report, with late reports. Every survivor decides the same set
/// after every step, no rank that lives is ever in it, and the phase's
/// end names every death.
#[test]
fn drawn_deaths_and_late_reports_leave_every_survivor_with_one_set() {
    let (mut deaths, mut rank0) = (0, false);
    for seed in 1..=12u64 {
        let mut rng = crate::rng::SplitMix64::new(seed);
        let world = 3 + (rng.next_u64() % 4) as u32;
        let steps = 3 + rng.next_u64() % 5;
        let mut fates: Vec<Fate> = vec![None; world as usize];
        let doomed = rng.next_u64() % u64::from(world);
        for _ in 0..doomed {
            let r = (rng.next_u64() % u64::from(world)) as usize;
            fates[r] = Some((rng.next_u64() % steps, rng.next_u64() % 2 == 0));
        }
        if fates.iter().all(Option::is_some) {
            fates[0] = None;
        }
        let case = format!("seed {seed}: {world} ranks, {steps} steps, fates {fates:?}");
        let out = trial(world, steps, &fates, seed);
        let dead: BTreeSet<u32> = (0..world)
            .filter(|&r| fates[r as usize].is_some())
            .collect();
        let lived: Vec<&Vec<(u64, BTreeSet<u32>)>> = (0..world as usize)
            .filter(|&r| fates[r].is_none())
            .map(|r| {
                out[r]
                    .as_ref()
                    .unwrap_or_else(|e| panic!("{case}: rank {r}: {e:#}"))
            })
            .collect();
        for seen in &lived {
            assert_eq!(*seen, lived[0], "{case}: the survivors decided differently");
            for (_, gone) in seen.iter() {
                assert!(
                    gone.is_subset(&dead),
                    "{case}: a rank that lives was declared gone: {gone:?}"
                );
            }
            assert_eq!(
                seen.last().unwrap(),
                &(END, dead.clone()),
                "{case}: the end names every death"
            );
        }
        deaths += dead.len();
        rank0 |= dead.contains(&0);
    }
    // The draws are fixed: they must hold deaths, rank 0's among them.
    assert!(
        deaths >= 12 && rank0,
        "{deaths} deaths drawn, rank 0's: {rank0}"
    );
}
