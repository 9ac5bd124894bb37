//! What rank 0 decides and reports, from the ranks' published numbers: the
//! plan (one grid for all ranks, whether the NCCL baseline runs), the rows
//! (slowest rank per iteration, bandwidth two ways, ratio to NCCL), the
//! ratios, the files, and the words for a wrong value.

use nixl_examples::ep::config::{Grid, Mode, Path, RoutingKind, RunConfig, Shape};
use nixl_examples::ep::kernels::{BAD_COMBINED, BAD_CONTRIBUTION, BAD_COUNT, BAD_X, EpVerify};
use nixl_examples::ep::layout::PhaseBytes;
use nixl_examples::ep::model::Model;
use nixl_examples::ep::nccl::{NcclStatus, NcclTimes};
use nixl_examples::ep::report::{self, PathTimes, RankInfo, RankResult};
use nixl_examples::ep::setup::make_setup;
use nixl_examples::ep::steps::describe;

fn cfg(mode: Mode, ranks: u32) -> RunConfig {
    RunConfig {
        mode,
        shape: Shape {
            tokens: 32,
            hidden: 64,
            topk: 4,
            experts: 16,
            ranks,
        },
        routing: RoutingKind::Uniform,
        paths: vec![Path::Put, Path::Store],
        iters: 4,
        warmup: 1,
        seed: 1,
        timeout_ns: 1_000_000_000,
        fault_timeout_ns: nixl_examples::ep::config::DEFAULT_FAULT_TIMEOUT_NS,
        blocks: None,
        baseline: true,
        combine_senders: None,
        graph: false,
        on_death: nixl_examples::ranks::membership::OnDeath::Fail,
    }
}

fn info(rank: u32, gpu: &str, nccl: bool) -> RankInfo {
    RankInfo {
        rank,
        host: "h".into(),
        pid: 1,
        gpu_ordinal: 0,
        gpu_name: "H200".into(),
        gpu_uuid: gpu.into(),
        sm_count: 132,
        blocks_per_sm: 2,
        ranks_on_gpu: 1,
        mps: false,
        nccl: if nccl {
            NcclStatus::Ready("2.27.7".into())
        } else {
            NcclStatus::Unavailable("no libnccl".into())
        },
    }
}

#[test]
fn the_plan_gives_every_rank_its_share_of_the_sms_and_decides_the_baseline() {
    let c = cfg(Mode::Ht, 2);
    let p = make_setup(&c, &[info(0, "a", true), info(1, "b", true)]).unwrap();
    assert_eq!(
        (p.blocks, p.max_ranks_on_gpu, p.baseline_skip.clone()),
        (132, 1, None)
    );

    let shared = [
        info(0, "a", true),
        info(1, "b", true),
        info(2, "a", true),
        info(3, "b", true),
    ];
    let p = make_setup(&cfg(Mode::Ht, 4), &shared).unwrap();
    assert_eq!(p.blocks, 66);
    assert!(p.baseline_skip.unwrap().contains("share a GPU"));

    let p = make_setup(&c, &[info(0, "a", true), info(1, "b", false)]).unwrap();
    assert!(p.baseline_skip.unwrap().contains("rank 1: no libnccl"));

    let mut big = c.clone();
    big.blocks = Some(1000);
    let err = make_setup(&big, &[info(0, "a", true), info(1, "b", true)])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--blocks 1000") && err.contains("264"),
        "{err}"
    );
}

#[test]
fn the_plan_refuses_ranks_that_count_a_shared_gpu_their_uuids_deny() {
    // Both ranks count two ranks on their GPU (they would release at GPU
    // scope), but their UUIDs differ: CUDA_VISIBLE_DEVICES differed.
    let mut a = info(0, "a", true);
    let mut b = info(1, "b", true);
    a.ranks_on_gpu = 2;
    b.ranks_on_gpu = 2;
    let err = make_setup(&cfg(Mode::Ll, 2), &[a.clone(), b])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("rank 0 counts 2 rank(s) on its GPU") && err.contains("CUDA_VISIBLE_DEVICES"),
        "{err}"
    );
    let mut same = info(1, "a", true);
    same.ranks_on_gpu = 2;
    assert!(make_setup(&cfg(Mode::Ll, 2), &[a, same]).is_ok());
}

fn result(rank: u32, scale: f64, nccl: bool) -> RankResult {
    let times = |base: f64| (1..=4).map(|i| base * scale * i as f64).collect::<Vec<_>>();
    RankResult {
        rank,
        grid: Grid {
            blocks: 132,
            threads: 512,
            chunks: 1,
            chunk_bytes: 128,
            gpu_scope: false,
            shared: false,
        },
        dispatch_bytes: PhaseBytes {
            deepep: 2_000_000,
            wire: 1_000_000,
            meta: 1000,
            per_expert: 8_000_000,
        },
        combine_bytes: PhaseBytes {
            deepep: 2_000_000,
            wire: 1_000_000,
            meta: 0,
            per_expert: 8_000_000,
        },
        paths: [Path::Put, Path::Store]
            .into_iter()
            .map(|path| PathTimes {
                graph: false,
                wall_ns: Vec::new(),
                path,
                dispatch_ns: times(10_000.0),
                combine_ns: times(20_000.0),
                ns_per_cycle: 0.5,
            })
            .collect(),
        launch_cost: Vec::new(),
        nccl: nccl.then(|| NcclTimes {
            version: "2.27.7".into(),
            dispatch_ns: times(40_000.0),
            combine_ns: times(40_000.0),
        }),
    }
}

