//! The EP kernels under a mask, on a GPU: `examples/ep_mask_check.rs` runs
//! one rank alone with the others masked (both shapes, both paths) and
//! checks every value against the mask. Without a GPU driver or the
//! kernels it prints SKIP.

mod common;

use std::process::Command;

#[test]
fn the_kernels_skip_masked_ranks_and_verify_against_the_mask() {
    if !nixl_examples::gpu::context::driver_present()
        || nixl_examples::ep::kernels::availability().is_err()
    {
        println!("SKIP ep_mask_check: no GPU driver or no EP kernels here");
        return;
    }
    let out = Command::new(common::example("ep_mask_check"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ep_mask_check failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
