//! Who a connection is: the identity its operator-issued credential proves (or `anonymous`),
//! and whether it has proven the operator key by answering a login challenge.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::App;
use crate::clients::{self, ANONYMOUS, CredentialError};
use crate::operator::login::{self, Challenge, LoginError};
use crate::rpc::{AppCode, Profile, RpcError};

/// `operator/challenge` result (the session answers it; also on `initialize` as
/// `operatorChallenge` when `initializationOptions.role` is `operator`).
#[derive(Debug, Serialize, JsonSchema)]
pub struct ChallengeResult {
    /// Canonical JSON (domain `gaffer/login/v1`: workspace, connection, nonce, time). Sign
    /// exactly these UTF-8 bytes with the operator's Ed25519 key; valid for 120 s.
    pub challenge: String,
}

/// `operator/login` params.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LoginParams {
    /// base64url (unpadded) Ed25519 signature of the last challenge this connection got.
    pub signature: String,
}

/// `operator/login` result: the connection is an operator connection from now on.
#[derive(Debug, Serialize, JsonSchema)]
pub struct LoginResult {
    pub role: crate::rpc::Role,
}

fn credential_error(e: CredentialError) -> RpcError {
    tracing::warn!(error = %e, "client credential refused");
    RpcError::app(
        AppCode::Forbidden,
        "client_credential_invalid",
        format!(
            "{e}; ask the operator for a token (`gaffer client add NAME`) or connect without one as anonymous"
        ),
    )
}

fn login_error(e: LoginError) -> RpcError {
    tracing::warn!(error = %e, "operator login refused");
    let code = match e {
        LoginError::NoKey => "operator_key_missing",
        _ => "operator_login_failed",
    };
    RpcError::app(AppCode::Forbidden, code, e.to_string())
}

/// The credential a connection presents: the `clientToken` initialize option, else the token
/// this process was started with (`GAFFER_CLIENT_TOKEN`); `None` for an anonymous connection.
/// Needs no workspace, so `initialize` can answer an anonymous client before the store opens.
pub fn presented_token<'a>(
    init: &'a Value,
    config: &'a super::AppConfig,
) -> Result<Option<&'a str>, RpcError> {
    let opts = init.get("initializationOptions").unwrap_or(&Value::Null);
    match opts.get("clientToken") {
        None | Some(Value::Null) => Ok(config.client_token.as_deref()),
        Some(Value::String(t)) => Ok(Some(t.as_str())),
        Some(_) => Err(RpcError::invalid_params(
            "initializationOptions.clientToken",
            "clientToken must be the token string `gaffer client add` printed",
        )),
    }
}

impl App {
    /// The identity for a connection: the `clientToken` initialize option, else the token this
    /// process was started with (`GAFFER_CLIENT_TOKEN`), else anonymous.
    pub fn identify(&self, init: &Value, _profile: Profile) -> Result<String, RpcError> {
        let Some(token) = presented_token(init, &self.config)? else {
            return Ok(ANONYMOUS.to_string());
        };
        let key = crate::operator::current_public();
        let ws_id = self.workspace.workspace_id();
        let verdict = self
            .workspace
            .read(|s| clients::verify(token, key.as_ref(), ws_id.as_deref(), &s.clients));
        let Some(anchor) = self.workspace.restricting_anchor() else {
            return verdict.map(|c| c.name).map_err(credential_error);
        };
        match verdict {
            Ok(cred) => match anchor.client_revoked(&cred.credential_id) {
                // The journal may have been cut back before the revocation: this machine
                // remembers it outside the workspace.
                Ok(false) => Ok(cred.name),
                Ok(true) => Err(credential_error(clients::CredentialError::Revoked(
                    cred.credential_id,
                ))),
                Err(e) => {
                    tracing::error!(error = %e, "the workspace anchor cannot be read");
                    Err(credential_error(clients::CredentialError::Unverifiable))
                }
            },
            Err(clients::CredentialError::Revoked(cid)) => {
                // An operator's revocation only restricts: remembered as soon as it is seen,
                // so a copy of the store without it changes nothing. (A flood of forged ones
                // refuses the credential here but is not remembered: no signature says so.)
                if let Err(e) = anchor.revoke_client(&cid) {
                    tracing::error!(error = %e, "the client revocation cannot be anchored");
                }
                Err(credential_error(clients::CredentialError::Revoked(cid)))
            }
            Err(e) => Err(credential_error(e)),
        }
    }

    pub fn login_challenge(&self, connection_id: &str) -> Result<String, RpcError> {
        login::challenge(
            self.workspace.workspace_id(),
            self.workspace.root(),
            connection_id,
        )
        .map(|(_, text)| text)
        .map_err(login_error)
    }

    pub fn login_verify(&self, challenge: &str, signature: &str) -> Result<(), RpcError> {
        let c: Challenge =
            serde_json::from_str(challenge).map_err(|_| login_error(LoginError::NoChallenge))?;
        let key = crate::operator::current_public();
        login::verify(
            Some(&(c, challenge.to_string())),
            signature,
            key.as_ref(),
            crate::util::now_ms(),
        )
        .map_err(login_error)
    }
}
