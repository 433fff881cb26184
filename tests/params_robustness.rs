//! Any JSON as params of any method: decoding refuses with a -32602 that names a field, and
//! never panics. (The stable-toolchain twin of the `params` fuzz target.)

use proptest::prelude::*;
use serde_json::{Map, Value};

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        ".{0,40}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            proptest::collection::btree_map("[a-z_]{1,20}", inner, 0..8)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn any_params_are_refused_cleanly_or_accepted(v in json_value()) {
        for e in gaffer::methods::decode_all_params(&v) {
            prop_assert_eq!(e.code, -32602);
            prop_assert!(e.field().is_some(), "no field in {:?}", e);
        }
    }
}
