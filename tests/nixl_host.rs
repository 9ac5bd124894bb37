//! The real NIXL library (the nixl-cu13 wheel from scripts/setup.sh) over UCX,
//! host API, DRAM, two agents in one process.

use std::time::{Duration, Instant};

use nixl_examples::nixl::agent::{create_ucx_agent, wait_remote_md};
use nixl_examples::nixl::memory::HostBuffer;
use nixl_examples::nixl::serdes::{Desc, DescList, MemType};
use nixl_sys::{NotificationMap, OptArgs, XferOp, XferStatus};

#[test]
fn write_with_notification_between_two_agents() {
    let a = create_ucx_agent("host_test_a").expect("agent a");
    let b = create_ucx_agent("host_test_b").expect("agent b");

    let mut src = HostBuffer::new(4096);
    for (i, x) in src.as_mut_slice().iter_mut().enumerate() {
        *x = (i * 7 + 3) as u8;
    }
    let dst = HostBuffer::new(4096);
    let _ra = a.agent.register_memory(&src, None).unwrap();
    let _rb = b.agent.register_memory(&dst, None).unwrap();

    // Exchange metadata as the two-process examples do, through bytes.
    let md_b = b.agent.get_local_md().unwrap();
    assert_eq!(a.agent.load_remote_md(&md_b).unwrap(), "host_test_b");
    wait_remote_md(&a.agent, "host_test_b", Duration::from_secs(5)).unwrap();

    let local = DescList::new(
        MemType::Dram,
        vec![Desc {
            addr: src.addr(),
            len: 4096,
            dev_id: 0,
        }],
    );
    let remote_bytes = DescList::new(
        MemType::Dram,
        vec![Desc {
            addr: dst.addr(),
            len: 4096,
            dev_id: 0,
        }],
    )
    .encode();
    let remote = DescList::decode(&remote_bytes).unwrap();

    let mut opt = OptArgs::new().unwrap();
    opt.set_notification_message(b"DONE").unwrap();
    opt.set_has_notification(true).unwrap();
    let req = a
        .agent
        .create_xfer_req(
            XferOp::Write,
            &local.to_xfer_dlist().unwrap(),
            &remote.to_xfer_dlist().unwrap(),
            "host_test_b",
            Some(&opt),
        )
        .unwrap();
    a.agent.post_xfer_req(&req, None).unwrap();
    let start = Instant::now();
    while a.agent.get_xfer_status(&req).unwrap() != XferStatus::Success {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "transfer did not complete"
        );
        std::thread::sleep(Duration::from_millis(1));
    }

    // The notification arrives at b once the data is there.
    let mut notifs = NotificationMap::new().unwrap();
    let mut got = None;
    while got.is_none() {
        assert!(start.elapsed() < Duration::from_secs(10), "no notification");
        b.agent.get_notifications(&mut notifs, None).unwrap();
        if let Some(v) = notifs.take_notifs().unwrap().remove("host_test_a") {
            got = v.into_iter().next();
        }
    }
    assert_eq!(got.as_deref(), Some("DONE"));
    assert_eq!(dst.as_slice(), src.as_slice());
}
