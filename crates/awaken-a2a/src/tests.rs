//! The JSON of each type, pinned, and read back.

use expect_test::{Expect, expect};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::*;

/// Checks `value`'s JSON against `expected` and that the JSON reads back to `value`.
fn pins<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(
    value: &T,
    expected: Expect,
) {
    let text = serde_json::to_string(value).expect("serialisable");
    expected.assert_eq(&text);
    let back: T = serde_json::from_str(&text).expect("reads back");
    assert_eq!(&back, value);
}

fn answer_task() -> Task {
    Task {
        id: "run-1".into(),
        context_id: "t1".into(),
        status: TaskStatus {
            state: TaskState::Completed,
            message: Some(
                Message::agent("run-1-status", vec![Part::text("Done.")]).in_task("t1", "run-1"),
            ),
            timestamp: Some(timestamp(1_700_000_000_123)),
        },
        artifacts: vec![Artifact {
            artifact_id: "run-1-answer".into(),
            name: Some("answer".into()),
            parts: vec![Part::text("Done.")],
            ..Artifact::default()
        }],
        ..Task::default()
    }
}

#[test]
fn agent_card() {
    let card = AgentCard {
        name: "scribe".into(),
        description: "Keeps a to-do list".into(),
        supported_interfaces: vec![AgentInterface {
            url: "http://127.0.0.1:8080/a2a/scribe".into(),
            protocol_binding: HTTP_JSON_BINDING.into(),
            tenant: None,
            protocol_version: PROTOCOL_VERSION.into(),
        }],
        version: "0.1.0".into(),
        capabilities: AgentCapabilities {
            streaming: Some(true),
            push_notifications: Some(false),
            extended_agent_card: None,
        },
        security_schemes: [(
            "bearer".to_owned(),
            SecurityScheme::HttpAuthSecurityScheme(HttpAuthSecurityScheme {
                scheme: "Bearer".into(),
                ..HttpAuthSecurityScheme::default()
            }),
        )]
        .into(),
        security_requirements: vec![SecurityRequirement {
            schemes: [("bearer".to_owned(), StringList::default())].into(),
        }],
        default_input_modes: vec!["text/plain".into()],
        default_output_modes: vec!["text/plain".into()],
        skills: vec![AgentSkill {
            id: "append_file".into(),
            name: "append_file".into(),
            description: "Appends a line".into(),
            tags: vec!["tool".into()],
            ..AgentSkill::default()
        }],
        ..AgentCard::default()
    };
    pins(
        &card,
        expect![[
            r#"{"name":"scribe","description":"Keeps a to-do list","supportedInterfaces":[{"url":"http://127.0.0.1:8080/a2a/scribe","protocolBinding":"HTTP+JSON","protocolVersion":"1.0"}],"version":"0.1.0","capabilities":{"streaming":true,"pushNotifications":false},"securitySchemes":{"bearer":{"httpAuthSecurityScheme":{"scheme":"Bearer"}}},"securityRequirements":[{"schemes":{"bearer":{"list":[]}}}],"defaultInputModes":["text/plain"],"defaultOutputModes":["text/plain"],"skills":[{"id":"append_file","name":"append_file","description":"Appends a line","tags":["tool"]}]}"#
        ]],
    );
}

#[test]
fn message_with_text_and_data_parts() {
    let mut message = Message::user_text("m1", "add milk").in_task("t1", "run-1");
    message.parts.push(Part::data(
        json!({"decisions": [{"call_id": "c1", "approve": true}]}),
    ));
    pins(
        &message,
        expect![[
            r#"{"messageId":"m1","contextId":"t1","taskId":"run-1","role":"ROLE_USER","parts":[{"text":"add milk"},{"data":{"decisions":[{"approve":true,"call_id":"c1"}]}}]}"#
        ]],
    );
}

#[test]
fn a_part_reads_each_kind_and_its_media_type() {
    let parts: Vec<Part> = serde_json::from_value(json!([
        {"text": "hi"},
        {"url": "https://example.invalid/a.png", "mediaType": "image/png", "filename": "a.png"},
        {"raw": "aGk="},
        {"data": [1, 2]},
    ]))
    .expect("parts");
    let kinds: Vec<_> = parts.iter().map(Part::kind).collect();
    assert_eq!(kinds, ["text", "url", "raw", "data"]);
    assert_eq!(parts[1].media_type.as_deref(), Some("image/png"));
}

