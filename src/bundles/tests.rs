use super::*;
use proptest::prelude::*;
use serde_json::json;

/// The documented test vector (see `digest.rs`): canonical bytes and digest computed
/// independently (Python `json.dumps(sort_keys=True, separators=(",", ":"))`, which equals
/// JCS for this ASCII-and-integer document).
const VECTOR_CANONICAL: &str = r#"{"declarations":[{"kind":"secret_ref","name":"token","reference":"env:DEMO_TOKEN"}],"metadata":{"created_at":"2026-01-01T00:00:00Z","id":"bundle-1","provenance":{"source":"test"},"revision":"r1"},"profiles":[{"command":["sh","tests/scripts/echo.sh"],"input_mode":"stdin_text","selector":{"kind":"builtin","value":"builtin:coder"}}]}"#;
const VECTOR_DIGEST: &str =
    "sha256:875b0088bffaed17b244cc52a75c22798dabce6f9302984c17d2d588fc91a826";

fn vector_bundle() -> Value {
    json!({
        "metadata": {"id": "bundle-1", "revision": "r1", "created_at": "2026-01-01T00:00:00Z",
                     "provenance": {"source": "test"}},
        "profiles": [{"selector": {"kind": "builtin", "value": "builtin:coder"},
                      "command": ["sh", "tests/scripts/echo.sh"]}],
        "declarations": [{"kind": "secret_ref", "name": "token", "reference": "env:DEMO_TOKEN"}]
    })
}

fn bundle(v: Value) -> Bundle {
    parse_value(v).unwrap()
}

#[test]
fn digest_test_vector() {
    let c = digest::canonicalize(&bundle(vector_bundle()));
    assert_eq!(String::from_utf8(c.bytes).unwrap(), VECTOR_CANONICAL);
    assert_eq!(c.digest, VECTOR_DIGEST);
}

#[test]
fn yaml_and_json_give_the_same_digest() {
    let yaml = "metadata:\n  id: bundle-1\n  revision: r1\n  created_at: '2026-01-01T00:00:00Z'\n  provenance: {source: test}\nprofiles:\n  - selector: {kind: builtin, value: 'builtin:coder'}\n    command: [sh, tests/scripts/echo.sh]\n    input_mode: stdin_text\ndeclarations:\n  - {kind: secret_ref, name: token, reference: 'env:DEMO_TOKEN'}\n";
    let b = parse_text(yaml).unwrap();
    assert_eq!(digest::digest(&b), VECTOR_DIGEST);
    let json_text = serde_json::to_string_pretty(&vector_bundle()).unwrap();
    assert_eq!(
        digest::digest(&parse_text(&json_text).unwrap()),
        VECTOR_DIGEST
    );
}

#[test]
fn stated_digest_must_match() {
    let mut v = vector_bundle();
    v["metadata"]["digest"] = json!(VECTOR_DIGEST);
    assert_eq!(
        prepare(&bundle(v.clone())).unwrap().summary.digest,
        VECTOR_DIGEST
    );
    v["metadata"]["digest"] = json!(format!("sha256:{}", "0".repeat(64)));
    match prepare(&bundle(v)) {
        Err(BundleError::DigestMismatch {
            expected, actual, ..
        }) => {
            assert_eq!(actual, VECTOR_DIGEST);
            assert!(expected.ends_with(&"0".repeat(64)));
        }
        other => panic!("expected mismatch, got {other:?}"),
    }
}

#[test]
fn any_content_change_changes_the_digest() {
    let base = digest::digest(&bundle(vector_bundle()));
    let edits: Vec<fn(&mut Value)> = vec![
        |v| v["metadata"]["revision"] = json!("r2"),
        |v| v["metadata"]["provenance"]["detail"] = json!("x"),
        |v| v["profiles"][0]["command"] = json!(["tests/scripts/echo.sh", "sh"]),
        |v| v["profiles"][0]["input_mode"] = json!("argument"),
        |v| v["profiles"][0]["timeout_ms"] = json!(1000),
        |v| v["declarations"][0]["reference"] = json!("env:OTHER"),
    ];
    for (i, edit) in edits.iter().enumerate() {
        let mut v = vector_bundle();
        edit(&mut v);
        assert_ne!(digest::digest(&bundle(v)), base, "edit {i} kept the digest");
    }
}

