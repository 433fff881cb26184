//! The smallest useful `lsp-server` (rust-analyzer's transport crate) server: the initialize
//! handshake, `ping` answered with `{}`, shutdown/exit. What a Rust user writes first.
use lsp_server::{Connection, Message, Response};

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let (connection, io_threads) = Connection::stdio();
    connection.initialize(serde_json::json!({ "capabilities": {} }))?;
    for msg in &connection.receiver {
        if let Message::Request(req) = msg {
            if connection.handle_shutdown(&req)? {
                break;
            }
            let reply = Response::new_ok(req.id, serde_json::json!({}));
            connection.sender.send(Message::Response(reply))?;
        }
    }
    drop(connection);
    io_threads.join()?;
    Ok(())
}
