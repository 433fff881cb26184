//! The provider adapter contract and the registry that checks adapters against their
//! provider's catalog at start.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::policy::Classification;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Risk {
    Low,
    Medium,
    High,
    Critical,
}

/// A JSON Schema in a catalog entry: given as JSON (an external provider's), or generated from
/// a Rust type when first read (a built-in provider's: generating them all at every open was
/// ~5% of a serving process's CPU from exec to its first reply). Clones share one copy.
#[derive(Clone)]
pub struct SchemaDoc(Arc<SchemaSource>);

enum SchemaSource {
    Given(Value),
    Generated(fn() -> Value, std::sync::OnceLock<Value>),
}

impl SchemaDoc {
    /// The schema of `T`, generated when first read.
    pub fn of<T: JsonSchema>() -> SchemaDoc {
        fn generate<T: JsonSchema>() -> Value {
            crate::rpc::router::schema_of::<T>().to_value()
        }
        SchemaDoc(Arc::new(SchemaSource::Generated(
            generate::<T>,
            std::sync::OnceLock::new(),
        )))
    }

    /// Whether the schema is a JSON object. A generated one is (the types of built-in providers
    /// are structs: `builtin_schemas_are_objects` holds it) and is not generated to say so.
    pub fn is_object(&self) -> bool {
        match &*self.0 {
            SchemaSource::Given(v) => v.is_object(),
            SchemaSource::Generated(..) => true,
        }
    }

    pub fn value(&self) -> &Value {
        match &*self.0 {
            SchemaSource::Given(v) => v,
            SchemaSource::Generated(make, v) => v.get_or_init(*make),
        }
    }
}

impl From<Value> for SchemaDoc {
    fn from(v: Value) -> Self {
        SchemaDoc(Arc::new(SchemaSource::Given(v)))
    }
}

impl PartialEq for SchemaDoc {
    /// Two schemas of the same generator are equal without generating either; otherwise
    /// their JSON is compared.
    fn eq(&self, other: &Self) -> bool {
        if Arc::ptr_eq(&self.0, &other.0) {
            return true;
        }
        if let (SchemaSource::Generated(a, _), SchemaSource::Generated(b, _)) =
            (&*self.0, &*other.0)
            && std::ptr::fn_addr_eq(*a, *b)
        {
            return true;
        }
        self.value() == other.value()
    }
}

impl std::fmt::Debug for SchemaDoc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.value().fmt(f)
    }
}

impl Serialize for SchemaDoc {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.value().serialize(s)
    }
}

impl<'de> Deserialize<'de> for SchemaDoc {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Value::deserialize(d).map(SchemaDoc::from)
    }
}

impl JsonSchema for SchemaDoc {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        Value::schema_name()
    }
    fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        Value::json_schema(g)
    }
    fn inline_schema() -> bool {
        Value::inline_schema()
    }
}

/// One catalog entry: what an operation is and the JSON Schemas of its target and arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Descriptor {
    /// `family.verb`, lower snake-case segments.
    pub name: String,
    pub provider: String,
    pub operation_revision: u32,
    pub summary: String,
    pub risk: Risk,
    pub target_kind: String,
    pub target_schema: SchemaDoc,
    pub arguments_schema: SchemaDoc,
    /// How long a request may wait for a human.
    pub request_ttl_seconds: u64,
    /// How long an approval stays usable.
    pub approval_ttl_seconds: u64,
    /// Always ask a human, even when a static allow rule matches.
    #[serde(default)]
    pub requires_approval: bool,
    /// Catalog entries may be listed before they are implemented; only implemented ones need
    /// an adapter.
    #[serde(default = "yes")]
    pub implemented: bool,
}

fn yes() -> bool {
    true
}

impl Descriptor {
    /// Checks the shape rules every catalog entry must follow.
    pub fn validate(&self) -> Result<(), String> {
        let seg_ok = |s: &str| {
            !s.is_empty()
                && s.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        };
        let segs: Vec<&str> = self.name.split('.').collect();
        if segs.len() < 2 || !segs.iter().all(|s| seg_ok(s)) || self.name.len() > 128 {
            return Err(format!(
                "operation name {:?} must be family.verb in lower snake case",
                self.name
            ));
        }
        if self.operation_revision == 0 {
            return Err(format!(
                "{}: operation_revision must be positive",
                self.name
            ));
        }
        if self.summary.trim().is_empty() {
            return Err(format!("{}: summary must not be empty", self.name));
        }
        if self.request_ttl_seconds == 0 || self.approval_ttl_seconds == 0 {
            return Err(format!("{}: TTLs must be positive", self.name));
        }
        for (what, s) in [
            ("target_schema", &self.target_schema),
            ("arguments_schema", &self.arguments_schema),
        ] {
            if !s.is_object() {
                return Err(format!(
                    "{}: {what} must be a JSON Schema object",
                    self.name
                ));
            }
        }
        Ok(())
    }
}

