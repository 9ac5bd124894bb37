//! The kernel argument layout the host and cuda/kernels.cu share. The Rust
//! side is also checked at compile time; this test makes the contract
//! visible and checks that the CUDA side asserts the same numbers (nvcc
//! enforces those when the kernels are built).

use std::mem::{offset_of, size_of};

use nixl_examples::gpu::kernels::KernelReport;
use nixl_examples::nixl::view::MemViewElem;
use nixl_examples::simple_write::kernels::{WaitParams, WriteParams};

#[test]
fn mem_view_elem_is_nixls_24_byte_struct() {
    assert_eq!(size_of::<MemViewElem>(), 24);
    assert_eq!(
        (
            offset_of!(MemViewElem, mvh),
            offset_of!(MemViewElem, index),
            offset_of!(MemViewElem, offset)
        ),
        (0, 8, 16)
    );
}

#[test]
fn rust_and_cuda_assert_the_same_layout() {
    // kernels.cu, the device vocabulary it includes, and the KernelReport
    // header that includes.
    let read = |f: &str| {
        std::fs::read_to_string(format!("{}/cuda/{f}", env!("CARGO_MANIFEST_DIR"))).unwrap()
    };
    let common = read("device_common.cuh");
    assert!(read("kernels.cu").contains("#include \"device_common.cuh\""));
    assert!(common.contains("#include \"kernel_report.h\""));
    let cu = read("kernels.cu") + &common + &read("kernel_report.h");
    for needle in [
        "sizeof(nixlMemViewElem) == 24".to_string(),
        "offsetof(nixlMemViewElem, index) == 8".to_string(),
        "offsetof(nixlMemViewElem, offset) == 16".to_string(),
        format!("sizeof(KernelReport) == {}", size_of::<KernelReport>()),
        format!(
            "offsetof(KernelReport, cancel) == {}",
            offset_of!(KernelReport, cancel)
        ),
        format!("sizeof(WriteParams) == {}", size_of::<WriteParams>()),
        format!(
            "offsetof(WriteParams, ack) == {}",
            offset_of!(WriteParams, ack)
        ),
        format!(
            "offsetof(WriteParams, warmup) == {}",
            offset_of!(WriteParams, warmup)
        ),
        format!(
            "offsetof(WriteParams, signal_base) == {}",
            offset_of!(WriteParams, signal_base)
        ),
        format!(
            "offsetof(WriteParams, phase_cycles) == {}",
            offset_of!(WriteParams, phase_cycles)
        ),
        format!(
            "offsetof(WriteParams, slot_bytes) == {}",
            offset_of!(WriteParams, slot_bytes)
        ),
        format!("sizeof(WaitParams) == {}", size_of::<WaitParams>()),
        format!(
            "offsetof(WaitParams, ack_base) == {}",
            offset_of!(WaitParams, ack_base)
        ),
        format!(
            "offsetof(WaitParams, first_seq) == {}",
            offset_of!(WaitParams, first_seq)
        ),
    ] {
        assert!(
            cu.contains(&format!("static_assert({needle}")),
            "cuda/kernels.cu (with kernel_report.h) lacks static_assert({needle}, ...)"
        );
    }
}

#[test]
fn every_kernel_the_host_loads_is_defined() {
    // The host finds kernels by name at load time, on a GPU only; a name
    // in src/simple_write/kernels.rs without its kernel would fail there.
    let root = env!("CARGO_MANIFEST_DIR");
    let cu = std::fs::read_to_string(format!("{root}/cuda/kernels.cu")).unwrap();
    let rs = std::fs::read_to_string(format!("{root}/src/simple_write/kernels.rs")).unwrap();
    let names: Vec<&str> = rs
        .split('"')
        .skip(1)
        .step_by(2)
        .filter(|s| {
            s.starts_with("nixl_") && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
        .collect();
    assert!(names.len() >= 18, "only {} kernel names found", names.len());
    for name in names {
        let defined = cu.lines().any(|l| {
            (l.starts_with("WRITE_KERNEL ") || l.starts_with("extern \"C\" __global__"))
                && l.contains(&format!(" {name}("))
        });
        assert!(
            defined,
            "src/simple_write/kernels.rs loads {name}, which cuda/kernels.cu does not define"
        );
    }
}
