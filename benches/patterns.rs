//! In-process selection benchmark. Prints µs per call and the speed-up over the reference
//! selector's 6.3 ms per call. Run with `cargo bench --bench patterns`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use gaffer::patterns::{SelectContext, build_plan, parse_params, render::render_output, select};
use serde_json::{Value, json};

const REFERENCE_MS_PER_CALL: f64 = 6.3;

fn scopes(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("pkg-{i:04}")).collect()
}

/// Median of several timed batches, in µs per call.
fn measure(mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    let mut calls = 0u64;
    while start.elapsed() < Duration::from_millis(200) {
        f();
        calls += 1;
    }
    let per_batch = (calls / 5).max(1);
    let mut samples: Vec<f64> = (0..9)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..per_batch {
                f();
            }
            t.elapsed().as_secs_f64() * 1e6 / per_batch as f64
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn main() {
    let ctx = SelectContext::isolated();
    let cases: [(&str, Value); 4] = [
        ("small request", json!({"objective": "small docs update"})),
        (
            "small request, output=select",
            json!({"objective": "small docs update", "output": "select"}),
        ),
        (
            "50 scopes",
            json!({"objective": "Apply the lint autofix", "scopes": scopes(50), "notes": ["disjoint"], "max_parallel_lanes": 8}),
        ),
        (
            "1,000 scopes",
            json!({"objective": "Apply the lint autofix", "scopes": scopes(1000), "notes": ["disjoint"], "max_parallel_lanes": 8}),
        ),
    ];
    println!("patterns: in-process selection (reference: {REFERENCE_MS_PER_CALL} ms/call)");
    println!(
        "{:<32} {:>14} {:>14} {:>14} {:>10}",
        "request", "decide µs", "to Value µs", "to bytes µs", "speed-up"
    );
    for (name, params) in &cases {
        // Decision only: parse + plan (no rendering of the output wrapper).
        let decide = measure(|| {
            let p = parse_params(black_box(params)).unwrap();
            let outcome = build_plan(&p.request, p.roster_path.as_deref(), &ctx).unwrap();
            black_box(outcome.plan.lanes.len());
        });
        // The library entry point: params in, serde_json::Value out.
        let value = measure(|| {
            black_box(select(black_box(params), &ctx).unwrap());
        });
        // What a server does: params in, JSON bytes out (no intermediate Value).
        let bytes = measure(|| {
            let p = parse_params(black_box(params)).unwrap();
            let outcome = build_plan(&p.request, p.roster_path.as_deref(), &ctx).unwrap();
            black_box(serde_json::to_vec(&render_output(&outcome, p.output)).unwrap());
        });
        let speedup = REFERENCE_MS_PER_CALL * 1000.0 / bytes;
        println!("{name:<32} {decide:>14.2} {value:>14.2} {bytes:>14.2} {speedup:>9.0}×");
    }
}