/// Canonical target and arguments after closed-schema decoding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decoded {
    pub target: Value,
    pub arguments: Value,
}

/// The provider part of a plan: decoded input plus the preconditions pinned by `resolve`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Resolved {
    pub target: Value,
    pub arguments: Value,
    pub preconditions: Value,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Presentation {
    pub title: String,
    pub summary: String,
}

impl Presentation {
    /// Bounds every provider's presentation (title 1..=160, summary <= 500 characters). A cut
    /// says so, with how much was left out: the operator must never take a part for the whole
    /// (the approval's detail shows the plan in full).
    pub fn bounded(self) -> Result<Presentation, AdapterError> {
        let title = cut_marked(self.title, 160);
        if title.is_empty() {
            return Err(AdapterError::input(
                None,
                "the provider gave an empty title",
            ));
        }
        Ok(Presentation {
            title,
            summary: cut_marked(self.summary, 500),
        })
    }
}

/// `s` trimmed and, past `n` characters, cut so that with the note saying how many characters
/// were left out it is at most `n` characters long.
fn cut_marked(s: String, n: usize) -> String {
    let s = trimmed(s);
    let total = s.chars().count();
    if total <= n {
        return s;
    }
    // The note's own length depends on the count it names: size it for the largest count.
    let note = |left: usize| format!(" … [{left} more characters: see the whole plan]");
    let keep = n.saturating_sub(note(total).chars().count());
    let mut out: String = s.chars().take(keep).collect();
    out.push_str(&note(total - keep));
    out
}

/// `s` trimmed, without a copy when it has nothing to trim.
fn trimmed(s: String) -> String {
    let t = s.trim();
    if t.len() == s.len() { s } else { t.to_string() }
}

/// Result of an execution or a read-back. Only `proven` outcomes count as success.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Outcome {
    pub proven: bool,
    #[serde(default)]
    pub result: Option<Value>,
    #[serde(default)]
    pub upstream_status: Option<u16>,
}

/// Refusal before anything ran: bad input, failed precondition, provider trouble.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct AdapterError {
    pub code: String,
    /// Shown to agents: must not carry secrets or raw upstream text.
    pub message: String,
    /// Dotted path of the offending input field, when one is to blame.
    pub field: Option<String>,
}

impl AdapterError {
    pub fn input(field: Option<&str>, message: impl Into<String>) -> AdapterError {
        AdapterError {
            code: super::lifecycle::codes::INPUT_INVALID.into(),
            message: message.into(),
            field: field.map(str::to_string),
        }
    }
    pub fn coded(code: &str, message: impl Into<String>) -> AdapterError {
        AdapterError {
            code: code.into(),
            message: message.into(),
            field: None,
        }
    }
}

/// How much an execution error tells about upstream state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// Nothing was started: the approval's use is released.
    NotStarted,
    /// The upstream refused: nothing changed, the use is spent.
    Definitive,
    /// Something may have changed: reconcile before deciding.
    PossiblyPartial,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ExecError {
    pub kind: FailureKind,
    pub code: String,
    pub message: String,
}

impl ExecError {
    pub fn new(kind: FailureKind, code: &str, message: impl Into<String>) -> ExecError {
        ExecError {
            kind,
            code: code.into(),
            message: message.into(),
        }
    }
    pub fn is_possibly_partial(&self) -> bool {
        self.kind == FailureKind::PossiblyPartial
    }
}

/// What an adapter may use while resolving, executing or reconciling.
#[derive(Debug, Clone)]
pub struct AdapterCtx {
    pub workspace_root: PathBuf,
    pub operation_id: String,
    pub client_id: String,
    /// Whether processes this execution starts are sandboxed (the trusted policy's word).
    pub sandbox: crate::sandbox::Setting,
}

