//! The selection request and its parsing.
//!
//! Callers of the reference send loosely typed values (`"2"` for an integer, a bare string for a
//! list, `"false"` meaning true by Python truthiness), so params are parsed by hand from a
//! `serde_json::Value`, reproducing those coercions, and every failure names its field. The
//! [`SelectParamsSchema`] struct only describes the canonical shape for JSON Schema consumers.

use std::borrow::Cow;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::PatternError;
use super::render::OutputKind;

/// Upper bound on `variants_requested`: it is the one number that turns directly into lanes, so
/// an absurd value must be refused rather than allocated.
pub const MAX_VARIANTS: i64 = 1024;

/// A parsed request. Field order is the order of the echo in the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PatternRequest {
    pub objective: String,
    pub scopes: Vec<String>,
    pub dependencies: Vec<String>,
    pub risk_level: String,
    pub review_required: bool,
    pub tests_required: bool,
    pub variants_requested: i64,
    pub durable: bool,
    pub persistent_workers: bool,
    pub recovery: bool,
    pub max_parallel_lanes: i64,
    pub notes: Vec<String>,
}

impl PatternRequest {
    /// A request with the reference defaults and the given objective (not validated).
    pub fn new(objective: impl Into<String>) -> Self {
        Self {
            objective: objective.into(),
            scopes: Vec::new(),
            dependencies: Vec::new(),
            risk_level: "normal".to_owned(),
            review_required: true,
            tests_required: false,
            variants_requested: 0,
            durable: false,
            persistent_workers: false,
            recovery: false,
            max_parallel_lanes: 4,
            notes: Vec::new(),
        }
    }

    /// The risk level as every comparison sees it (lowercased; borrowed when it already is).
    pub fn risk(&self) -> Cow<'_, str> {
        let level = &self.risk_level;
        if level
            .bytes()
            .all(|b| b.is_ascii() && !b.is_ascii_uppercase())
        {
            Cow::Borrowed(level)
        } else {
            Cow::Owned(level.to_lowercase())
        }
    }

    /// Checks that hold however the request was built (params, CLI flags, tests).
    pub fn validate(&self) -> Result<(), PatternError> {
        if self.objective.trim().is_empty() {
            return Err(PatternError::new("objective", "must be a non-blank string"));
        }
        if self.max_parallel_lanes < 1 {
            return Err(PatternError::new(
                "max_parallel_lanes",
                format!("must be at least 1, got {}", self.max_parallel_lanes),
            ));
        }
        if self.variants_requested > MAX_VARIANTS {
            return Err(PatternError::new(
                "variants_requested",
                format!(
                    "at most {MAX_VARIANTS} variants can be planned, got {}",
                    self.variants_requested
                ),
            ));
        }
        Ok(())
    }
}

/// Params of a selection call: the request plus the wrapper to render and an optional roster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectParams {
    pub request: PatternRequest,
    pub output: OutputKind,
    pub roster_path: Option<String>,
}

/// Parse params in the reference vocabulary (aliases included). A JSON string holding an object
/// is accepted too, as the reference's tool entry point does.
pub fn parse_params(params: &Value) -> Result<SelectParams, PatternError> {
    let decoded;
    let map = match params {
        Value::Object(map) => map,
        Value::String(text) => {
            decoded = serde_json::from_str::<Value>(text).map_err(|e| {
                PatternError::new(
                    "params",
                    format!("a string request must hold a JSON object: {e}"),
                )
            })?;
            match &decoded {
                Value::Object(map) => map,
                _ => {
                    return Err(PatternError::new(
                        "params",
                        "a string request must decode to a JSON object",
                    ));
                }
            }
        }
        other => {
            return Err(PatternError::new(
                "params",
                format!(
                    "expected an object (or a JSON string holding one), got {}",
                    type_name(other)
                ),
            ));
        }
    };
    parse_map(map)
}

