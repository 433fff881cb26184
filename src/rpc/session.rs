//! One client connection: reads frames, dispatches them through the router, writes replies.
//!
//! Ordering rules: notifications are handled in arrival order on the reader loop; requests that
//! write are applied one after another in arrival order; reads run concurrently but each waits
//! until every write that arrived before it has finished. Cancellation (`$/cancelRequest`, MCP
//! `notifications/cancelled`) is handled the moment it is read: the caller gets -32800 at once.
//! A read is dropped; a write that has not started never runs; a write already running is left
//! to finish (its durable record is never cut in half) and its result is discarded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Map, Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::codec::{FramedRead, FramedWrite};
use tokio_util::sync::CancellationToken;

use crate::fanout::{RecvError, TryRecvError};
use crate::json_out::Raw;

use super::framing::{Codec, Frame, FrameError, Framing};
use super::outbox::{Message, Outbox, OutboxReceiver, outbox};
use serde_json::value::RawValue;

use super::message::{
    Id, Incoming, RpcError, classify, codes, encode, notification, recover_id, reply_err, reply_ok,
    reply_ok_raw, reply_ok_spliced, reply_ok_writing,
};
use super::router::{
    Access, Audience, CallCtx, ClientInfo, Profile, Progress, ProgressStyle, Role, Router,
};

/// MCP protocol revisions answered by `initialize` (newest first).
pub const MCP_HANDSHAKE_VERSIONS: &[&str] =
    &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];
/// The stateless MCP revision: no handshake, `_meta` on every request, `server/discover`.
pub const MCP_STATELESS_VERSION: &str = "2026-07-28";
const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";

/// A server-pushed notification as the host hands it to the session.
#[derive(Clone, Debug)]
pub struct Push {
    pub method: String,
    pub params: Value,
    pub operators_only: bool,
}

/// What the session needs from the program around it.
pub trait Host: Send + Sync + 'static {
    type State: Send + Sync + 'static;
    /// The host's notification type, turned into a [`Push`] by [`Host::push`].
    type Notice: Clone + Send + 'static;
    /// Opens the state this connection works on. Called once: at `initialize` with its params
    /// (so an LSP `rootUri` can choose the workspace) or before the first other request.
    fn attach(&self, init: Option<&Value>) -> Result<Arc<Self::State>, RpcError>;
    /// The identity a connection proves (a credential the operator issued, presented in the
    /// initialize params or given to the process), or the shared anonymous identity. A name
    /// the client picks for itself is never an identity.
    fn identify(
        &self,
        state: &Self::State,
        init: &Value,
        profile: Profile,
    ) -> Result<String, RpcError>;
    /// A fresh operator-login challenge for this connection (its exact text is signed).
    fn login_challenge(&self, state: &Self::State, connection_id: &str)
    -> Result<String, RpcError>;
    /// The identity `initialize` can answer with before the state is open (no credential to
    /// verify), or `None` when identifying needs the state. `Err` when the params choose
    /// nothing that could be opened (a root that is no directory). With `Some`, the session
    /// replies first and attaches right after the reply is written: the client does not wait
    /// for the workspace to open.
    fn identify_early(&self, init: &Value) -> Result<Option<String>, RpcError>;
    /// Checks the operator's signature over the challenge this connection was given.
    fn login_verify(
        &self,
        state: &Self::State,
        challenge: &str,
        signature: &str,
    ) -> Result<(), RpcError>;
    /// Notifications for clients of `state` (from this process and from other processes).
    fn subscribe(&self, state: &Self::State) -> crate::fanout::Subscription<Self::Notice>;
    /// Whether a connection established as `client` (`None`: not yet identified, so
    /// anonymous) may receive `notice`: what its own requests would be shown. Operators get
    /// what [`Host::operator_visible`] passes.
    fn visible(&self, state: &Self::State, client: Option<&str>, notice: &Self::Notice) -> bool;
    /// Whether an operator connection is sent `notice`: what the operator's own listings
    /// would show.
    fn operator_visible(&self, state: &Self::State, notice: &Self::Notice) -> bool;
    fn push(notice: Self::Notice) -> Push;
    /// Server name and version for `serverInfo`.
    fn server_info(&self) -> (&'static str, &'static str);
    /// Short guidance for MCP hosts.
    fn instructions(&self) -> &'static str;
    /// Called once when the session ends (after in-flight requests), to wind down whatever
    /// the state runs on this connection's behalf.
    fn detach(&self, state: Arc<Self::State>) -> impl std::future::Future<Output = ()> + Send;
}

/// How to choose the profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProfileChoice {
    /// Sniff framing from the first byte; NDJSON speaking MCP becomes the MCP profile.
    Auto,
    Lsp,
    Jsonl,
    Mcp,
}

/// How a session ended.
#[derive(Debug, PartialEq, Eq)]
pub struct SessionEnd {
    /// Process exit code: LSP says 0 only after `shutdown`; other profiles end cleanly with 0.
    pub exit_code: i32,
}

/// Requests in flight at once; past this the reader waits, which pushes back on the client
/// instead of buffering without bound.
const MAX_IN_FLIGHT: usize = 4096;

/// Replies queued for a client that is not reading, past which no more requests are read.
const MAX_QUEUED_BYTES: usize = 4 * 1024 * 1024;

struct Shared<H: Host> {
    host: Arc<H>,
    router: Arc<Router<H::State>>,
    /// Encoded messages for the writer.
    out: Outbox,
    pending: Mutex<HashMap<Id, CancellationToken>>,
    /// Count of finished writes; writes are numbered in arrival order.
    writes_done: watch::Sender<u64>,
    in_flight: Arc<tokio::sync::Semaphore>,
    /// Cancelled when the session ends, so helpers holding `out` let the writer finish.
    closing: CancellationToken,
    /// The MCP tool list, built on first use.
    tools: std::sync::OnceLock<Tools>,
}

