//! `simple_write` as a user meets it: argument errors (clap, exit 2), and
//! on a machine that cannot run it (no GPU, no device kernels) one clear
//! message and exit 1 before any network activity.

use std::process::{Command, Output};

fn simple_write(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_simple_write")).args(args).output().expect("running simple_write")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn help_documents_the_options() {
    let o = simple_write(&["--help"]);
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    for opt in ["--mode", "--size", "--level", "--iters", "--warmup", "--gpu", "--host", "--port", "--timeout", "--blocks", "--threads", "--json"] {
        assert!(text.contains(opt), "--help lacks {opt}");
    }
}

#[test]
fn bad_arguments_exit_2_with_a_reason() {
    for (args, needle) in [
        (&["--size", "0"][..], "at least 1 byte"),
        (&["--size", "12X"][..], "suffix"),
        (&["--size=-4"][..], "byte count"),
        (&["--level", "grid"][..], "grid"),
        (&["--mode", "server"][..], "server"),
        (&["--port", "0"][..], "port"),
        (&["--timeout=-1"][..], "timeout"),
        (&["--timeout", "abc"][..], "seconds"),
        (&["--threads", "2048"][..], "threads"),
        (&["--blocks", "0"][..], "blocks"),
    ] {
        let o = simple_write(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: stderr lacks {needle:?}: {}", stderr(&o));
    }
}

#[test]
fn a_machine_that_cannot_run_it_says_why_and_exits_1() {
    let has_driver = nixl_examples::gpu::context::driver_present();
    let has_kernels = nixl_examples::gpu::kernels::availability().is_ok();
    if has_driver && has_kernels {
        eprintln!("SKIP cannot-run test: this machine has a GPU driver and the kernels are built");
        return;
    }
    for mode in ["initiator", "target"] {
        // A port nobody listens on: the check must fail before any network wait.
        let start = std::time::Instant::now();
        let o = simple_write(&["--mode", mode, "--port", "1", "--timeout", "60"]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(start.elapsed().as_secs() < 20, "took {:?}: it waited on the network", start.elapsed());
        assert!(err.contains("cannot run simple_write"), "{err}");
        if !has_driver {
            assert!(err.contains("no NVIDIA driver"), "{err}");
            assert!(err.contains("two_proc"), "the message should point at the host-API example: {err}");
        }
        if !has_kernels {
            assert!(err.contains("built without the device kernels"), "{err}");
            assert!(err.contains("NIXL_PREFIX") || err.contains("nvcc") || err.contains("UCX"), "names no fix: {err}");
        }
    }
}