/// The request's fields, found in one pass over its keys (unknown keys are ignored).
#[derive(Default)]
struct Fields<'a> {
    objective: Option<&'a Value>,
    scopes: Option<&'a Value>,
    scope: Option<&'a Value>,
    dependencies: Option<&'a Value>,
    dependency: Option<&'a Value>,
    risk_level: Option<&'a Value>,
    risk: Option<&'a Value>,
    review_required: Option<&'a Value>,
    no_review: Option<&'a Value>,
    tests_required: Option<&'a Value>,
    variants_requested: Option<&'a Value>,
    variant_count: Option<&'a Value>,
    durable: Option<&'a Value>,
    persistent_workers: Option<&'a Value>,
    recovery: Option<&'a Value>,
    max_parallel_lanes: Option<&'a Value>,
    notes: Option<&'a Value>,
    note: Option<&'a Value>,
    output: Option<&'a Value>,
    roster_path: Option<&'a Value>,
}

impl<'a> Fields<'a> {
    fn of(map: &'a Map<String, Value>) -> Self {
        let mut f = Fields::default();
        for (key, value) in map {
            let slot = match key.as_str() {
                "objective" => &mut f.objective,
                "scopes" => &mut f.scopes,
                "scope" => &mut f.scope,
                "dependencies" => &mut f.dependencies,
                "dependency" => &mut f.dependency,
                "risk_level" => &mut f.risk_level,
                "risk" => &mut f.risk,
                "review_required" => &mut f.review_required,
                "no_review" => &mut f.no_review,
                "tests_required" => &mut f.tests_required,
                "variants_requested" => &mut f.variants_requested,
                "variant_count" => &mut f.variant_count,
                "durable" => &mut f.durable,
                "persistent_workers" => &mut f.persistent_workers,
                "recovery" => &mut f.recovery,
                "max_parallel_lanes" => &mut f.max_parallel_lanes,
                "notes" => &mut f.notes,
                "note" => &mut f.note,
                "output" => &mut f.output,
                "roster_path" => &mut f.roster_path,
                _ => continue,
            };
            *slot = Some(value);
        }
        f
    }
}

fn parse_map(map: &Map<String, Value>) -> Result<SelectParams, PatternError> {
    let f = Fields::of(map);
    let mut req = PatternRequest::new(String::new());

    // A missing objective is treated as blank, and so rejected by `validate`.
    if let Some(v) = f.objective {
        req.objective = python_str(v);
    }
    if let Some((key, v)) = pick((f.scopes, "scopes"), (f.scope, "scope")) {
        req.scopes = string_list(key, v)?;
    }
    if let Some((key, v)) = pick(
        (f.dependencies, "dependencies"),
        (f.dependency, "dependency"),
    ) {
        req.dependencies = string_list(key, v)?;
    }
    if let Some((_, v)) =
        pick((f.risk_level, "risk_level"), (f.risk, "risk")).filter(|(_, v)| !v.is_null())
    {
        req.risk_level = python_str(v);
    }
    if let Some(v) = f.review_required {
        req.review_required = truthy(v);
    }
    // `no_review` beats `review_required` when both are present.
    if f.no_review.is_some_and(truthy) {
        req.review_required = false;
    }
    req.tests_required = f.tests_required.is_some_and(truthy);
    if let Some((key, v)) = pick(
        (f.variants_requested, "variants_requested"),
        (f.variant_count, "variant_count"),
    )
    .filter(|(_, v)| !v.is_null())
    {
        req.variants_requested = python_int(key, v)?;
    }
    req.durable = f.durable.is_some_and(truthy);
    req.persistent_workers = f.persistent_workers.is_some_and(truthy);
    req.recovery = f.recovery.is_some_and(truthy);
    if let Some(v) = f.max_parallel_lanes.filter(|v| !v.is_null()) {
        req.max_parallel_lanes = python_int("max_parallel_lanes", v)?;
    }
    if let Some((key, v)) = pick((f.notes, "notes"), (f.note, "note")) {
        req.notes = string_list(key, v)?;
    }

    let output = match f.output {
        None | Some(Value::Null) => OutputKind::ExecutionPlan,
        Some(Value::String(s)) => OutputKind::parse(s).ok_or_else(|| bad_output(s))?,
        Some(other) => return Err(bad_output(&python_str(other))),
    };
    let roster_path = match f.roster_path {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.trim().is_empty() => {
            return Err(PatternError::new("roster_path", "must not be blank"));
        }
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => {
            return Err(PatternError::new(
                "roster_path",
                format!("expected a string path, got {}", type_name(other)),
            ));
        }
    };

    req.validate()?;
    Ok(SelectParams {
        request: req,
        output,
        roster_path,
    })
}

