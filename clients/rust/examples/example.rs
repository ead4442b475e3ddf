//! Calls a live inferwire server with the generated client: Infer, InferStream,
//! the standard grpc.health.v1 Check, an invalid request whose
//! google.rpc.BadRequest details name the offending field, and a chat request
//! with log-probabilities.
//!
//! Usage: cargo run --example example -- [host:port] [model]

use std::fmt::Write as _;
use std::process::ExitCode;

use inferwire_client::v1::{
    ChatMessage, FinishReason, GenerationParameters, InferRequest, InferStreamRequest,
    inference_service_client::InferenceServiceClient,
};
use tonic::transport::Channel;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};
use tonic_types::StatusExt;

type Error = Box<dyn std::error::Error>;

// The chat request every language's example sends: greedy, so that the tokens
// and their log-probabilities are the same from every client.
const CHAT_SYSTEM: &str = "You are a player in a Shakespeare play.";
const CHAT_USER: &str = "Good morrow! What news from Verona?";
const TOP_LOGPROBS: u32 = 3;

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let address = args.next().unwrap_or_else(|| "localhost:50051".to_owned());
    let model = args.next().unwrap_or_else(|| "demo".to_owned());
    match run(&address, &model).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // tonic's transport errors say little on their own; show the causes.
            let mut message = format!("example failed: {error}");
            let mut source = error.source();
            while let Some(cause) = source {
                message += &format!(": {cause}");
                source = cause.source();
            }
            eprintln!("{message}");
            ExitCode::FAILURE
        }
    }
}

async fn run(address: &str, model: &str) -> Result<(), Error> {
    // One HTTP/2 connection, shared by both service clients.
    let channel = Channel::from_shared(format!("http://{address}"))?
        .connect()
        .await?;
    let mut client = InferenceServiceClient::new(channel.clone());

    // 1. Infer: one request, one response.
    let response = client
        .infer(InferRequest {
            model: model.to_owned(),
            prompt: "Hello".to_owned(),
            parameters: Some(GenerationParameters {
                max_tokens: Some(16),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await?
        .into_inner();
    println!("INFER {:?}", response.text);

    // 2. InferStream: print each delta as it arrives.
    let mut stream = client
        .infer_stream(InferStreamRequest {
            model: model.to_owned(),
            prompt: "Tell me a story".to_owned(),
            parameters: Some(GenerationParameters {
                max_tokens: Some(24),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await?
        .into_inner();
    let (mut deltas, mut finish_reason) = (0, FinishReason::Unspecified);
    while let Some(message) = stream.message().await? {
        if !message.text.is_empty() {
            deltas += 1;
            println!("DELTA {:?}", message.text);
        }
        finish_reason = message.finish_reason();
    }
    println!(
        "STREAM_END finish_reason={} deltas={deltas}",
        finish_reason.as_str_name()
    );

    // 3. The standard health service, per model.
    let service = format!("model/{model}");
    let health = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.clone(),
        })
        .await?
        .into_inner();
    let status = ServingStatus::try_from(health.status).unwrap_or(ServingStatus::Unknown);
    println!("HEALTH {service} {}", status.as_str_name());

    // 4. An invalid request: INVALID_ARGUMENT with google.rpc.BadRequest details.
    let invalid = InferRequest {
        model: model.to_owned(),
        prompt: "Hello".to_owned(),
        parameters: Some(GenerationParameters {
            top_p: Some(1.5),
            ..Default::default()
        }),
        ..Default::default()
    };
    let status = match client.infer(invalid).await {
        Ok(_) => return Err("top_p = 1.5 was accepted".into()),
        Err(status) => status,
    };
    let details = status.get_error_details();
    let bad_request = details
        .bad_request()
        .ok_or_else(|| format!("no BadRequest in {status}"))?;
    for violation in &bad_request.field_violations {
        println!(
            "ERROR code={} field={} description={}",
            code_name(status.code()),
            violation.field,
            violation.description
        );
    }

    // 5. Chat messages, rendered by the model's chat template, with each
    // generated token's log-probability and its most likely alternatives.
    let chat = client
        .infer(InferRequest {
            model: model.to_owned(),
            messages: vec![
                ChatMessage {
                    role: "system".to_owned(),
                    content: CHAT_SYSTEM.to_owned(),
                    ..Default::default()
                },
                ChatMessage {
                    role: "user".to_owned(),
                    content: CHAT_USER.to_owned(),
                    ..Default::default()
                },
            ],
            parameters: Some(GenerationParameters {
                max_tokens: Some(8),
                temperature: Some(0.0),
                logprobs: Some(true),
                top_logprobs: Some(TOP_LOGPROBS),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await?
        .into_inner();
    println!("CHAT {}", json_quote(&chat.text));
    println!("LOGPROBS tokens={} top={TOP_LOGPROBS}", chat.logprobs.len());
    for token in &chat.logprobs {
        println!(
            "LOGPROB {} {:.4} {}",
            token.token_id,
            token.logprob,
            json_quote(&token.token)
        );
        for alternative in &token.top {
            println!(
                "TOP {} {:.4} {}",
                alternative.token_id,
                alternative.logprob,
                json_quote(&alternative.token)
            );
        }
    }
    Ok(())
}

/// `text` as a JSON string literal in plain ASCII (non-ASCII as `\uXXXX`
/// escapes), the same in every language's example.
fn json_quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            ' '..='~' => out.push(c),
            _ => {
                for unit in c.encode_utf16(&mut [0; 2]) {
                    // Writing to a String cannot fail.
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
        }
    }
    out.push('"');
    out
}

/// The canonical name of a status code, as in google.rpc.Code
/// (tonic's Debug gives `InvalidArgument`).
fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}
