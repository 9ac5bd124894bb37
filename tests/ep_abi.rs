//! The contract between `cuda/ep_common.cuh` and the Rust host, checked
//! without a GPU: the header is plain C++, so this test compiles a small
//! host program from it with the system C++ compiler, and compares every
//! struct offset and every shared formula (data hash, experts, bounds, the
//! combine reference under a mask) with the Rust side. nvcc enforces the
//! same header's static_asserts when the kernels are built.

use std::mem::{offset_of, size_of};
use std::path::PathBuf;
use std::process::Command;

use nixl_examples::ep::config::Shape;
use nixl_examples::ep::kernels::{EpParams, EpReport, EpTiming, EpVerify};
use nixl_examples::ep::layout::SendEntry;
use nixl_examples::ep::mask::Mask;
use nixl_examples::ep::reference;
use nixl_examples::ep::rng;

macro_rules! fields {
    ($t:ty, $c:literal: $($f:ident),* $(,)?) => {
        vec![
            (concat!($c, ".size"), size_of::<$t>()),
            $((concat!($c, ".", stringify!($f)), offset_of!($t, $f)),)*
        ]
    };
}

/// (name, value on the Rust side) for everything the C++ side prints.
fn rust_side() -> Vec<(String, String)> {
    let mut v: Vec<(&str, usize)> = fields!(EpParams, "EpParams":
        local_mvh, remote_mvh, window, report, verify, timing, entries, send_slot, expect_tokens,
        expect_count, all_experts, all_weights, recv_count, prev_low, grid_flags, out, mask, step,
        off_dispatch_count, off_combine_flags, off_barrier, off_recv_x, off_recv_meta, off_combine_recv,
        off_x, off_meta, off_y, seed, timeout_ns, fault_timeout_ns, rank, ranks, tokens, hidden, topk,
        local_experts, meta_bytes, n_entries, chunks, chunk_bytes, path, timing_slots, combine_batch,
        combine_batches, gpu_scope, combine_senders, combine_pieces);
    v.extend(fields!(EpReport, "EpReport":
        base, wait_kind, wait_rank, wait_target, null_ptr_rank, reserved, masked_bits, first_mask_ns,
        first_wait_ns, mask_kind, mask_rank));
    // The KernelReport it begins with, field by field (run_watched cancels
    // through `base.cancel`).
    v.extend([
        (
            "EpReport.base.observed",
            offset_of!(EpReport, base.observed),
        ),
        ("EpReport.base.errors", offset_of!(EpReport, base.errors)),
        (
            "EpReport.base.timed_out",
            offset_of!(EpReport, base.timed_out),
        ),
        ("EpReport.base.cancel", offset_of!(EpReport, base.cancel)),
    ]);
    v.extend(fields!(EpVerify, "EpVerify":
        mismatches, kind, src_rank, token, slot, h, expert, got_bits, want_bits, got, reference, bound));
    v.extend(fields!(EpTiming, "EpTiming": clock_start, clock_end, gt_start, gt_end));
    v.extend(fields!(SendEntry, "EpSendEntry": token, dest, slot));
    let mut out: Vec<(String, String)> = v
        .into_iter()
        .map(|(k, o)| (k.to_string(), o.to_string()))
        .collect();
    let key = rng::token_key(0x1234_5678_9abc_def0, 3, 17, 4095);
    out.push(("mix64".into(), rng::mix64(0xdead_beef).to_string()));
    out.push(("token_key".into(), key.to_string()));
    for h in [0u32, 1, 7, 7167] {
        out.push((format!("x_bits.{h}"), rng::x_bits(key, h).to_string()));
    }
    for e in [0u32, 5, 15, 16, 255] {
        out.push((
            format!("scale.{e}"),
            reference::expert_scale(e).to_bits().to_string(),
        ));
        out.push((
            format!("bias.{e}"),
            reference::expert_bias(e).to_bits().to_string(),
        ));
    }
    out.push((
        "partial_bound".into(),
        reference::partial_bound(1.375, 8).to_bits().to_string(),
    ));
    out.push((
        "combined_bound".into(),
        reference::combined_bound(1.375, 8, 4).to_bits().to_string(),
    ));
    out.extend(masked_side());
    out
}

/// The masked combine token both sides evaluate: 4 ranks of 4 experts,
/// top-5, and the masks of [`MASKS`] (bit r = rank r masked).
const EXPERTS: [u32; 5] = [1, 6, 9, 14, 3];
const WEIGHTS: [f32; 5] = [0.5, 0.25, 0.75, 1.0 / 256.0, 0.125];
const XS: [f32; 3] = [0.710_937_5, -0.013_671_875, 0.25];
const MASKS: [u64; 4] = [0b0000, 0b1010, 0b0101, 0b1111];