fn bad_output(value: &str) -> PatternError {
    let accepted: Vec<&str> = OutputKind::ACCEPTED_SORTED.to_vec();
    PatternError::new(
        "output",
        format!(
            "unknown output {value:?}; use one of: {}",
            accepted.join(", ")
        ),
    )
}

/// The canonical key if present, else the alias (each with its name, for errors).
fn pick<'a>(
    canonical: (Option<&'a Value>, &'static str),
    alias: (Option<&'a Value>, &'static str),
) -> Option<(&'static str, &'a Value)> {
    let named = |(v, name): (Option<&'a Value>, &'static str)| v.map(|v| (name, v));
    named(canonical).or_else(|| named(alias))
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Python truthiness of a JSON value (so the string "false" is true).
pub fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// `str(value)` as Python would print the decoded JSON value.
pub fn python_str(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => python_repr(other),
    }
}

fn python_repr(v: &Value) -> String {
    match v {
        Value::Null => "None".to_owned(),
        Value::Bool(true) => "True".to_owned(),
        Value::Bool(false) => "False".to_owned(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'")),
        Value::Array(items) => {
            let inner: Vec<String> = items.iter().map(python_repr).collect();
            format!("[{}]", inner.join(", "))
        }
        Value::Object(map) => {
            let inner: Vec<String> = map
                .iter()
                .map(|(k, v)| {
                    format!(
                        "{}: {}",
                        python_repr(&Value::String(k.clone())),
                        python_repr(v)
                    )
                })
                .collect();
            format!("{{{}}}", inner.join(", "))
        }
    }
}

/// A list of strings the way the reference builds one: a bare string is one item, null is
/// empty, an array's items are stringified, an object contributes its keys.
fn string_list(field: &str, v: &Value) -> Result<Vec<String>, PatternError> {
    match v {
        Value::Null => Ok(Vec::new()),
        Value::String(s) => Ok(vec![s.clone()]),
        Value::Array(items) => Ok(items.iter().map(python_str).collect()),
        Value::Object(map) => Ok(map.keys().cloned().collect()),
        other => Err(PatternError::new(
            field,
            format!(
                "expected a string or a list of strings, got {}",
                type_name(other)
            ),
        )),
    }
}

/// `int(value)` with Python's rules, bounded to i64: integral strings like "3" or " -2 " are
/// accepted, "2.5" is not; floats truncate; booleans are 0/1.
fn python_int(field: &str, v: &Value) -> Result<i64, PatternError> {
    let too_large = || PatternError::new(field, "integer is out of range");
    match v {
        Value::Bool(b) => Ok(i64::from(*b)),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Ok(i)
            } else if n.is_u64() {
                Err(too_large())
            } else {
                let f = n.as_f64().unwrap_or(f64::NAN);
                // 2^63 is exactly representable; anything at or beyond it does not fit.
                if f.is_finite() && f.abs() < 9_223_372_036_854_775_808.0_f64 {
                    Ok(f.trunc() as i64)
                } else {
                    Err(too_large())
                }
            }
        }
        Value::String(s) => parse_int_text(s).ok_or_else(|| {
            PatternError::new(field, format!("expected an integer, got the string {s:?}"))
        }),
        other => Err(PatternError::new(
            field,
            format!("expected an integer, got {}", type_name(other)),
        )),
    }
}