fn two_profile_bundle(swap: bool, reorder_keys: bool) -> String {
    let a = r#"{"selector":{"kind":"named","value":"a"},"command":["x"],"toolsets":["t1","t2"]}"#;
    let b = r#"{"command":["y"],"selector":{"value":"b","kind":"builtin"}}"#;
    let (p1, p2) = if swap { (b, a) } else { (a, b) };
    let d1 = r#"{"kind":"git_policy","name":"g","reference":"git:read-only"}"#;
    let d2 = r#"{"kind":"secret_ref","name":"s","reference":"vault:team.key"}"#;
    let (e1, e2) = if swap { (d2, d1) } else { (d1, d2) };
    let meta = if reorder_keys {
        r#"{"provenance":{"source":"t"},"created_at":"c","revision":"r","id":"b1"}"#
    } else {
        r#"{"id":"b1","revision":"r","created_at":"c","provenance":{"source":"t"}}"#
    };
    let mut text =
        format!(r#"{{"metadata":{meta},"profiles":[{p1},{p2}],"declarations":[{e1},{e2}]}}"#);
    if swap {
        text = text.replace(r#"["t1","t2"]"#, r#"["t2","t1"]"#);
    }
    text
}

#[test]
fn order_without_meaning_does_not_change_the_digest() {
    let base = digest::digest(&parse_text(&two_profile_bundle(false, false)).unwrap());
    for (swap, reorder) in [(true, false), (false, true), (true, true)] {
        let d = digest::digest(&parse_text(&two_profile_bundle(swap, reorder)).unwrap());
        assert_eq!(d, base, "swap={swap} reorder={reorder}");
    }
}

#[test]
fn defaults_written_or_omitted_give_one_digest() {
    let mut v = vector_bundle();
    let implicit = digest::digest(&bundle(v.clone()));
    v["profiles"][0]["input_mode"] = json!("stdin_text");
    v["profiles"][0]["toolsets"] = json!([]);
    v["metadata"]["digest"] = json!(implicit.clone());
    assert_eq!(digest::digest(&bundle(v)), implicit);
}

fn expect_field(v: Value, field: &str) {
    let err = parse_value(v)
        .map_err(BundleError::from)
        .and_then(|b| prepare(&b).map(|_| ()));
    match err {
        Err(BundleError::Invalid(e)) => assert_eq!(e.field, field, "message: {}", e.message),
        other => panic!("expected invalid {field}, got {other:?}"),
    }
}

#[test]
fn boundary_rules_name_the_field() {
    type Edit = fn(&mut Value);
    let cases: Vec<(&str, Edit)> = vec![
        ("metadata.id", |v| v["metadata"]["id"] = json!("-bad")),
        ("metadata.id", |v| v["metadata"]["id"] = json!("a/b")),
        ("metadata.digest", |v| {
            v["metadata"]["digest"] = json!("ABC")
        }),
        ("metadata.revision", |v| {
            v["metadata"]["revision"] = json!("  ")
        }),
        ("metadata.created_at", |v| {
            v["metadata"]["created_at"] = json!("a\u{7}b")
        }),
        ("metadata.provenance.source", |v| {
            v["metadata"]["provenance"]["source"] = json!("/home/me/x")
        }),
        ("metadata.provenance.detail", |v| {
            v["metadata"]["provenance"]["detail"] = json!("~/notes")
        }),
        ("metadata.provenance.detail", |v| {
            v["metadata"]["provenance"]["detail"] = json!("x".repeat(3000))
        }),
        ("metadata.provenance.detail", |v| {
            v["metadata"]["provenance"]["detail"] = json!("at tmp/agent.sock")
        }),
        ("metadata.provenance.detail", |v| {
            v["metadata"]["provenance"]["detail"] = json!("session_path=x")
        }),
        ("metadata.provenance.detail", |v| {
            v["metadata"]["provenance"]["detail"] = json!("home/.cache/x")
        }),
        ("metadata.provenance.detail", |v| {
            v["metadata"]["provenance"]["detail"] = json!("C:\\Users")
        }),
        ("profiles[0].label", |v| {
            v["profiles"][0]["label"] = json!("var/run/x/sessions/1")
        }),
        ("profiles[0].command[0]", |v| {
            v["profiles"][0]["command"] = json!(["/bin/sh"])
        }),
        ("profiles[0].command[0]", |v| {
            v["profiles"][0]["command"] = json!(["../outside.sh"])
        }),
        ("profiles[0].command[1]", |v| {
            v["profiles"][0]["command"] = json!(["sh", "/etc/passwd"])
        }),
        ("profiles[0].timeout_ms", |v| {
            v["profiles"][0]["timeout_ms"] = json!(0)
        }),
        ("profiles[0].selector.value", |v| {
            v["profiles"][0]["selector"]["value"] = json!("")
        }),
        ("profiles[1].selector", |v| {
            let p = v["profiles"][0].clone();
            v["profiles"].as_array_mut().unwrap().push(p)
        }),
        ("declarations[0].reference", |v| {
            v["declarations"][0]["reference"] = json!("hunter2-secret-value")
        }),
        ("declarations[0].reference", |v| {
            v["declarations"][0]["reference"] = json!("secret:")
        }),
        ("declarations[0].reference", |v| {
            v["declarations"][0]["reference"] = json!("mount:workspace")
        }),
        ("declarations[0].reference", |v| {
            v["declarations"][0]["reference"] = json!("env:1BAD")
        }),
        ("declarations[0].reference", |v| {
            v["declarations"][0]["reference"] = json!("secret:a b")
        }),
        ("declarations[0].reference", |v| {
            v["declarations"][0]["reference"] = json!("secret:x.sock")
        }),
        ("declarations[0].kind", |v| {
            v["declarations"][0]["kind"] = json!("unsupported")
        }),
        ("declarations[0].name", |v| {
            v["declarations"][0]["name"] = json!("")
        }),
        ("declarations[0].name", |v| {
            v["declarations"][0]["name"] = json!("docs=mount:read:DOCS]; secrets []")
        }),
        ("declarations[0].name", |v| {
            v["declarations"][0]["name"] = json!("x".repeat(65))
        }),
        ("declarations[0].name", |v| {
            v["declarations"][0]["name"] = json!("token\u{3164}")
        }),
        ("metadata.workspace_root", |v| {
            v["metadata"]["workspace_root"] = json!("x")
        }),
    ];
    for (field, edit) in cases {
        let mut v = vector_bundle();
        edit(&mut v);
        expect_field(v, field);
    }
}

#[test]
fn plaintext_secret_is_never_echoed_in_the_error() {
    let mut v = vector_bundle();
    v["declarations"][0]["reference"] = json!("hunter2-secret-value");
    let err = prepare(&bundle(v)).unwrap_err().to_string();
    assert!(!err.contains("hunter2"), "{err}");
}

#[test]
fn accepted_reference_prefixes() {
    for (kind, reference) in [
        ("secret_ref", "secret:github-token"),
        ("secret_ref", "vault:team.api-key"),
        ("secret_ref", "env:GITHUB_TOKEN"),
        ("mount_grant", "mount:docs"),
        ("network_policy", "network-policy:none"),
        ("shell_policy", "shell:restricted"),
        ("git_policy", "git:read-only"),
        ("capability_grant", "capability:read"),
    ] {
        let mut v = vector_bundle();
        v["declarations"][0] = json!({"kind": kind, "name": "n", "reference": reference});
        prepare(&bundle(v)).unwrap_or_else(|e| panic!("{kind} {reference}: {e}"));
    }
}

#[test]
fn a_declaration_name_is_a_token() {
    for name in ["n", "api.key", "GITHUB_TOKEN", "team-1", &"x".repeat(64)] {
        let mut v = vector_bundle();
        v["declarations"][0]["name"] = json!(name);
        prepare(&bundle(v)).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn sync_is_write_once_per_id() {
    let mut state = BundleState::default();
    let p = prepare(&bundle(vector_bundle())).unwrap();
    let SyncOutcome::New {
        kind,
        payload,
        availability,
    } = state.plan_sync(&p).unwrap()
    else {
        panic!("first sync must be new")
    };
    assert_eq!(availability.reference.digest, VECTOR_DIGEST);
    state.apply_record(kind, 7, 1000, &payload);
    assert_eq!(state.list().len(), 1);
    assert!(
        matches!(state.plan_sync(&p).unwrap(), SyncOutcome::AlreadySynced(a) if a.reference == availability.reference)
    );

    let mut other = vector_bundle();
    other["metadata"]["revision"] = json!("r2");
    let p2 = prepare(&bundle(other)).unwrap();
    assert!(
        matches!(state.plan_sync(&p2), Err(BundleError::DigestMismatch { expected, .. }) if expected == VECTOR_DIGEST)
    );

    assert!(state.check(&availability.reference).is_ok());
    let missing = BundleRef {
        id: "nope".into(),
        digest: VECTOR_DIGEST.into(),
    };
    assert!(matches!(
        state.check(&missing),
        Err(BundleError::Missing { .. })
    ));
    let wrong = BundleRef {
        id: "bundle-1".into(),
        digest: p2.summary.digest.clone(),
    };
    assert!(matches!(
        state.check(&wrong),
        Err(BundleError::DigestMismatch { .. })
    ));
}

#[test]
fn blob_round_trips_to_the_same_digest() {
    let p = prepare(&bundle(vector_bundle())).unwrap();
    let back = from_blob(&p.canonical.bytes).unwrap();
    assert_eq!(digest::digest(&back), p.summary.digest);
    assert_eq!(
        crate::util::sha256_hex(&p.canonical.bytes),
        digest::digest_hex(&p.summary.digest)
    );
}

/// Text made of the characters most likely to forge structure in a naive encoding.
fn tricky_text() -> impl Strategy<Value = String> {
    "[a-c\"\\\\,:{}\\[\\]=|;#]{0,10}"
}

proptest! {
    // Moving text between fields (shifting a separator from one value into its neighbour)
    // never yields the same digest unless the bundles are equal field by field.
    #[test]
    fn field_values_cannot_forge_another_bundles_digest(
        rev1 in tricky_text(), src1 in tricky_text(), label1 in tricky_text(),
        rev2 in tricky_text(), src2 in tricky_text(), label2 in tricky_text(),
    ) {
        let make = |rev: &str, src: &str, label: &str| {
            let mut v = vector_bundle();
            v["metadata"]["revision"] = json!(format!("r{rev}"));
            v["metadata"]["provenance"]["source"] = json!(format!("s{src}"));
            v["profiles"][0]["label"] = json!(label);
            bundle(v)
        };
        let a = make(&rev1, &src1, &label1);
        let b = make(&rev2, &src2, &label2);
        let same_fields = (rev1 == rev2) && (src1 == src2) && (label1 == label2);
        prop_assert_eq!(digest::digest(&a) == digest::digest(&b), same_fields);
    }

    // Concatenation attacks: splitting one string differently across two adjacent fields.
    #[test]
    fn splitting_text_across_fields_changes_the_digest(s in "[a-c\",:\\\\]{2,16}", cut1 in 0usize..16, cut2 in 0usize..16) {
        let cut1 = cut1 % (s.len() + 1);
        let cut2 = cut2 % (s.len() + 1);
        prop_assume!(cut1 != cut2);
        let make = |cut: usize| {
            let mut v = vector_bundle();
            v["metadata"]["revision"] = json!(format!("r{}", &s[..cut]));
            v["metadata"]["created_at"] = json!(format!("c{}", &s[cut..]));
            bundle(v)
        };
        prop_assert_ne!(digest::digest(&make(cut1)), digest::digest(&make(cut2)));
    }

    // Profiles and declarations form sets: any permutation keeps the digest.
    #[test]
    fn profile_and_declaration_order_is_irrelevant(perm in Just((0..5).collect::<Vec<usize>>()).prop_shuffle()) {
        let profiles: Vec<Value> = (0..5)
            .map(|i| json!({"selector": {"kind": "named", "value": format!("p{i}")}, "command": ["x", format!("{i}")]}))
            .collect();
        let decls: Vec<Value> = (0..5)
            .map(|i| json!({"kind": "secret_ref", "name": format!("n{i}"), "reference": format!("secret:k{i}")}))
            .collect();
        let mk = |order: &[usize]| {
            let mut v = vector_bundle();
            v["profiles"] = Value::Array(order.iter().map(|&i| profiles[i].clone()).collect());
            v["declarations"] = Value::Array(order.iter().map(|&i| decls[i].clone()).collect());
            digest::digest(&bundle(v))
        };
        prop_assert_eq!(mk(&perm), mk(&[0, 1, 2, 3, 4]));
    }
}

fn arb_text() -> impl Strategy<Value = String> {
    "[a-z\"\\\\\u{0}-\u{1f}\u{7f}\u{e9}\u{2028}\u{1f600},:{}]{0,8}"
}

fn arb_profile() -> impl Strategy<Value = Profile> {
    (
        (any::<bool>(), arb_text()),
        prop::option::of(arb_text()),
        prop::collection::vec(arb_text(), 0..3),
        0u8..3,
        prop::option::of(prop_oneof![
            0u64..100_000,
            Just(u64::MAX),
            Just((1u64 << 53) + 1)
        ]),
        prop::collection::vec(arb_text(), 0..3),
        prop::option::of(arb_text()),
    )
        .prop_map(
            |((builtin, value), label, command, mode, timeout_ms, toolsets, model)| Profile {
                selector: if builtin {
                    ProfileSelector::Builtin(value)
                } else {
                    ProfileSelector::Named(value)
                },
                label,
                command,
                input_mode: [
                    InputMode::StdinText,
                    InputMode::StdinJsonl,
                    InputMode::Argument,
                ][mode as usize],
                timeout_ms,
                toolsets,
                model,
            },
        )
}

fn arb_bundle() -> impl Strategy<Value = Bundle> {
    (
        (
            arb_text(),
            prop::option::of(arb_text()),
            arb_text(),
            arb_text(),
            arb_text(),
            prop::option::of(arb_text()),
        ),
        prop::collection::vec(arb_profile(), 0..4),
        prop::collection::vec((0usize..6, arb_text(), arb_text()), 0..4),
    )
        .prop_map(
            |((id, digest, revision, created_at, source, detail), profiles, decls)| Bundle {
                metadata: Metadata {
                    id,
                    digest,
                    revision,
                    created_at,
                    provenance: Provenance { source, detail },
                },
                profiles,
                declarations: decls
                    .into_iter()
                    .map(|(k, name, reference)| Declaration {
                        kind: DeclarationKind::ALL[k],
                        name,
                        reference,
                    })
                    .collect(),
            },
        )
}

#[test]
fn typed_encoder_matches_the_generic_jcs_path_on_the_vector() {
    let b = digest::normalize(&bundle(vector_bundle()));
    assert_eq!(digest::encode(&b), digest::encode_generic(&b));
}

proptest! {
    // The fast typed encoder is byte-for-byte the generic JCS encoding of the same bundle,
    // whatever the field values (escapes, non-ASCII, optional fields, huge integers).
    #[test]
    fn typed_encoder_equals_generic_jcs(b in arb_bundle()) {
        prop_assert_eq!(
            String::from_utf8(digest::encode(&b)).unwrap(),
            String::from_utf8(digest::encode_generic(&b)).unwrap()
        );
        // The digest path (ordering by reference, no copy) equals the generic encoding of the
        // normalised bundle.
        prop_assert_eq!(
            String::from_utf8(digest::canonicalize(&b).bytes).unwrap(),
            String::from_utf8(digest::encode_generic(&digest::normalize(&b))).unwrap()
        );
    }
}

#[test]
fn yaml_alias_bombs_are_refused_not_expanded() {
    let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..12 {
        let p = i - 1;
        text.push_str(&format!(
            "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
        ));
    }
    text.push_str("metadata: *a11\n");
    let started = std::time::Instant::now();
    let err = parse_text(&text).unwrap_err();
    assert_eq!(err.field, "bundle");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn oversize_bundles_are_refused_whole() {
    let mut v = vector_bundle();
    let label = "x".repeat(2000);
    v["profiles"] = Value::Array(
        (0..4200)
            .map(|i| json!({"selector": {"kind": "named", "value": format!("p{i}")}, "label": label, "command": ["x"]}))
            .collect(),
    );
    match prepare(&bundle(v)) {
        Err(BundleError::Invalid(e)) => assert_eq!(e.field, "profiles"),
        other => panic!(
            "expected a refusal, got {:?}",
            other.map(|p| p.summary.size_bytes)
        ),
    }
    let mut v = vector_bundle();
    v["profiles"] = Value::Array(
        (0..4000)
            .map(|i| {
                json!({"selector": {"kind": "named", "value": format!("p{i}")}, "label": label,
                       "command": ["x", "y".repeat(2000)]})
            })
            .collect(),
    );
    match prepare(&bundle(v)) {
        Err(BundleError::Invalid(e)) => assert_eq!(e.field, "bundle"),
        other => panic!(
            "expected a refusal, got {:?}",
            other.map(|p| p.summary.size_bytes)
        ),
    }
    assert_eq!(
        parse_text(&" ".repeat(validate::MAX_BUNDLE_BYTES + 1))
            .unwrap_err()
            .field,
        "bundle"
    );
}