/// `masked.<mask>.<x>` = bits of the reference and of its magnitude sum.
fn masked_side() -> Vec<(String, String)> {
    let shape = Shape {
        tokens: 1,
        hidden: 8,
        topk: 5,
        experts: 16,
        ranks: 4,
    };
    let mut out = Vec::new();
    for m in MASKS {
        for (i, &x) in XS.iter().enumerate() {
            let (r, a) = reference::masked_reference(&shape, x, &EXPERTS, &WEIGHTS, Mask(m));
            out.push((
                format!("masked.{m}.{i}"),
                format!("{} {}", r.to_bits(), a.to_bits()),
            ));
        }
    }
    out
}

/// The C++ program printing the same names, from the header itself.
fn cpp_program(names: &[String]) -> String {
    let mut body = String::new();
    for name in names {
        let expr = match name.split_once('.') {
            Some((ty, "size")) if ty.starts_with("Ep") => format!("sizeof({ty})"),
            Some((ty, field)) if ty.starts_with("Ep") => format!("offsetof({ty}, {field})"),
            _ => continue,
        };
        body += &format!("    std::printf(\"{name} %zu\\n\", (size_t)({expr}));\n");
    }
    body += r#"
    const uint64_t key = ep_token_key(0x123456789abcdef0ull, 3, 17, 4095);
    std::printf("mix64 %llu\n", (unsigned long long)ep_mix64(0xdeadbeefull));
    std::printf("token_key %llu\n", (unsigned long long)key);
    for (uint32_t h : {0u, 1u, 7u, 7167u}) std::printf("x_bits.%u %u\n", h, (unsigned)ep_x_bits(key, h));
    for (uint32_t e : {0u, 5u, 15u, 16u, 255u}) {
        float s = ep_expert_scale(e), b = ep_expert_bias(e);
        uint32_t sb, bb;
        std::memcpy(&sb, &s, 4);
        std::memcpy(&bb, &b, 4);
        std::printf("scale.%u %u\nbias.%u %u\n", e, sb, e, bb);
    }
    float pb = ep_partial_bound(1.375f, 8), cb = ep_combined_bound(1.375f, 8, 4);
    uint32_t pbb, cbb;
    std::memcpy(&pbb, &pb, 4);
    std::memcpy(&cbb, &cb, 4);
    std::printf("partial_bound %u\ncombined_bound %u\n", pbb, cbb);
    const uint32_t experts[5] = {1, 6, 9, 14, 3};
    const float weights[5] = {0.5f, 0.25f, 0.75f, 1.0f / 256.0f, 0.125f};
    const float xs[3] = {0.7109375f, -0.013671875f, 0.25f};
    for (unsigned long long m : {0ull, 10ull, 5ull, 15ull}) {
        int32_t mask[4];
        for (int r = 0; r < 4; ++r) mask[r] = int32_t(m >> r & 1);
        for (int i = 0; i < 3; ++i) {
            float abs_sum = -1.0f;
            const float ref = ep_masked_reference(xs[i], experts, weights, 5, 4, mask, &abs_sum);
            uint32_t rb, ab;
            std::memcpy(&rb, &ref, 4);
            std::memcpy(&ab, &abs_sum, 4);
            std::printf("masked.%llu.%d %u %u\n", m, i, rb, ab);
        }
    }
"#;
    format!(
        "#include \"ep_common.cuh\"\n#include <cstdio>\n#include <cstring>\n#include <initializer_list>\nint main() {{\n{body}    return 0;\n}}\n"
    )
}

#[test]
fn the_cuda_header_and_the_rust_host_agree() {
    let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ep_abi");
    std::fs::create_dir_all(&dir).unwrap();
    let want = rust_side();
    let names: Vec<String> = want.iter().map(|(k, _)| k.clone()).collect();
    std::fs::write(dir.join("abi.cpp"), cpp_program(&names)).unwrap();
    let cuda = concat!(env!("CARGO_MANIFEST_DIR"), "/cuda");
    let built = Command::new(&compiler)
        .args(["-std=c++17", "-O1", "-I", cuda, "abi.cpp", "-o", "abi"])
        .current_dir(&dir)
        .output();
    let built = match built {
        Ok(o) => o,
        Err(e) => {
            eprintln!("SKIP ep_abi: no C++ compiler ({compiler}: {e}); install g++ or set CXX");
            return;
        }
    };
    assert!(
        built.status.success(),
        "compiling the header failed:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let run = Command::new(dir.join("abi")).output().unwrap();
    let text = String::from_utf8(run.stdout).unwrap();
    let got: Vec<(String, String)> = text
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(' ').unwrap();
            (k.to_string(), v.to_string())
        })
        .collect();
    for (name, value) in &want {
        let cpp = got.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        assert_eq!(
            cpp,
            Some(value.as_str()),
            "{name}: C++ header says {cpp:?}, Rust says {value}"
        );
    }
}