/// A provider's implementation of one catalog operation.
///
/// `decode` does closed-schema validation and canonicalisation without touching anything
/// outside its arguments (an external provider answers it over its pipe, nothing else);
/// `resolve` may read upstream to pin preconditions; `execute` performs the mutation once;
/// `reconcile` only reads back.
pub trait Adapter: Send + Sync {
    fn descriptor(&self) -> &Descriptor;
    fn decode<'a>(
        &'a self,
        target: &'a Value,
        arguments: &'a Value,
    ) -> BoxFuture<'a, Result<Decoded, AdapterError>>;
    /// Optional client binding: refuse inputs that reference things another client owns.
    fn validate_client(
        &self,
        _input: &Decoded,
        _client: &str,
        _idempotency_key: &str,
    ) -> Result<(), AdapterError> {
        Ok(())
    }
    fn resolve<'a>(
        &'a self,
        ctx: &'a AdapterCtx,
        input: Decoded,
    ) -> BoxFuture<'a, Result<Resolved, AdapterError>>;
    fn authorize<'a>(
        &'a self,
        plan: &'a Resolved,
    ) -> BoxFuture<'a, Result<Classification, AdapterError>>;
    fn present<'a>(
        &'a self,
        plan: &'a Resolved,
    ) -> BoxFuture<'a, Result<Presentation, AdapterError>>;
    fn execute<'a>(
        &'a self,
        ctx: &'a AdapterCtx,
        plan: &'a Resolved,
    ) -> BoxFuture<'a, Result<Outcome, ExecError>>;
    fn reconcile<'a>(
        &'a self,
        ctx: &'a AdapterCtx,
        plan: &'a Resolved,
    ) -> BoxFuture<'a, Result<Outcome, ExecError>>;
    /// Optional: drop transient material once the operation is terminal.
    fn cleanup<'a>(&'a self, _ctx: &'a AdapterCtx, _plan: &'a Resolved) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
}

/// A provider's list of operations, as the provider itself declares it.
#[derive(Debug, Clone)]
pub struct Catalog {
    pub provider: String,
    pub descriptors: Vec<Descriptor>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("catalog {provider}: {message}")]
    InvalidCatalog { provider: String, message: String },
    #[error("operation {0} is declared by more than one catalog or adapter")]
    Duplicate(String),
    #[error("adapter for {0} is not in its provider's catalog")]
    NotCataloged(String),
    #[error("adapter for {0} drifted from its catalog entry")]
    Drift(String),
    #[error("catalog operations without an adapter: {}", .0.join(", "))]
    Uncovered(Vec<String>),
}

