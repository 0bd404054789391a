use std::hint::black_box;

use awaken_llm::openai::ChatStreamDecoder;
use criterion::Criterion;

/// A recorded-style stream of 1,000 chat-completion chunks (~200 bytes each), then the
/// finish chunk, the usage chunk and `[DONE]`.
fn recorded_stream() -> Vec<u8> {
    let mut body = String::new();
    for i in 0..1000 {
        let text = match i % 4 {
            0 => format!(" word{i}"),
            1 => " Grüße".to_owned(),
            2 => " \\\"quoted\\\"".to_owned(),
            _ => " 😀 and more".to_owned(),
        };
        body.push_str(&format!(
            "data: {{\"id\":\"chatcmpl-AbC123\",\"object\":\"chat.completion.chunk\",\"created\":1732900000,\"model\":\"gpt-4o-mini-2024-07-18\",\"system_fingerprint\":\"fp_0ba0d124f1\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
        ));
    }
    body.push_str("data: {\"id\":\"chatcmpl-AbC123\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n");
    body.push_str("data: {\"id\":\"chatcmpl-AbC123\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":120,\"completion_tokens\":1000,\"total_tokens\":1120}}\n\n");
    body.push_str("data: [DONE]\n\n");
    body.into_bytes()
}

pub(crate) fn benches(c: &mut Criterion) {
    let body = recorded_stream();
    let pieces: Vec<&[u8]> = body.chunks(4096).collect();
    c.bench_function("llm/sse_parse_1k_chunks", |b| {
        b.iter(|| {
            let mut decoder = ChatStreamDecoder::new();
            let mut events = Vec::with_capacity(1024);
            for piece in black_box(&pieces) {
                decoder.push(piece, &mut events).expect("valid stream");
            }
            decoder.finish(&mut events).expect("complete stream");
            assert_eq!(events.len(), 1002);
            events
        })
    });
}
