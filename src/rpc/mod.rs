//! The JSON-RPC core. It knows nothing of gaffer's domains: it gets a [`router::Router`] and a
//! [`session::Host`] and speaks the protocol over any byte stream.

pub mod framing;
pub mod message;
pub mod outbox;
pub mod router;
pub mod session;

pub use message::{AppCode, Id, RpcError};
pub use router::{
    Access, Audience, CallCtx, ClientInfo, MethodDef, Profile, Progress, Role, Router,
};