/// Immutable map from operation name to adapter, validated against the catalogs.
#[derive(Clone, Default)]
pub struct Registry {
    adapters: BTreeMap<String, Arc<dyn Adapter>>,
    catalog: BTreeMap<String, Descriptor>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("operations", &self.adapters.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Registry {
    pub fn new(
        catalogs: &[Catalog],
        adapters: Vec<Arc<dyn Adapter>>,
    ) -> Result<Registry, RegistryError> {
        let mut catalog = BTreeMap::new();
        for c in catalogs {
            for d in &c.descriptors {
                d.validate()
                    .map_err(|message| RegistryError::InvalidCatalog {
                        provider: c.provider.clone(),
                        message,
                    })?;
                if d.provider != c.provider {
                    return Err(RegistryError::InvalidCatalog {
                        provider: c.provider.clone(),
                        message: format!("{} names provider {}", d.name, d.provider),
                    });
                }
                if catalog.insert(d.name.clone(), d.clone()).is_some() {
                    return Err(RegistryError::Duplicate(d.name.clone()));
                }
            }
        }
        let mut by_name: BTreeMap<String, Arc<dyn Adapter>> = BTreeMap::new();
        for a in adapters {
            let d = a.descriptor();
            let Some(entry) = catalog.get(&d.name) else {
                return Err(RegistryError::NotCataloged(d.name.clone()));
            };
            if entry != d {
                return Err(RegistryError::Drift(d.name.clone()));
            }
            if by_name.insert(d.name.clone(), a.clone()).is_some() {
                return Err(RegistryError::Duplicate(d.name.clone()));
            }
        }
        let missing: Vec<String> = catalog
            .values()
            .filter(|d| d.implemented && !by_name.contains_key(&d.name))
            .map(|d| d.name.clone())
            .collect();
        if !missing.is_empty() {
            return Err(RegistryError::Uncovered(missing));
        }
        Ok(Registry {
            adapters: by_name,
            catalog,
        })
    }

    pub fn lookup(&self, name: &str) -> Option<&Arc<dyn Adapter>> {
        self.adapters.get(name)
    }

    /// Sorted operation names that have an adapter.
    pub fn names(&self) -> Vec<&str> {
        self.adapters.keys().map(String::as_str).collect()
    }

    /// Every catalog entry, sorted by name.
    pub fn descriptors(&self) -> impl Iterator<Item = &Descriptor> {
        self.catalog.values()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn generated(d: &SchemaDoc) -> bool {
        match &*d.0 {
            SchemaSource::Given(_) => true,
            SchemaSource::Generated(_, v) => v.get().is_some(),
        }
    }

    #[test]
    fn builtin_schemas_are_objects() {
        use crate::operations::adapters::{command, plan, worker, workspace};
        for c in [
            command::catalog(),
            plan::catalog(),
            worker::catalog(),
            workspace::catalog(),
        ] {
            for d in c.descriptors {
                for s in [&d.target_schema, &d.arguments_schema] {
                    assert!(s.value().is_object(), "{}: {:?}", d.name, s);
                }
            }
        }
    }

    #[test]
    fn a_type_schema_is_generated_only_when_read_and_equals_its_json() {
        let a = SchemaDoc::of::<Presentation>();
        let b = SchemaDoc::of::<Presentation>();
        assert_eq!(a, b, "same generator");
        assert!(
            !generated(&a) && !generated(&b),
            "comparing generated nothing"
        );
        let json = crate::rpc::router::schema_of::<Presentation>().to_value();
        let given = SchemaDoc::from(json.clone());
        assert_eq!(a, given, "a generated schema equals the same JSON given");
        assert!(generated(&a));
        assert_ne!(SchemaDoc::of::<Resolved>(), given);
        assert_eq!(serde_json::to_value(&b).expect("serializes"), json);
        let back: SchemaDoc = serde_json::from_value(json.clone()).expect("deserializes");
        assert_eq!(back.value(), &json);
    }

    /// A minimal adapter used to exercise the registry rules.
    pub(crate) struct Fixed(pub Descriptor);

    impl Adapter for Fixed {
        fn descriptor(&self) -> &Descriptor {
            &self.0
        }
        fn decode<'a>(
            &'a self,
            target: &'a Value,
            arguments: &'a Value,
        ) -> BoxFuture<'a, Result<Decoded, AdapterError>> {
            Box::pin(async move {
                Ok(Decoded {
                    target: target.clone(),
                    arguments: arguments.clone(),
                })
            })
        }
        fn resolve<'a>(
            &'a self,
            _ctx: &'a AdapterCtx,
            input: Decoded,
        ) -> BoxFuture<'a, Result<Resolved, AdapterError>> {
            Box::pin(async move {
                Ok(Resolved {
                    target: input.target,
                    arguments: input.arguments,
                    preconditions: Value::Null,
                })
            })
        }
        fn authorize<'a>(
            &'a self,
            _plan: &'a Resolved,
        ) -> BoxFuture<'a, Result<Classification, AdapterError>> {
            Box::pin(async { Ok(Classification::default()) })
        }
        fn present<'a>(
            &'a self,
            _plan: &'a Resolved,
        ) -> BoxFuture<'a, Result<Presentation, AdapterError>> {
            Box::pin(async {
                Ok(Presentation {
                    title: "t".into(),
                    summary: String::new(),
                })
            })
        }
        fn execute<'a>(
            &'a self,
            _ctx: &'a AdapterCtx,
            _plan: &'a Resolved,
        ) -> BoxFuture<'a, Result<Outcome, ExecError>> {
            Box::pin(async {
                Err(ExecError::new(
                    FailureKind::PossiblyPartial,
                    "x",
                    "upstream timed out",
                ))
            })
        }
        fn reconcile<'a>(
            &'a self,
            _ctx: &'a AdapterCtx,
            _plan: &'a Resolved,
        ) -> BoxFuture<'a, Result<Outcome, ExecError>> {
            Box::pin(async { Ok(Outcome::default()) })
        }
    }

    pub(crate) fn desc(name: &str, provider: &str) -> Descriptor {
        Descriptor {
            name: name.into(),
            provider: provider.into(),
            operation_revision: 1,
            summary: "does a thing".into(),
            risk: Risk::Low,
            target_kind: "thing".into(),
            target_schema: serde_json::json!({"type": "object"}).into(),
            arguments_schema: serde_json::json!({"type": "object"}).into(),
            request_ttl_seconds: 60,
            approval_ttl_seconds: 60,
            requires_approval: false,
            implemented: true,
        }
    }

    #[test]
    fn registry_enforces_the_catalog_contract() {
        let cat = Catalog {
            provider: "p".into(),
            descriptors: vec![desc("a.one", "p"), desc("a.two", "p")],
        };
        let ok = Registry::new(
            std::slice::from_ref(&cat),
            vec![
                Arc::new(Fixed(desc("a.two", "p"))),
                Arc::new(Fixed(desc("a.one", "p"))),
            ],
        )
        .unwrap();
        assert_eq!(ok.names(), vec!["a.one", "a.two"]);
        assert!(ok.lookup("a.one").is_some());
        assert!(ok.lookup("a.three").is_none());

        let dup = Registry::new(
            std::slice::from_ref(&cat),
            vec![
                Arc::new(Fixed(desc("a.one", "p"))),
                Arc::new(Fixed(desc("a.one", "p"))),
                Arc::new(Fixed(desc("a.two", "p"))),
            ],
        );
        assert_eq!(dup.unwrap_err(), RegistryError::Duplicate("a.one".into()));

        let mut drifted = desc("a.one", "p");
        drifted.operation_revision = 2;
        let drift = Registry::new(
            std::slice::from_ref(&cat),
            vec![
                Arc::new(Fixed(drifted)),
                Arc::new(Fixed(desc("a.two", "p"))),
            ],
        );
        assert_eq!(drift.unwrap_err(), RegistryError::Drift("a.one".into()));

        let uncovered = Registry::new(
            std::slice::from_ref(&cat),
            vec![Arc::new(Fixed(desc("a.one", "p")))],
        );
        assert_eq!(
            uncovered.unwrap_err(),
            RegistryError::Uncovered(vec!["a.two".into()])
        );

        let stray = Registry::new(
            std::slice::from_ref(&cat),
            vec![
                Arc::new(Fixed(desc("a.one", "p"))),
                Arc::new(Fixed(desc("a.two", "p"))),
                Arc::new(Fixed(desc("b.one", "p"))),
            ],
        );
        assert_eq!(
            stray.unwrap_err(),
            RegistryError::NotCataloged("b.one".into())
        );

        let two_catalogs = Registry::new(
            &[
                cat.clone(),
                Catalog {
                    provider: "q".into(),
                    descriptors: vec![desc("a.one", "q")],
                },
            ],
            vec![],
        );
        assert_eq!(
            two_catalogs.unwrap_err(),
            RegistryError::Duplicate("a.one".into())
        );

        let mut unimplemented = desc("a.two", "p");
        unimplemented.implemented = false;
        let partial = Registry::new(
            &[Catalog {
                provider: "p".into(),
                descriptors: vec![desc("a.one", "p"), unimplemented],
            }],
            vec![Arc::new(Fixed(desc("a.one", "p")))],
        );
        assert!(partial.is_ok());

        let bad = Registry::new(
            &[Catalog {
                provider: "p".into(),
                descriptors: vec![desc("Bad", "p")],
            }],
            vec![],
        );
        assert!(matches!(bad, Err(RegistryError::InvalidCatalog { .. })));
    }

    #[test]
    fn possibly_partial_errors_are_marked() {
        let e = ExecError::new(FailureKind::PossiblyPartial, "c", "m");
        assert!(e.is_possibly_partial());
        assert!(!ExecError::new(FailureKind::Definitive, "c", "m").is_possibly_partial());
        let p = Presentation {
            title: "  ".into(),
            summary: String::new(),
        };
        assert!(p.bounded().is_err());
        let long = Presentation {
            title: "x".repeat(300),
            summary: "y".repeat(900),
        }
        .bounded()
        .unwrap();
        // A cut says how much it left out, and the whole stays within the bound.
        for (text, total, bound) in [(&long.title, 300, 160), (&long.summary, 900, 500)] {
            assert!(text.chars().count() <= bound, "{text}");
            let kept = text.chars().take_while(|c| *c == 'x' || *c == 'y').count();
            assert!(
                text.ends_with(&format!(
                    " … [{} more characters: see the whole plan]",
                    total - kept
                )),
                "{text}"
            );
        }
        // Trimmed first, then cut by characters, never inside one.
        let wide = Presentation {
            title: format!("  {}  ", "é".repeat(200)),
            summary: " ok ".into(),
        }
        .bounded()
        .unwrap();
        assert!(wide.title.chars().count() <= 160);
        assert!(wide.title.starts_with('é') && wide.title.contains("more characters"));
        assert_eq!(wide.summary, "ok");
        let fits = Presentation {
            title: "é".repeat(160),
            summary: "z".repeat(500),
        }
        .bounded()
        .unwrap();
        assert_eq!(fits.title, "é".repeat(160));
        assert_eq!(fits.summary, "z".repeat(500));
    }
}
