//! Embedding inflight as a library: build the model's actor tree inside your own tokio
//! runtime, stream one answer, cancel another, shut down cleanly. No HTTP involved.
//!
//! `cargo run --release --example embed [-- path/to/model.gguf]`

use std::time::Duration;

use futures::StreamExt;
use inflight::model::LoadedModel;
use inflight::tokenizer::chat::ChatMessage;
use inflight::{GenerationParams, ModelHandle, ModelOptions, Prompt, Request};

#[tokio::main]
async fn main() -> inflight::Result<()> {
    let path = match std::env::args().nth(1) {
        Some(p) => p.into(),
        None => inflight::fetch::default_model_path()?,
    };
    let model = LoadedModel::load(&path)?;
    let options = ModelOptions::for_model(model.model.config(), 16 * 1024);
    let handle = ModelHandle::spawn(model, options).await?;

    // Stream a chat answer token by token.
    let question = ChatMessage::new("user", "Name three primary colors.");
    let request = Request {
        id: Some("colors".into()),
        prompts: vec![Prompt::chat(vec![question])],
        params: GenerationParams {
            max_tokens: 48,
            ..GenerationParams::default()
        },
    };
    let mut stream = handle.submit(request).await.expect("accepted");
    while let Some(chunk) = stream.next().await {
        print!("{}", chunk.text);
        if let Some(reason) = chunk.finish_reason {
            println!("\n[finished: {reason:?}, {} tokens]", chunk.output_tokens);
        }
    }

    // Start a long request and cancel it by id; its stream ends with `Cancelled`.
    let long = Request {
        id: Some("long".into()),
        prompts: vec![Prompt::Text("Once upon a time".into())],
        params: GenerationParams {
            max_tokens: 1000,
            ignore_eos: true,
            ..GenerationParams::default()
        },
    };
    let mut stream = handle.submit(long).await.expect("accepted");
    tokio::time::sleep(Duration::from_millis(100)).await;
    handle.cancel("long");
    let mut received = 0;
    while let Some(chunk) = stream.next().await {
        received += chunk.token_ids.len();
        if let Some(reason) = chunk.finish_reason {
            println!("[long request: {reason:?} after {received} tokens]");
        }
    }

    let stats = handle.stats().await?;
    println!(
        "[free KV blocks: {}/{}]",
        stats.free_blocks, stats.total_blocks
    );
    handle.shutdown(Duration::from_secs(5)).await;
    Ok(())
}