/// MCP tools as listed, and which ones wrap a non-object result as `{"result": …}`.
struct Tools {
    /// Tool names, for the error that names the known ones.
    names: Vec<&'static str>,
    /// The `tools/list` result, encoded once: plain, and with the 2026-07-28 cache fields.
    result: Box<serde_json::value::RawValue>,
    stateless_result: Box<serde_json::value::RawValue>,
    wrapped: std::collections::HashSet<&'static str>,
}

struct Conn<H: Host> {
    shared: Arc<Shared<H>>,
    choice: ProfileChoice,
    framing: Framing,
    profile: Option<Profile>,
    client: Option<Arc<ClientInfo>>,
    /// The identity the notification forwarder filters by, kept equal to `client`.
    viewer: Arc<Mutex<Option<String>>>,
    /// Set once the connection proved the operator key; read by the notification forwarder.
    operator: Arc<std::sync::atomic::AtomicBool>,
    /// The login challenge this connection was last given.
    challenge: Option<String>,
    connection_id: String,
    /// The identity of a stateless MCP connection (no `initialize`).
    stateless_client: Option<Arc<ClientInfo>>,
    state: Option<Arc<H::State>>,
    /// `initialize` params kept for an attach that follows the reply (and is retried, with the
    /// same params, by the next request if it failed).
    deferred_init: Option<Value>,
    /// Set by an `initialize` answered before attaching: attach once the reply is out.
    attach_after_reply: bool,
    shutdown: bool,
    writes_issued: u64,
    tasks: JoinSet<()>,
    /// Forwards domain notifications to this client.
    forwarder: Option<tokio::task::JoinHandle<()>>,
}

/// Serves one connection until EOF or LSP `exit`.
pub async fn serve<H, R, W>(
    host: Arc<H>,
    router: Arc<Router<H::State>>,
    choice: ProfileChoice,
    mut input: R,
    output: W,
) -> std::io::Result<SessionEnd>
where
    H: Host,
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let Some((framing, head)) = sniff_framing(choice, &mut input).await? else {
        return Ok(SessionEnd { exit_code: 0 });
    };
    tracing::debug!(?framing, "framing chosen");

    let (out_tx, out_rx) = outbox();
    let writer = tokio::spawn(write_loop(output, framing, out_rx));
    // The sniffed bytes go back in front of the stream.
    let reader = FramedRead::new(std::io::Cursor::new(head).chain(input), Codec::new(framing));
    let mut conn = Conn::new(host, router, choice, framing, out_tx);
    let exit_requested = conn.read_requests(reader).await;
    let exit_code = conn.wind_down(exit_requested).await;
    match writer.await {
        Ok(result) => result?,
        Err(e) => tracing::error!(error = %e, "writer task failed"),
    }
    Ok(SessionEnd { exit_code })
}