#[test]
fn send_message_request_as_the_sdk_sends_it() {
    let request: SendMessageRequest = serde_json::from_value(json!({
        "message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hello"}]},
        "configuration": {"acceptedOutputModes": ["text/plain"], "returnImmediately": true},
    }))
    .expect("a request");
    pins(
        &request,
        expect![[
            r#"{"message":{"messageId":"m1","role":"ROLE_USER","parts":[{"text":"hello"}]},"configuration":{"acceptedOutputModes":["text/plain"],"returnImmediately":true}}"#
        ]],
    );
}

#[test]
fn task_and_send_message_response() {
    pins(
        &SendMessageResponse::Task(answer_task()),
        expect![[
            r#"{"task":{"id":"run-1","contextId":"t1","status":{"state":"TASK_STATE_COMPLETED","message":{"messageId":"run-1-status","contextId":"t1","taskId":"run-1","role":"ROLE_AGENT","parts":[{"text":"Done."}]},"timestamp":"2023-11-14T22:13:20.123Z"},"artifacts":[{"artifactId":"run-1-answer","name":"answer","parts":[{"text":"Done."}]}]}}"#
        ]],
    );
}

#[test]
fn stream_responses() {
    let status = StreamResponse::StatusUpdate(TaskStatusUpdateEvent {
        task_id: "run-1".into(),
        context_id: "t1".into(),
        status: TaskStatus {
            state: TaskState::Working,
            ..TaskStatus::default()
        },
        metadata: None,
    });
    pins(
        &status,
        expect![[
            r#"{"statusUpdate":{"taskId":"run-1","contextId":"t1","status":{"state":"TASK_STATE_WORKING"}}}"#
        ]],
    );
    let artifact = StreamResponse::ArtifactUpdate(TaskArtifactUpdateEvent {
        task_id: "run-1".into(),
        context_id: "t1".into(),
        artifact: Artifact {
            artifact_id: "run-1-answer".into(),
            parts: vec![Part::text("Do")],
            ..Artifact::default()
        },
        append: true,
        last_chunk: false,
        metadata: None,
    });
    pins(
        &artifact,
        expect![[
            r#"{"artifactUpdate":{"taskId":"run-1","contextId":"t1","artifact":{"artifactId":"run-1-answer","parts":[{"text":"Do"}]},"append":true}}"#
        ]],
    );
    pins(
        &StreamResponse::Message(Message::agent("m2", vec![Part::text("hi")])),
        expect![[r#"{"message":{"messageId":"m2","role":"ROLE_AGENT","parts":[{"text":"hi"}]}}"#]],
    );
    let task = StreamResponse::Task(Task {
        id: "run-1".into(),
        context_id: "t1".into(),
        status: TaskStatus {
            state: TaskState::Submitted,
            ..TaskStatus::default()
        },
        ..Task::default()
    });
    pins(
        &task,
        expect![[
            r#"{"task":{"id":"run-1","contextId":"t1","status":{"state":"TASK_STATE_SUBMITTED"}}}"#
        ]],
    );
}

#[test]
fn list_tasks_request_and_response() {
    let request: ListTasksRequest = serde_json::from_value(json!({
        "contextId": "t1", "status": "TASK_STATE_INPUT_REQUIRED", "pageSize": 10,
    }))
    .expect("a request");
    pins(
        &request,
        expect![[r#"{"contextId":"t1","status":"TASK_STATE_INPUT_REQUIRED","pageSize":10}"#]],
    );
    let response = ListTasksResponse {
        tasks: vec![Task {
            id: "run-1".into(),
            context_id: "t1".into(),
            status: TaskStatus {
                state: TaskState::InputRequired,
                ..TaskStatus::default()
            },
            ..Task::default()
        }],
        next_page_token: String::new(),
        page_size: 10,
        total_size: 1,
    };
    pins(
        &response,
        expect![[
            r#"{"tasks":[{"id":"run-1","contextId":"t1","status":{"state":"TASK_STATE_INPUT_REQUIRED"}}],"nextPageToken":"","pageSize":10,"totalSize":1}"#
        ]],
    );
}

#[test]
fn each_state_names_itself_as_its_json_does() {
    for state in [
        TaskState::Unspecified,
        TaskState::Submitted,
        TaskState::Working,
        TaskState::Completed,
        TaskState::Failed,
        TaskState::Canceled,
        TaskState::InputRequired,
        TaskState::Rejected,
        TaskState::AuthRequired,
    ] {
        assert_eq!(json!(state), json!(state.as_str()));
    }
    assert!(TaskState::Canceled.is_terminal() && !TaskState::InputRequired.is_terminal());
    assert!(TaskState::InputRequired.is_interrupted() && !TaskState::Working.is_interrupted());
}

#[test]
fn error_bodies() {
    let render = |e: A2aError| serde_json::to_string(&e.body()).expect("serialisable");
    expect![[r#"{"error":{"code":404,"status":"NOT_FOUND","message":"no task `run-9`","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"TASK_NOT_FOUND","domain":"a2a-protocol.org","metadata":{"taskId":"run-9"}}]}}"#]]
        .assert_eq(&render(A2aError::TaskNotFound { task_id: "run-9".into() }));
    expect![[r#"{"error":{"code":400,"status":"FAILED_PRECONDITION","message":"A2A version `0.3` is not supported: this server speaks 1.0","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"VERSION_NOT_SUPPORTED","domain":"a2a-protocol.org","metadata":{"version":"0.3"}}]}}"#]]
        .assert_eq(&render(A2aError::VersionNotSupported { version: "0.3".into() }));
    expect![[r#"{"error":{"code":409,"status":"ABORTED","message":"thread `t1` has a run in flight","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"INVALID_REQUEST","domain":"a2a-protocol.org","metadata":{"code":"thread_busy"}}]}}"#]]
        .assert_eq(&render(A2aError::Refused {
            status: 409,
            code: "thread_busy".into(),
            detail: "thread `t1` has a run in flight".into(),
        }));
    let statuses: Vec<(u16, &str)> = [
        A2aError::InvalidParams {
            field: "message".into(),
            detail: "missing".into(),
        },
        A2aError::InvalidRequest {
            detail: "not JSON".into(),
        },
        A2aError::UnsupportedMediaType {
            content_type: "text/plain".into(),
        },
        A2aError::ContentTypeNotSupported {
            index: 1,
            kind: "url".into(),
        },
        A2aError::UnsupportedOperation {
            operation: "subscribe".into(),
            reason: "ended".into(),
        },
        A2aError::TaskNotCancelable {
            task_id: "r".into(),
            reason: "done".into(),
        },
        A2aError::PushNotificationNotSupported,
        A2aError::MethodNotFound { what: "/x".into() },
        A2aError::Internal {
            detail: "store".into(),
        },
    ]
    .iter()
    .map(|e| (e.http_status(), e.reason()))
    .collect();
    assert_eq!(
        statuses,
        [
            (400, "INVALID_PARAMS"),
            (400, "INVALID_REQUEST"),
            (415, "CONTENT_TYPE_NOT_SUPPORTED"),
            (400, "CONTENT_TYPE_NOT_SUPPORTED"),
            (400, "UNSUPPORTED_OPERATION"),
            (400, "TASK_NOT_CANCELABLE"),
            (400, "PUSH_NOTIFICATION_NOT_SUPPORTED"),
            (404, "METHOD_NOT_FOUND"),
            (500, "INTERNAL_ERROR"),
        ]
    );
}

#[test]
fn timestamps_are_rfc_3339_utc() {
    assert_eq!(timestamp(0), "1970-01-01T00:00:00.000Z");
    assert_eq!(timestamp(-5), "1970-01-01T00:00:00.000Z");
    assert_eq!(timestamp(951_782_400_000), "2000-02-29T00:00:00.000Z");
    assert_eq!(timestamp(1_767_225_599_999), "2025-12-31T23:59:59.999Z");
}