/// Python `int(str)`: optional surrounding whitespace and sign, ASCII digits with single
/// underscores between them.
fn parse_int_text(text: &str) -> Option<i64> {
    let t = text.trim();
    let (negative, digits) = match t.as_bytes().first()? {
        b'-' => (true, &t[1..]),
        b'+' => (false, &t[1..]),
        _ => (false, t),
    };
    if digits.is_empty()
        || digits.starts_with('_')
        || digits.ends_with('_')
        || digits.contains("__")
    {
        return None;
    }
    let mut value: i64 = 0;
    for b in digits.bytes() {
        match b {
            b'_' => continue,
            b'0'..=b'9' => {
                let d = i64::from(b - b'0');
                value = value.checked_mul(10)?;
                value = if negative {
                    value.checked_sub(d)?
                } else {
                    value.checked_add(d)?
                };
            }
            _ => return None,
        }
    }
    Some(value)
}

/// The canonical request fields, for JSON Schema generation (MCP tool input, `schema/`).
/// Parsing does not go through this type: see [`parse_params`].
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct PatternRequestSchema {
    /// What the work should achieve. Required and non-blank.
    pub objective: String,
    /// Areas of the codebase the work touches; one lane per scope in a module swarm.
    #[serde(default)]
    pub scopes: Vec<String>,
    /// Ordered prerequisites; each becomes one wave in a phased assembly.
    #[serde(default)]
    pub dependencies: Vec<String>,
    /// `low`, `normal` (default), `high` or `critical`; compared case-insensitively.
    #[serde(default)]
    pub risk_level: Option<String>,
    /// Adds an independent reviewer lane. Defaults to true.
    #[serde(default)]
    pub review_required: Option<bool>,
    /// Asks for test evidence in the proof expectations.
    #[serde(default)]
    pub tests_required: Option<bool>,
    /// Number of alternative designs wanted (values above 1 mean a blueprint fan-out).
    #[serde(default)]
    pub variants_requested: Option<i64>,
    /// Track the work as a durable task graph.
    #[serde(default)]
    pub durable: Option<bool>,
    /// Map lanes onto named workers from the roster.
    #[serde(default)]
    pub persistent_workers: Option<bool>,
    /// The work repairs or resumes something that failed.
    #[serde(default)]
    pub recovery: Option<bool>,
    /// Most lanes that may run at once (at least 1; default 4).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub max_parallel_lanes: Option<i64>,
    /// Free-form notes; `pattern:<name>` forces a pattern.
    #[serde(default)]
    pub notes: Vec<String>,
}

/// Params of `patterns/select`: the request, the wrapper to render and an optional roster file.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct SelectParamsSchema {
    #[serde(flatten)]
    pub request: PatternRequestSchema,
    /// Which wrapper to return; default `execution_plan`.
    #[serde(default)]
    pub output: Option<OutputKindSchema>,
    /// Roster YAML to map persistent workers from (relative paths resolve in the workspace).
    #[serde(default)]
    pub roster_path: Option<String>,
}