/// The framing a connection speaks: forced by the profile choice, else read from its first
/// non-blank byte. Returns the bytes read to decide (they are the stream's start), or `None`
/// when input ended first.
async fn sniff_framing<R: AsyncRead + Unpin>(
    choice: ProfileChoice,
    input: &mut R,
) -> std::io::Result<Option<(Framing, Vec<u8>)>> {
    let mut head = Vec::new();
    match choice {
        ProfileChoice::Lsp => return Ok(Some((Framing::ContentLength, head))),
        ProfileChoice::Jsonl | ProfileChoice::Mcp => return Ok(Some((Framing::Ndjson, head))),
        ProfileChoice::Auto => {}
    }
    loop {
        let mut buf = [0u8; 4096];
        let n = input.read(&mut buf).await?;
        if n == 0 {
            return Ok(None);
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(b) = head.iter().find(|b| !b.is_ascii_whitespace()) {
            return Ok(Some((Framing::sniff(*b), head)));
        }
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(
    output: W,
    framing: Framing,
    mut rx: OutboxReceiver,
) -> std::io::Result<()> {
    let mut sink = FramedWrite::new(output, Codec::new(framing));
    while let Some(msg) = rx.recv().await {
        let mut bytes = msg.len();
        sink.feed(msg).await?;
        // Batch whatever else is already queued into the same flush.
        while let Some(more) = rx.try_recv() {
            bytes += more.len();
            sink.feed(more).await?;
        }
        sink.flush().await?;
        rx.written(bytes);
    }
    sink.flush().await
}

impl<H: Host> Conn<H> {
    fn new(
        host: Arc<H>,
        router: Arc<Router<H::State>>,
        choice: ProfileChoice,
        framing: Framing,
        out: Outbox,
    ) -> Self {
        let (writes_done, _) = watch::channel(0u64);
        Conn {
            shared: Arc::new(Shared {
                host,
                router,
                out,
                pending: Mutex::new(HashMap::new()),
                writes_done,
                in_flight: Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT)),
                closing: CancellationToken::new(),
                tools: std::sync::OnceLock::new(),
            }),
            choice,
            framing,
            operator: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            challenge: None,
            connection_id: crate::util::new_id("conn_")
                .unwrap_or_else(|_| format!("conn_{}", crate::util::now_ms())),
            stateless_client: None,
            profile: match choice {
                ProfileChoice::Lsp => Some(Profile::Lsp),
                ProfileChoice::Mcp => Some(Profile::Mcp),
                _ => None,
            },
            client: None,
            viewer: Arc::new(Mutex::new(None)),
            state: None,
            deferred_init: None,
            attach_after_reply: false,
            shutdown: false,
            writes_issued: 0,
            tasks: JoinSet::new(),
            forwarder: None,
        }
    }

    /// Reads and dispatches frames until input ends or cannot be read (`false`) or LSP
    /// `exit` (`true`).
    async fn read_requests<S>(&mut self, mut reader: S) -> bool
    where
        S: futures_util::Stream<Item = std::io::Result<Frame>> + Unpin,
    {
        loop {
            // Backpressure: while the client leaves replies unread, stop reading its requests.
            self.shared.out.wait_below(MAX_QUEUED_BYTES).await;
            let Some(frame) = reader.next().await else {
                return false;
            };
            match frame {
                Err(e) => {
                    tracing::warn!(error = %e, "read failed; ending session");
                    return false;
                }
                Ok(Frame::Bad(err)) => self.frame_error(err),
                Ok(Frame::Body(body)) => {
                    if self.shared.in_flight.available_permits() == 0 {
                        // Wait for some request to finish before reading more.
                        let _ = self.shared.in_flight.acquire().await;
                    }
                    if self.on_body(body) {
                        return true;
                    }
                    if self.attach_after_reply {
                        self.attach_after_reply = false;
                        // Let the writer send the `initialize` reply (on the current-thread
                        // runtime it runs before this task resumes), then open the workspace.
                        tokio::task::yield_now().await;
                        if let Err(e) = self.ensure_attached(None) {
                            tracing::error!(error = %e.message, "opening the workspace after initialize failed; the next request retries");
                        }
                    }
                }
            }
            // Reap finished tasks so the set does not grow without bound.
            while self.tasks.try_join_next().is_some() {}
        }
    }

    /// Input is gone. After an LSP `exit` pending reads are cancelled; at a plain end of input
    /// (a scripted session) every request already read is still answered. Running writes
    /// always finish. Then the state is detached and forwarding stops. Returns the exit code.
    async fn wind_down(mut self, exit_requested: bool) -> i32 {
        if exit_requested {
            let tokens: Vec<CancellationToken> = {
                let pending = self
                    .shared
                    .pending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                pending.values().cloned().collect()
            };
            for t in tokens {
                t.cancel();
            }
        }
        let drain = async { while self.tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(Duration::from_secs(30), drain)
            .await
            .is_err()
        {
            tracing::warn!("in-flight requests did not finish within 30 s of end of input");
        }
        let exit_code =
            if self.profile == Some(Profile::Lsp) && (exit_requested || self.client.is_some()) {
                if self.shutdown { 0 } else { 1 }
            } else {
                0
            };
        // Wind down first (a worker's last output and final status are journalled), then stop
        // forwarding: the forwarder passes on what is queued before it lets go.
        if let Some(state) = self.state.take() {
            self.shared.host.detach(state).await;
        }
        self.shared.closing.cancel();
        if let Some(forwarder) = self.forwarder.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), forwarder).await;
        }
        exit_code
    }

    fn send(&self, v: Value) {
        let _ = self.shared.out.send(encode(&v));
    }

    fn frame_error(&self, err: FrameError) {
        tracing::warn!(error = %err, "bad frame");
        let e = match err {
            FrameError::TooLarge(_) => RpcError::invalid_request(err.to_string()),
            _ => RpcError::parse_error(err.to_string()),
        };
        self.send(reply_err(None, &e));
    }

    /// Handles one frame body. Returns true when the session must end (LSP `exit`).
    fn on_body(&mut self, body: Bytes) -> bool {
        let value: Value = match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => {
                // An over-deep or otherwise unreadable request still names its caller when its
                // top-level `id` can be found, so the caller is not left waiting.
                self.send(reply_err(
                    recover_id(&body).as_ref(),
                    &RpcError::parse_error(format!("invalid JSON: {e}")),
                ));
                return false;
            }
        };
        match value {
            Value::Array(items) => {
                if items.is_empty() {
                    self.send(reply_err(None, &RpcError::invalid_request("empty batch")));
                    return false;
                }
                self.on_batch(items);
                false
            }
            single => self.on_message(classify(single), None),
        }
    }

    /// A batch: every element is dispatched as usual; the replies go back as one array.
    fn on_batch(&mut self, items: Vec<Value>) {
        let (tx, mut rx) = mpsc::unbounded_channel::<String>();
        let mut expected = 0usize;
        for item in items {
            let incoming = classify(item);
            if matches!(
                incoming,
                Incoming::Request { .. } | Incoming::Invalid { .. }
            ) {
                expected += 1;
            }
            self.on_message(incoming, Some(tx.clone()));
        }
        drop(tx);
        let out = self.shared.out.clone();
        self.tasks.spawn(async move {
            let mut replies = Vec::with_capacity(expected);
            while let Some(r) = rx.recv().await {
                replies.push(r);
            }
            if !replies.is_empty() {
                let _ = out.send(format!("[{}]", replies.join(",")));
            }
        });
    }

    fn reply(&self, batch: &Option<mpsc::UnboundedSender<String>>, v: Value) {
        self.reply_encoded(batch, encode(&v));
    }

    fn reply_encoded(&self, batch: &Option<mpsc::UnboundedSender<String>>, encoded: String) {
        match batch {
            Some(tx) => {
                let _ = tx.send(encoded);
            }
            None => {
                let _ = self.shared.out.send(encoded);
            }
        }
    }

    /// The profile is fixed by the flag, the framing, or the first message that only one
    /// profile sends (an MCP handshake, `_meta` with a protocol version, an MCP-only method).
    /// Messages both profiles send (`ping`, notifications) are answered without fixing it.
    fn decide_profile(&mut self, method: &str, params: &Value, notification: bool) -> Profile {
        if let Some(p) = self.profile {
            return p;
        }
        let p = if self.framing == Framing::ContentLength || self.choice == ProfileChoice::Lsp {
            Profile::Lsp
        } else if (method == "initialize" && params.get("protocolVersion").is_some())
            || matches!(method, "server/discover" | "tools/list" | "tools/call")
            || params
                .get("_meta")
                .and_then(|m| m.get(META_VERSION))
                .is_some()
        {
            Profile::Mcp
        } else if notification || method == "ping" {
            return Profile::Raw;
        } else {
            Profile::Raw
        };
        self.profile = Some(p);
        p
    }

    fn on_message(
        &mut self,
        incoming: Incoming,
        batch: Option<mpsc::UnboundedSender<String>>,
    ) -> bool {
        match incoming {
            Incoming::Response => false,
            Incoming::Invalid { id, error } => {
                self.reply(&batch, reply_err(id.as_ref(), &error));
                false
            }
            Incoming::Notification { method, params } => {
                self.decide_profile(&method, &params, true);
                self.on_notification(&method, params)
            }
            Incoming::Request { id, method, params } => {
                let profile = self.decide_profile(&method, &params, false);
                if let Err(e) = self.on_request(profile, id.clone(), &method, params, &batch) {
                    self.reply(&batch, reply_err(Some(&id), &e));
                }
                false
            }
        }
    }

    fn on_notification(&mut self, method: &str, params: Value) -> bool {
        match method {
            "exit" => return true,
            // The handshake's last step carries nothing gaffer needs.
            "initialized" | "notifications/initialized" => {}
            "$/cancelRequest" => {
                if let Some(id) = params.get("id").and_then(id_of) {
                    self.cancel(&id);
                }
            }
            "notifications/cancelled" => {
                if let Some(id) = params.get("requestId").and_then(id_of) {
                    self.cancel(&id);
                }
            }
            "$/setTrace" | "$/logTrace" => {}
            other => tracing::debug!(method = other, "notification ignored"),
        }
        false
    }

    fn cancel(&self, id: &Id) {
        let token = {
            let mut pending = self
                .shared
                .pending
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            pending.remove(id)
        };
        if let Some(token) = token {
            token.cancel();
            // LSP answers a cancelled request with -32800; MCP says the receiver stays silent.
            if self.profile != Some(Profile::Mcp) {
                self.send(reply_err(Some(id), &RpcError::cancelled()));
            }
        }
    }

    fn server_capabilities(&self, role: Role) -> Value {
        // Advertise only what this connection may call.
        let methods: Vec<&str> = self
            .shared
            .router
            .methods()
            .filter(|m| m.def.audience == Audience::Anyone || role == Role::Operator)
            .map(|m| m.def.name)
            .collect();
        let notes: Vec<&str> = self.shared.router.notifications().map(|n| n.name).collect();
        json!({ "experimental": { "gaffer": { "methods": methods, "notifications": notes } } })
    }

    fn ensure_attached(&mut self, init: Option<&Value>) -> Result<Arc<H::State>, RpcError> {
        if let Some(s) = &self.state {
            return Ok(Arc::clone(s));
        }
        let kept = self.deferred_init.take();
        let state = match self.shared.host.attach(init.or(kept.as_ref())) {
            Ok(state) => state,
            Err(e) => {
                self.deferred_init = kept;
                return Err(e);
            }
        };
        self.state = Some(Arc::clone(&state));
        // Forward domain notifications to this client for the life of the session.
        let rx = self.shared.host.subscribe(&state);
        let listener = Listener {
            profile: self.profile,
            operator: Arc::clone(&self.operator),
            viewer: Arc::clone(&self.viewer),
        };
        self.forwarder = Some(tokio::spawn(forward_notices(
            Arc::clone(&self.shared),
            Arc::clone(&state),
            rx,
            listener,
        )));
        Ok(state)
    }

    /// The connection's identity, also for the notification forwarder.
    fn set_client(&mut self, c: Arc<ClientInfo>) {
        *self
            .viewer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(c.id.clone());
        self.client = Some(c);
    }

    fn client_info(&mut self, profile: Profile) -> Result<Arc<ClientInfo>, RpcError> {
        if let Some(c) = self.client.as_ref().or(self.stateless_client.as_ref()) {
            return Ok(Arc::clone(c));
        }
        let state = self.ensure_attached(None)?;
        let id = self.shared.host.identify(&state, &Value::Null, profile)?;
        let c = Arc::new(ClientInfo {
            id,
            role: Role::Agent,
            profile,
        });
        // Stateless MCP has no handshake to mark: its identity is kept aside.
        if profile == Profile::Mcp {
            self.stateless_client = Some(Arc::clone(&c));
        } else {
            self.set_client(Arc::clone(&c));
        }
        Ok(c)
    }

    /// `operator/challenge` and `operator/login`: the operator role is proven, never claimed.
    fn operator_login(
        &mut self,
        profile: Profile,
        method: &str,
        params: &Value,
    ) -> Result<Value, RpcError> {
        if profile == Profile::Mcp {
            return Err(operator_not_on_mcp());
        }
        let client = self.client_info(profile)?;
        let state = self.ensure_attached(None)?;
        if method == "operator/challenge" {
            let text = self
                .shared
                .host
                .login_challenge(&state, &self.connection_id)?;
            self.challenge = Some(text.clone());
            return Ok(json!({ "challenge": text }));
        }
        let signature = params
            .get("signature")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                RpcError::invalid_params(
                    "signature",
                    "`signature` must be the base64url Ed25519 signature of the challenge text",
                )
            })?;
        let issued = self.challenge.take().ok_or_else(|| {
            RpcError::app(
                super::message::AppCode::Forbidden,
                "operator_login_failed",
                "ask for a challenge first (`operator/challenge`)",
            )
        })?;
        self.shared.host.login_verify(&state, &issued, signature)?;
        self.operator
            .store(true, std::sync::atomic::Ordering::Release);
        self.set_client(Arc::new(ClientInfo {
            id: client.id.clone(),
            role: Role::Operator,
            profile,
        }));
        Ok(json!({ "role": Role::Operator }))
    }

    fn on_request(
        &mut self,
        profile: Profile,
        id: Id,
        method: &str,
        mut params: Value,
        batch: &Option<mpsc::UnboundedSender<String>>,
    ) -> Result<(), RpcError> {
        if self.shutdown && method != "shutdown" {
            return Err(RpcError::invalid_request("server is shutting down"));
        }
        if let Some(result) = self.session_method(profile, method, &params)? {
            self.reply(batch, reply_ok(&id, result));
            return Ok(());
        }
        let stateless = self.admit(profile, &params)?;
        let progress = self.take_progress(&mut params);
        let client = self.client_info(profile)?;
        let state = self.ensure_attached(None)?;
        let (target, args, mcp) = match self.route(profile, method, params, stateless.is_some())? {
            Routed::Answered(encoded) => {
                self.reply_encoded(batch, reply_ok_raw(&id, encoded.get()));
                return Ok(());
            }
            Routed::Call { target, args, mcp } => (target, args, mcp),
        };
        let m = self
            .shared
            .router
            .get(&target)
            .ok_or_else(|| RpcError::method_not_found(&target))?;
        super::router::check_audience(&m.def, &client)?;
        let access = m.def.access;
        let cancel = self.register_pending(&id)?;
        let (ticket, wait_for) = match access {
            Access::Write => {
                self.writes_issued += 1;
                (Some(self.writes_issued), self.writes_issued - 1)
            }
            Access::Read => (None, self.writes_issued),
        };
        let call = Call {
            id,
            target,
            args,
            ctx: CallCtx {
                client,
                cancel,
                progress,
            },
            ticket,
            wait_for,
            mcp,
            stateless: stateless.is_some(),
            reply_to: batch.clone(),
        };
        let permit = Arc::clone(&self.shared.in_flight).try_acquire_owned().ok();
        let shared = Arc::clone(&self.shared);
        self.tasks.spawn(async move {
            let _permit = permit;
            run_call(shared, state, call).await;
        });
        Ok(())
    }

    /// Methods the session answers itself rather than the router (the handshake, `ping`,
    /// operator login, MCP discovery), ahead of the request gates in [`Self::admit`]:
    /// `Some(result)` when `method` is one of them.
    fn session_method(
        &mut self,
        profile: Profile,
        method: &str,
        params: &Value,
    ) -> Result<Option<Value>, RpcError> {
        let result = match method {
            "initialize" => self.initialize(profile, params)?,
            "shutdown" => {
                self.shutdown = true;
                Value::Null
            }
            "ping" => {
                let mut result = json!({});
                if meta_version(params).is_some() {
                    result["resultType"] = json!("complete");
                }
                result
            }
            "operator/challenge" | "operator/login" => {
                if profile == Profile::Lsp && self.client.is_none() {
                    return Err(not_initialized("send `initialize` first"));
                }
                self.operator_login(profile, method, params)?
            }
            "server/discover" => {
                let (name, version) = self.shared.host.server_info();
                let mut versions = vec![MCP_STATELESS_VERSION];
                versions.extend_from_slice(MCP_HANDSHAKE_VERSIONS);
                json!({
                    "resultType": "complete",
                    "ttlMs": 0,
                    "cacheScope": "private",
                    "supportedVersions": versions,
                    "capabilities": {"tools": {"listChanged": false}},
                    "serverInfo": {"name": name, "version": version},
                    "instructions": self.shared.host.instructions(),
                })
            }
            _ => return Ok(None),
        };
        Ok(Some(result))
    }

    /// Whether a request may be served on this connection now: a protocol version in `_meta`
    /// must be one gaffer speaks; an LSP connection must have initialized, and so must an MCP
    /// one unless the request names its version in `_meta` (raw JSON-RPC is never gated).
    /// Returns the version the request names in `_meta`, if any.
    fn admit(&self, profile: Profile, params: &Value) -> Result<Option<String>, RpcError> {
        let stateless = meta_version(params);
        if let Some(v) = &stateless
            && v != MCP_STATELESS_VERSION
            && !MCP_HANDSHAKE_VERSIONS.contains(&v.as_str())
        {
            return Err(RpcError::invalid_params(
                "_meta",
                format!("unsupported MCP protocol version {v:?}"),
            )
            .with_data("supported", json!([MCP_STATELESS_VERSION])));
        }
        if profile == Profile::Lsp && self.client.is_none() {
            return Err(not_initialized("send `initialize` first"));
        }
        if profile == Profile::Mcp && self.client.is_none() && stateless.is_none() {
            return Err(not_initialized(
                "send `initialize` first, or `_meta` with a protocol version on every request",
            ));
        }
        Ok(stateless)
    }

    /// LSP work-done progress and MCP progress tokens ride in params: taken out before typed
    /// decoding.
    fn take_progress(&self, params: &mut Value) -> Progress {
        let mut progress = Progress::default();
        if let Value::Object(map) = params {
            if let Some(token) = map.remove("workDoneToken") {
                progress = Progress::new(token, ProgressStyle::Lsp, self.shared.out.clone());
            }
            if let Some(Value::Object(meta)) = map.remove("_meta")
                && let Some(token) = meta.get("progressToken")
            {
                progress =
                    Progress::new(token.clone(), ProgressStyle::Mcp, self.shared.out.clone());
            }
        }
        progress
    }

    /// Which router method a request calls, with what arguments. MCP offers tools only:
    /// `tools/list` is answered here and `tools/call` names the method.
    fn route(
        &self,
        profile: Profile,
        method: &str,
        mut params: Value,
        stateless: bool,
    ) -> Result<Routed<'_>, RpcError> {
        if profile != Profile::Mcp {
            return Ok(Routed::Call {
                target: method.to_string(),
                args: params,
                mcp: None,
            });
        }
        match method {
            "tools/list" => {
                let tools = self.tools();
                Ok(Routed::Answered(if stateless {
                    &tools.stateless_result
                } else {
                    &tools.result
                }))
            }
            "tools/call" => {
                let name = params.get("name").and_then(Value::as_str).ok_or_else(|| {
                    RpcError::invalid_params("name", "`name` must be a tool name")
                })?;
                let m = self.shared.router.by_tool(name).ok_or_else(|| {
                    let known = self.tools().names.clone();
                    RpcError::invalid_params(
                        "name",
                        format!("unknown tool `{name}`; tools: {}", known.join(", ")),
                    )
                    .with_data("known_tools", known)
                })?;
                let name = m.def.name;
                let args = match params.get_mut("arguments").map(Value::take) {
                    None | Some(Value::Null) => Value::Object(Map::new()),
                    Some(v @ Value::Object(_)) => v,
                    Some(_) => {
                        return Err(RpcError::invalid_params(
                            "arguments",
                            "`arguments` must be an object",
                        ));
                    }
                };
                let wrap = self.tools().wrapped.contains(name);
                Ok(Routed::Call {
                    target: name.to_string(),
                    args,
                    mcp: Some(wrap),
                })
            }
            // The agent surface offers tools only: gaffer methods are reached via tools/call.
            _ => Err(RpcError::method_not_found(method)),
        }
    }

    /// Records `id` as in flight (so it can be cancelled); an id already in flight is refused.
    fn register_pending(&self, id: &Id) -> Result<CancellationToken, RpcError> {
        let token = CancellationToken::new();
        let mut pending = self
            .shared
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if pending.contains_key(id) {
            return Err(RpcError::invalid_request(format!(
                "request id {id} is already in use"
            )));
        }
        pending.insert(id.clone(), token.clone());
        Ok(token)
    }

    fn initialize(&mut self, profile: Profile, params: &Value) -> Result<Value, RpcError> {
        // A client answered before its workspace opened, whose open then failed, may
        // initialize again (another root): it has nothing else to recover with.
        let open_failed = self.state.is_none() && self.deferred_init.is_some();
        if self.client.is_some() && !open_failed {
            return Err(RpcError::invalid_request("already initialized"));
        }
        // MCP has no initializationOptions: a role beside the standard fields counts too.
        let opts = params.get("initializationOptions").unwrap_or(params);
        let wants_operator = match opts.get("role").and_then(Value::as_str) {
            None | Some("agent") => false,
            Some("operator") if profile == Profile::Mcp => {
                return Err(operator_not_on_mcp());
            }
            Some("operator") => true,
            Some(other) => {
                return Err(RpcError::invalid_params(
                    "initializationOptions.role",
                    format!("unknown role {other:?}; expected \"agent\" or \"operator\""),
                ));
            }
        };
        // An anonymous agent is answered before the workspace opens; a credential or an
        // operator challenge needs the open state first.
        let early = if wants_operator {
            None
        } else {
            self.shared.host.identify_early(params)?
        };
        let (id, state) = match early {
            Some(id) => (id, None),
            None => {
                let state = self.ensure_attached(Some(params))?;
                let id = self.shared.host.identify(&state, params, profile)?;
                (id, Some(state))
            }
        };
        self.set_client(Arc::new(ClientInfo {
            id: id.clone(),
            role: Role::Agent,
            profile,
        }));
        if state.is_none() {
            self.deferred_init = Some(params.clone());
            self.attach_after_reply = true;
        }
        // An operator connection proves the key before it gets the role: the challenge rides
        // on the reply, the answer comes as `operator/login`.
        let challenge = match &state {
            Some(state) if wants_operator => {
                let text = self
                    .shared
                    .host
                    .login_challenge(state, &self.connection_id)?;
                self.challenge = Some(text.clone());
                Some(text)
            }
            _ => None,
        };
        let (server, version) = self.shared.host.server_info();
        if profile == Profile::Mcp {
            let asked = params
                .get("protocolVersion")
                .and_then(Value::as_str)
                .unwrap_or("");
            let chosen = if MCP_HANDSHAKE_VERSIONS.contains(&asked) {
                asked
            } else {
                MCP_HANDSHAKE_VERSIONS[0]
            };
            return Ok(json!({
                "protocolVersion": chosen,
                "capabilities": {"tools": {"listChanged": false}},
                "serverInfo": {"name": server, "version": version},
                "instructions": self.shared.host.instructions(),
            }));
        }
        let mut result = json!({
            "capabilities": self.server_capabilities(Role::Agent),
            "serverInfo": {"name": server, "version": version},
            "role": Role::Agent,
            "client": id,
        });
        if let Some(c) = challenge {
            result["operatorChallenge"] = json!(c);
        }
        Ok(result)
    }

    fn tools(&self) -> &Tools {
        self.shared.tools.get_or_init(|| {
            let mut wrapped = std::collections::HashSet::new();
            let mut names = Vec::new();
            let list: Vec<Value> = self
                .shared
                .router
                .methods()
                .filter(|m| m.def.audience == Audience::Anyone)
                .filter_map(|m| {
                    let tool = m.def.mcp_tool?;
                    let mut input = m.params_schema().to_value();
                    if let Value::Object(map) = &mut input {
                        map.remove("$schema");
                        map.entry("type").or_insert(json!("object"));
                    }
                    let (mut output, wrap) = output_schema(m.result_schema().to_value());
                    objectify(&mut input);
                    objectify(&mut output);
                    if wrap {
                        wrapped.insert(m.def.name);
                    }
                    names.push(tool);
                    Some(json!({
                        "name": tool,
                        "title": m.def.name,
                        "description": m.def.doc,
                        "inputSchema": input,
                        "outputSchema": output,
                    }))
                })
                .collect();
            let mut result = json!({ "tools": list });
            let plain = raw_json(&result);
            // 2026-07-28: every list result says how long it may be cached, and by whom.
            result["resultType"] = json!("complete");
            result["ttlMs"] = json!(0);
            result["cacheScope"] = json!("private");
            Tools {
                names,
                result: plain,
                stateless_result: raw_json(&result),
                wrapped,
            }
        })
    }
}

