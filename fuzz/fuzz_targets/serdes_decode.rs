//! libFuzzer target: arbitrary bytes through NIXL's descriptor-list decoder
//! (`serdes::DescList::decode`), which reads what a peer published in the
//! store.
//!
//! Checks: no panic; no allocation over `-malloc_limit_mb` (scripts/fuzz.sh
//! sets 2 MiB, for inputs of at most 4 KiB: the descriptor count comes from
//! the input and must never be allocated before the bytes behind it are
//! seen); and decoding is
//! canonical, so every input that decodes is exactly the encoding of what
//! it decoded to.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nixl_examples::nixl::serdes::DescList;

fuzz_target!(|data: &[u8]| {
    if let Ok(list) = DescList::decode(data) {
        assert_eq!(
            list.encode(),
            data,
            "{list:?} does not re-encode to its bytes"
        );
    }
});
