//! Arbitrary JSON as params for every method's decoder and as whole messages: decoding may
//! refuse, never panic, and a refusal always names a field (or the whole params).
#![no_main]

use gaffer::rpc::message::classify;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let _ = classify(value.clone());
    for problem in gaffer::methods::decode_all_params(&value) {
        assert!(problem.field().is_some(), "an invalid-params error must name a field");
    }
});