/// Who the notification forwarder passes notices on to, as the connection learns it.
struct Listener {
    profile: Option<Profile>,
    /// Set once the connection proved the operator key.
    operator: Arc<std::sync::atomic::AtomicBool>,
    /// The connection's identity, once it has one.
    viewer: Arc<Mutex<Option<String>>>,
}

impl Listener {
    /// Whether this connection is shown `notice`: MCP connections get none; operators and
    /// others what their own requests would be shown.
    fn shown<H: Host>(&self, host: &H, state: &H::State, notice: H::Notice) -> Option<Push> {
        if self.profile == Some(Profile::Mcp) {
            return None;
        }
        let operator = self.operator.load(std::sync::atomic::Ordering::Acquire);
        if operator && !host.operator_visible(state, &notice) {
            return None;
        }
        if !operator {
            let me = self
                .viewer
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
            if !host.visible(state, me.as_deref(), &notice) {
                return None;
            }
        }
        let push = H::push(notice);
        (operator || !push.operators_only).then_some(push)
    }
}

/// Passes `state`'s notifications on to the connection until the subscription closes or the
/// connection's writer is gone; once the session is closing, it passes on what is already
/// queued, then stops.
async fn forward_notices<H: Host>(
    shared: Arc<Shared<H>>,
    state: Arc<H::State>,
    mut rx: crate::fanout::Subscription<H::Notice>,
    listener: Listener,
) {
    let mut draining = false;
    loop {
        let next = if draining {
            match rx.try_recv() {
                Ok(n) => Ok(n),
                Err(TryRecvError::Lagged(n)) => Err(RecvError::Lagged(n)),
                Err(_) => break,
            }
        } else {
            tokio::select! {
                n = rx.recv() => n,
                _ = shared.closing.cancelled() => {
                    draining = true;
                    continue;
                }
            }
        };
        match next {
            Ok(notice) => {
                let Some(push) = listener.shown(&*shared.host, &state, notice) else {
                    continue;
                };
                if !shared
                    .out
                    .send(encode(&notification(&push.method, push.params)))
                {
                    break;
                }
            }
            Err(RecvError::Lagged(n)) => {
                tracing::warn!(skipped = n, "client fell behind; notifications dropped");
            }
            Err(RecvError::Closed) => break,
        }
    }
}