/// The accepted `output` values (deprecated ones included).
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OutputKindSchema {
    Select,
    ExecutionPlan,
    PromptBundle,
    EphemeralWorkers,
    PersistentWorkers,
    TaskGraph,
    Delegate,
    Swarm,
    Kanban,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_match_the_reference() {
        let p = parse_params(&json!({"objective": "x"})).unwrap();
        assert_eq!(p.request, PatternRequest::new("x"));
        assert!(p.request.review_required);
        assert_eq!(p.output, OutputKind::ExecutionPlan);
    }

    #[test]
    fn coercions_follow_python() {
        let p = parse_params(&json!({
            "objective": null, "scope": "router", "max_parallel_lanes": "2",
            "review_required": "false", "variant_count": 2.9, "notes": {"a": 1}
        }))
        .unwrap();
        assert_eq!(p.request.objective, "None");
        assert_eq!(p.request.scopes, vec!["router"]);
        assert_eq!(p.request.max_parallel_lanes, 2);
        assert!(p.request.review_required);
        assert_eq!(p.request.variants_requested, 2);
        assert_eq!(p.request.notes, vec!["a"]);
    }

    #[test]
    fn errors_name_the_field() {
        let field = |v: Value| parse_params(&v).unwrap_err().field;
        assert_eq!(field(json!({"objective": "  "})), "objective");
        assert_eq!(field(json!({"scopes": ["a"]})), "objective");
        assert_eq!(
            field(json!({"objective": "x", "max_parallel_lanes": "2.5"})),
            "max_parallel_lanes"
        );
        assert_eq!(
            field(json!({"objective": "x", "max_parallel_lanes": 0})),
            "max_parallel_lanes"
        );
        assert_eq!(field(json!({"objective": "x", "scope": 3})), "scope");
        assert_eq!(
            field(json!({"objective": "x", "output": "execute"})),
            "output"
        );
        assert_eq!(
            field(json!({"objective": "x", "variants_requested": 1e30})),
            "variants_requested"
        );
        assert_eq!(
            field(json!({"objective": "x", "variants_requested": 5000})),
            "variants_requested"
        );
        assert_eq!(
            field(json!({"objective": "x", "roster_path": 1})),
            "roster_path"
        );
        assert_eq!(field(json!([1, 2])), "params");
    }

    #[test]
    fn no_review_beats_review_required_and_canonical_beats_alias() {
        let p = parse_params(
            &json!({"objective": "x", "review_required": true, "no_review": 1,
            "scopes": ["a"], "scope": ["b"]}),
        )
        .unwrap();
        assert!(!p.request.review_required);
        assert_eq!(p.request.scopes, vec!["a"]);
        // Every alias is read when its canonical key is absent, and loses when both are given.
        let alone = parse_params(
            &json!({"objective": "x", "scope": ["s"], "dependency": ["d"],
            "risk": "High", "variant_count": 3, "note": ["n"], "unknown": 1}),
        )
        .unwrap()
        .request;
        assert_eq!(
            (&alone.scopes, &alone.dependencies, &alone.notes),
            (
                &vec!["s".to_string()],
                &vec!["d".to_string()],
                &vec!["n".to_string()]
            )
        );
        assert_eq!((alone.risk(), alone.variants_requested), ("high".into(), 3));
        let both = parse_params(
            &json!({"objective": "x", "dependencies": ["D"], "dependency": ["d"],
            "risk_level": "low", "risk": "high", "variants_requested": 2, "variant_count": 3,
            "notes": ["N"], "note": ["n"]}),
        )
        .unwrap()
        .request;
        assert_eq!(
            (
                &both.dependencies,
                &both.notes,
                both.risk(),
                both.variants_requested
            ),
            (
                &vec!["D".to_string()],
                &vec!["N".to_string()],
                "low".into(),
                2
            )
        );
        // A null canonical key still hides its alias.
        let null = parse_params(&json!({"objective": "x", "risk_level": null, "risk": "high"}))
            .unwrap()
            .request;
        assert_eq!(null.risk(), PatternRequest::new("x").risk());
        assert_eq!(
            PatternRequest {
                risk_level: "crİtical".into(),
                ..PatternRequest::new("x")
            }
            .risk(),
            "crİtical".to_lowercase()
        );
    }

    #[test]
    fn string_params_must_hold_an_object() {
        assert!(parse_params(&json!("{\"objective\": \"x\"}")).is_ok());
        assert_eq!(parse_params(&json!("[1]")).unwrap_err().field, "params");
        assert_eq!(parse_params(&json!("nope")).unwrap_err().field, "params");
    }

    #[test]
    fn schema_requires_objective_and_lists_outputs() {
        let schema = serde_json::to_value(schemars::schema_for!(SelectParamsSchema)).unwrap();
        assert_eq!(schema["required"], json!(["objective"]));
        let props = schema["properties"].as_object().unwrap();
        for key in [
            "objective",
            "scopes",
            "max_parallel_lanes",
            "notes",
            "output",
            "roster_path",
        ] {
            assert!(props.contains_key(key), "{key} missing from {schema}");
        }
        let text = schema.to_string();
        for value in OutputKind::ACCEPTED_SORTED {
            assert!(text.contains(&format!("\"{value}\"")), "{value}");
        }
    }

    #[test]
    fn int_text_parsing() {
        assert_eq!(parse_int_text(" -12 "), Some(-12));
        assert_eq!(parse_int_text("1_000"), Some(1000));
        assert_eq!(parse_int_text("1__0"), None);
        assert_eq!(parse_int_text("2.5"), None);
        assert_eq!(parse_int_text("99999999999999999999"), None);
    }
}
