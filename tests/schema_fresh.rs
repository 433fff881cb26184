//! `schema/` is generated from the Rust types; this fails when the checked-in copy is stale.

use std::path::Path;

#[test]
fn checked_in_schema_matches_the_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("schema");
    let stale = gaffer::methods::schema::stale(&dir);
    assert!(
        stale.is_empty(),
        "schema/ is stale ({stale:?}); run `cargo run -- schema` and commit the result"
    );
}

#[test]
fn every_method_has_params_and_result_schemas() {
    let files = gaffer::methods::schema::generate();
    let index: serde_json::Value = serde_json::from_str(&files["index.json"]).expect("index");
    let methods = index["methods"].as_array().expect("methods");
    assert!(!methods.is_empty());
    for m in methods {
        for key in ["params", "result"] {
            let rel = m[key].as_str().expect("path");
            let schema: serde_json::Value = serde_json::from_str(&files[rel]).expect("schema json");
            assert_eq!(
                schema["$schema"], "https://json-schema.org/draft/2020-12/schema",
                "{rel} is 2020-12"
            );
        }
    }
}