/// What `route` made of a request.
enum Routed<'a> {
    /// Answered from what the session keeps (the encoded `tools/list` result).
    Answered(&'a RawValue),
    /// A router method to call; `mcp` is set for `tools/call` (whether a non-object result
    /// is wrapped as `{"result": …}`).
    Call {
        target: String,
        args: Value,
        mcp: Option<bool>,
    },
}

/// One admitted request, as its task runs it.
struct Call {
    id: Id,
    target: String,
    args: Value,
    ctx: CallCtx,
    /// This write's number in arrival order (`None` for a read).
    ticket: Option<u64>,
    /// How many writes must have finished before this request runs.
    wait_for: u64,
    /// Set for MCP `tools/call`: whether a non-object result is wrapped.
    mcp: Option<bool>,
    /// The request named its MCP version in `_meta` (a tool result then carries the
    /// stateless revision's fields).
    stateless: bool,
    /// The batch this request came in, if any.
    reply_to: Option<mpsc::UnboundedSender<String>>,
}

/// Runs an admitted request in its turn and sends its reply, unless it was cancelled.
async fn run_call<H: Host>(shared: Arc<Shared<H>>, state: Arc<H::State>, call: Call) {
    let Call {
        id,
        target,
        args,
        ctx,
        ticket,
        wait_for,
        mcp,
        stateless,
        reply_to,
    } = call;
    let token = ctx.cancel.clone();
    let mut done_rx = shared.writes_done.subscribe();
    // Wait for earlier writes (a cancelled request still takes its turn, so later writes keep
    // their order).
    let waited = tokio::select! {
        r = done_rx.wait_for(|d| *d >= wait_for) => r.is_ok(),
        _ = token.cancelled(), if ticket.is_none() => false,
    };
    let finish_write = |shared: &Shared<H>| {
        if let Some(t) = ticket {
            shared.writes_done.send_modify(|d| *d = (*d).max(t));
        }
    };
    if !waited || token.is_cancelled() {
        finish_write(&shared);
        return;
    }
    let call = shared.router.call(state, ctx, &target, args);
    let result = match ticket {
        // A started write runs to completion even if cancelled meanwhile.
        Some(_) => Some(call.await),
        None => tokio::select! {
            r = call => Some(r),
            _ = token.cancelled() => None,
        },
    };
    finish_write(&shared);
    let Some(result) = result else { return };
    let still_pending = {
        let mut pending = shared.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.remove(&id).is_some()
    };
    if !still_pending {
        return; // cancelled: -32800 was already sent
    }
    let reply = encode_call_reply(&id, result, mcp, stateless);
    match reply_to {
        Some(tx) => {
            let _ = tx.send(reply.into_string());
        }
        None => {
            let _ = shared.out.send(reply);
        }
    }
}

