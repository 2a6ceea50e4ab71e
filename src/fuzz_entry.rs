//! The fuzz targets' entry points (fuzz/, `scripts/fuzz.sh`): each parser of untrusted
//! input fed raw bytes, as a hostile file or client would send them. None may panic; an
//! error is the right answer to garbage. The seed corpus runs through them in the unit
//! tests, so CI checks the entries and the corpus without a fuzzer.

use crate::http::tensors;
use crate::model::config::ModelConfig;
use crate::model::gguf::GgufFile;
use crate::tokenizer::chat::{ChatMessage, ChatTemplate};
use crate::tokenizer::Tokenizer;

/// A GGUF file: its header, metadata and tensor table; then the model configuration and
/// the tokenizer read from it.
pub fn gguf(data: &[u8]) {
    if let Ok(file) = GgufFile::from_bytes(data.to_vec()) {
        let _ = ModelConfig::from_gguf(&file);
        let vocab = crate::tokenizer::GgufVocab::from_gguf(&file);
        if let Ok(tok) = vocab.and_then(|v| Tokenizer::from_gguf_vocab(&v)) {
            let ids = tok.encode("Hello, world", true).unwrap_or_default();
            let _ = tok.decode(&ids, false);
        }
    }
}

/// A safetensors file's header (the JSON table of tensors and their offsets).
pub fn safetensors_header(data: &[u8]) {
    if let Ok((n, meta)) = safetensors::tensor::SafeTensors::read_metadata(data) {
        for (_, info) in meta.tensors() {
            let (s, e) = info.data_offsets;
            let _ = data.get(8 + n + s..8 + n + e);
        }
    }
}

/// An HF checkpoint's config.json.
pub fn hf_config(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = ModelConfig::from_hf_json(text);
    }
}

/// A tokenizer.json; when it loads, a round trip through it.
pub fn tokenizer_json(data: &[u8]) {
    if let Ok(tok) = Tokenizer::from_json_bytes(data) {
        let ids = tok
            .encode("Hello, world <|im_end|> ünïcode", true)
            .unwrap_or_default();
        let _ = tok.decode(&ids, false);
    }
}

/// A chat template (a GGUF's or tokenizer_config.json's: code the server runs), then a
/// message rendered through it: the bytes before the first NUL are the template, the rest
/// the user's message.
pub fn chat_template(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let (source, message) = text.split_once('\0').unwrap_or((&text, "hi"));
    if let Ok(t) = ChatTemplate::new(source, "<s>", "</s>") {
        let messages = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", message),
        ];
        let _ = t.apply(&messages, true);
    }
}

/// A KServe `infer` body with the binary tensor extension: the first two bytes give the
/// JSON header's length (`Inference-Header-Content-Length`), the rest is the body.
pub fn kserve_infer(data: &[u8]) {
    let (len, body) = match data {
        [a, b, rest @ ..] => (u16::from_le_bytes([*a, *b]), rest),
        _ => (0, data),
    };
    let header = (len != 0).then(|| axum::http::HeaderValue::from(len));
    if let Ok(req) = tensors::decode_request(body, header.as_ref()) {
        let _ = req.binary_output();
    }
}

/// A gRPC `ModelInferRequest` message as it comes off the wire, decoded and turned into
/// the shared infer request.
pub fn grpc_infer(data: &[u8]) {
    use prost::Message;
    if let Ok(msg) = crate::grpc::proto::ModelInferRequest::decode(data) {
        let _ = crate::grpc::codec::infer_request(msg);
    }
}

/// A GBNF grammar (vLLM's `guided_grammar`, TensorRT-LLM's `ebnf_grammar`) rewritten as
/// Lark.
pub fn gbnf(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = crate::guide::gbnf::to_lark(text);
    }
}

/// A fuzz entry: bytes in, nothing out (it must not panic).
pub type Entry = fn(&[u8]);

/// Every entry by its target's name.
pub const TARGETS: [(&str, Entry); 8] = [
    ("gguf", gguf),
    ("safetensors_header", safetensors_header),
    ("hf_config", hf_config),
    ("tokenizer_json", tokenizer_json),
    ("chat_template", chat_template),
    ("kserve_infer", kserve_infer),
    ("grpc_infer", grpc_infer),
    ("gbnf", gbnf),
];

#[cfg(test)]
mod tests;
