//! The smallest `tower-lsp` server: initialize, a custom `ping` method answered with `{}`,
//! shutdown.
use tower_lsp::jsonrpc::Result;
use tower_lsp::lsp_types::{InitializeParams, InitializeResult};
use tower_lsp::{Client, LanguageServer, LspService, Server};

struct Backend {
    _client: Client,
}

impl Backend {
    async fn ping(&self) -> Result<serde_json::Value> {
        Ok(serde_json::json!({}))
    }
}

#[tower_lsp::async_trait]
impl LanguageServer for Backend {
    async fn initialize(&self, _: InitializeParams) -> Result<InitializeResult> {
        Ok(InitializeResult::default())
    }
    async fn shutdown(&self) -> Result<()> {
        Ok(())
    }
}

#[tokio::main]
async fn main() {
    let (service, socket) = LspService::build(|client| Backend { _client: client })
        .custom_method("ping", Backend::ping)
        .finish();
    Server::new(tokio::io::stdin(), tokio::io::stdout(), socket)
        .serve(service)
        .await;
}