#[test]
fn rows_take_the_slowest_rank_and_count_bandwidth_two_ways() {
    let c = cfg(Mode::Ht, 2);
    let results = [result(0, 1.0, true), result(1, 1.5, true)];
    let rows = report::rows(&c, &results);
    assert_eq!(rows.len(), 6, "put, store and nccl × dispatch, combine");
    let d = &rows[0];
    assert_eq!((d.method.as_str(), d.phase), ("put", "dispatch"));
    // Slowest rank (×1.5) per iteration: 15, 30, 45, 60 µs; p50 = 30 µs.
    assert_eq!(d.time.p50_ns, 30_000.0);
    assert_eq!(d.rank_p50_us, vec![20.0, 30.0]);
    assert!((d.wire_gbps - 1_000_000.0 / 30_000.0).abs() < 1e-9);
    assert!((d.deepep_gbps - 2.0 * d.wire_gbps).abs() < 1e-9);
    // NCCL's dispatch p50 is 120 µs: we are 4× faster on the same bytes.
    assert!((d.vs_nccl.unwrap() - 4.0).abs() < 1e-9);
    let table = report::table(&rows);
    assert!(table.contains("nccl") && table.contains("4.00"), "{table}");
    assert!(report::line(d, 2).contains("slowest of 2 ranks"));

    // Given simple_write's put at 100 GB/s, every device-API row shows its
    // wire bandwidth over it; NCCL's rows show none.
    let mut rows = rows;
    report::set_vs_put(&mut rows, Some(100.0));
    assert!((rows[0].vs_put.unwrap() - rows[0].wire_gbps / 100.0).abs() < 1e-12);
    assert!(
        rows.iter()
            .filter(|r| r.method == "nccl")
            .all(|r| r.vs_put.is_none())
    );
    assert!(report::table(&rows).contains("×put"));
    assert!(!report::table(&rows).contains("goal"));
    // Without NCCL on every rank there are no NCCL rows and no ratio.
    let rows = report::rows(&c, &[result(0, 1.0, true), result(1, 1.0, false)]);
    assert!(
        rows.iter()
            .all(|r| r.method != "nccl" && r.vs_nccl.is_none())
    );
}

#[test]
fn json_and_csv_carry_the_configuration_and_every_row() {
    let c = cfg(Mode::Ht, 2);
    let results = [result(0, 1.0, true), result(1, 1.0, true)];
    let rows = report::rows(&c, &results);
    let info = report::RunInfo::collect(&c, vec![info(0, "a", true), info(1, "b", true)], 1 << 20);
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let (json, csv) = (dir.join("ep_report.json"), dir.join("ep_report.csv"));
    report::write_json(&json, &info, &rows, &results).unwrap();
    report::write_csv(&csv, &info, &rows).unwrap();
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(doc["rows"].as_array().unwrap().len(), 6);
    assert_eq!(doc["run"]["config"]["mode"], "ht");
    assert_eq!(doc["run"]["ranks"][1]["gpu_uuid"], "b");
    assert_eq!(doc["ranks"][0]["paths"][0]["path"], "put");
    let text = std::fs::read_to_string(&csv).unwrap();
    assert!(text.lines().any(|l| l.starts_with("# config:")));
    assert_eq!(text.lines().filter(|l| l.starts_with("ht,")).count(), 6);
}

#[test]
fn a_wrong_value_is_described_by_rank_token_and_expert() {
    let c = cfg(Mode::Ll, 2);
    let m = Model::new(&c, 1);
    let t = m.recv.tokens_from[0][0];
    let mut v = EpVerify {
        mismatches: 3,
        kind: BAD_X,
        src_rank: 0,
        token: t,
        slot: 0,
        h: 7,
        expert: 9,
        got_bits: 0x7fc0,
        want_bits: 0x3c00,
        ..Default::default()
    };
    let text = describe(&m, &v);
    assert!(
        text.contains(&format!("rank 1: token {t} of rank 0")) && text.contains("expert 9"),
        "{text}"
    );
    assert!(text.contains("h=7") && text.contains("0x7fc0"), "{text}");

    v.kind = BAD_COUNT;
    v.got_bits = 3;
    v.want_bits = 5;
    assert!(describe(&m, &v).contains("received 3 token(s) from rank 0, expected 5"));

    let own = m.routing[1].experts_of(2).to_vec();
    v.kind = BAD_CONTRIBUTION;
    v.token = 2;
    v.src_rank = c.shape.rank_of(own[0]);
    let text = describe(&m, &v);
    assert!(
        text.contains("token 2") && text.contains(&format!("rank {}'s expert(s)", v.src_rank)),
        "{text}"
    );
    v.kind = BAD_COMBINED;
    assert!(describe(&m, &v).contains(&format!("{own:?}")));
}