/// A method's result as its reply: spliced in as it is, or as an MCP tool result.
fn encode_call_reply(
    id: &Id,
    result: Result<Raw, RpcError>,
    mcp: Option<bool>,
    stateless: bool,
) -> Message {
    let Some(wrap) = mcp else {
        return match result {
            Ok(raw) => reply_ok_spliced(id, raw.into_string()),
            Err(e) => encode(&reply_err(Some(id), &e)).into(),
        };
    };
    let text = match result {
        Ok(raw) => {
            let text = raw.get();
            // The text twice, once escaped (JSON text grows by about a tenth: its quotes), so
            // that the reply is written without a reallocation.
            let size = 2 * text.len() + text.len() / 4 + 112;
            reply_ok_writing(id, size, |out| {
                write_tool_result(out, text, wrap, stateless)
            })
        }
        Err(e) => match tool_error_result(e, stateless) {
            Ok(raw) => reply_ok_raw(id, raw.get()),
            Err(_) => encode(&reply_err(
                Some(id),
                &RpcError::internal("encoding the tool result"),
            )),
        },
    };
    text.into()
}

fn not_initialized(message: &str) -> RpcError {
    RpcError::new(
        codes::SERVER_NOT_INITIALIZED,
        "server_not_initialized",
        message,
    )
}

