#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| nodekeeper_fuzz::kdump(data));