/// `v` as encoded JSON (a `Value` always encodes).
fn raw_json(v: &Value) -> Box<serde_json::value::RawValue> {
    serde_json::value::to_raw_value(v).unwrap_or_default()
}

fn operator_not_on_mcp() -> RpcError {
    RpcError::app(
        super::message::AppCode::Forbidden,
        "operator_not_on_mcp",
        "the MCP surface never carries operator connections",
    )
}

fn id_of(v: &Value) -> Option<Id> {
    serde_json::from_value(v.clone()).ok()
}

fn meta_version(params: &Value) -> Option<String> {
    params
        .get("_meta")?
        .get(META_VERSION)?
        .as_str()
        .map(str::to_string)
}

/// A tool's `outputSchema` from its result schema: the result (an object at the root, as MCP
/// wants; any other result is declared and sent as `{"result": …}`), or the error envelope
/// `{"error": …}` of an `isError` result (some clients validate those too). True when wrapped.
fn output_schema(mut schema: Value) -> (Value, bool) {
    let mut defs = None;
    if let Value::Object(map) = &mut schema {
        map.remove("$schema");
        // Definitions stay at the root, where the inner `$ref`s point.
        defs = map.remove("$defs");
    }
    let wrap = schema.get("type") != Some(&json!("object"));
    let result = if wrap {
        json!({"type": "object", "properties": {"result": schema}, "required": ["result"]})
    } else {
        schema
    };
    let error = json!({
        "type": "object",
        "required": ["error"],
        "properties": {"error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "integer"},
                "message": {"type": "string"},
                "data": {"type": "object"}
            }
        }}
    });
    let mut out = json!({"type": "object", "anyOf": [result, error]});
    if let Some(defs) = defs {
        out["$defs"] = defs;
    }
    (out, wrap)
}

/// Spells boolean subschemas of `properties` and `$defs` as objects (`true` is `{}`, `false` is
/// `{"not": {}}`): MCP clients (the TypeScript SDK) require property schemas to be objects. Also
/// drops the Rust integer widths schemars puts in `format` (`uint64`, ...), which clients' JSON
/// Schema validators do not know (the range is in `minimum`).
fn objectify(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            if map.get("format").and_then(Value::as_str).is_some_and(|f| {
                f.starts_with("uint") || f.starts_with("int") || f == "double" || f == "float"
            }) {
                map.remove("format");
            }
            for (key, v) in map.iter_mut() {
                if let ("properties" | "$defs", Value::Object(subs)) = (key.as_str(), &mut *v) {
                    for sub in subs.values_mut() {
                        if let Value::Bool(b) = sub {
                            *sub = if *b { json!({}) } else { json!({"not": {}}) };
                        }
                    }
                }
                objectify(v);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(objectify),
        _ => {}
    }
}

/// An `isError` tool result: the message as text, the error object as structured content.
fn tool_error_result(e: RpcError, stateless: bool) -> Result<Box<RawValue>, serde_json::Error> {
    let mut out = json!({
        "content": [{"type": "text", "text": e.message}],
        "structuredContent": {"error": e},
        "isError": true,
    });
    if stateless {
        out["resultType"] = json!("complete");
    }
    serde_json::value::to_raw_value(&out)
}

/// Appends a successful tool result for the encoded method result `text`: the JSON as text
/// content, and as structured content (wrapped as `{"result": …}` when it is no object).
/// Written by hand straight into the reply, in the bytes serde_json writes for these parts.
fn write_tool_result(out: &mut Vec<u8>, text: &str, wrap: bool, stateless: bool) {
    out.extend_from_slice(br#"{"content":[{"type":"text","text":"#);
    crate::json_out::string_into(out, text);
    out.extend_from_slice(br#"}],"isError":false,"#);
    if stateless {
        out.extend_from_slice(br#""resultType":"complete","#);
    }
    out.extend_from_slice(br#""structuredContent":"#);
    if wrap {
        out.extend_from_slice(br#"{"result":"#);
    }
    out.extend_from_slice(text.as_bytes());
    if wrap {
        out.push(b'}');
    }
    out.push(b'}');
}

#[cfg(test)]
mod tool_result_tests {
    use super::*;

    /// The hand-written success form: the same bytes serde_json writes for the same parts
    /// (content item `type` then `text`, the other keys sorted), for every flag combination
    /// and a text with quotes, controls and non-ASCII.
    #[test]
    fn tool_result_bytes() {
        #[derive(serde::Serialize)]
        struct Item<'a> {
            #[serde(rename = "type")]
            kind: &'a str,
            text: &'a str,
        }
        let text = r#"{"a":"q\"uo\\te \u0001 \n","b":["é✓😀",1.5,null]}"#;
        let raw = RawValue::from_string(text.to_owned()).unwrap();
        let structured: Value = serde_json::from_str(text).unwrap();
        for wrap in [false, true] {
            for stateless in [false, true] {
                let mut got = Vec::new();
                write_tool_result(&mut got, raw.get(), wrap, stateless);
                let got = String::from_utf8(got).unwrap();
                let mut expect = format!(
                    r#"{{"content":[{}],"isError":false,"#,
                    serde_json::to_string(&Item { kind: "text", text }).unwrap()
                );
                if stateless {
                    expect.push_str(r#""resultType":"complete","#);
                }
                let body = if wrap {
                    json!({ "result": structured }).to_string()
                } else {
                    structured.to_string()
                };
                expect.push_str(&format!(r#""structuredContent":{body}}}"#));
                assert_eq!(got, expect, "wrap {wrap}, stateless {stateless}");
            }
        }
    }
}
