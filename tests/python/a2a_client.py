"""Drives `awaken serve` with the official A2A Python SDK (a2a-sdk, pinned in
.ci/requirements.txt) over its HTTP+JSON (REST) transport, protocol 1.0.

Usage: python3 tests/python/a2a_client.py BASE_URL

The server serves three scripted agents (crates/awaken-cli/tests/cli/a2a.rs writes them):
`helper` (the host's default card; answers "Hello from Awaken." in two pieces), `waiter` (a
model that waits until its run is cancelled) and `scribe` (asks before appending "buy milk" to a
file: its first task is approved with the text "yes", its second denied with a decisions data
part). Each run plays its agent's script from the start.

Exits 0 after printing "ok: the A2A SDK works against awaken serve"; on any mismatch it exits 1
with what differed.
"""

import asyncio
import sys

import httpx
from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf.struct_pb2 import Value

from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.client.errors import A2AClientError
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.errors import A2AError, TaskNotCancelableError, TaskNotFoundError

PASSED = "ok: the A2A SDK works against awaken serve"


class Mismatch(Exception):
    """What the server answered differs from what the protocol and the script expect."""


def check(condition, what, got=None):
    if not condition:
        detail = "" if got is None else f"\n  got: {got}"
        raise Mismatch(f"{what}{detail}")


def state(task):
    return TaskState.Name(task.status.state)


def text_of(parts):
    return "".join(p.text for p in parts if p.HasField("text"))


def user_message(text, *, context_id="", task_id="", data=None):
    parts = []
    if text:
        parts.append(Part(text=text))
    if data is not None:
        parts.append(Part(data=ParseDict(data, Value())))
    n = user_message.count = getattr(user_message, "count", 0) + 1
    return Message(
        message_id=f"py-{n}",
        role=Role.ROLE_USER,
        parts=parts,
        context_id=context_id,
        task_id=task_id,
    )


async def client_for(http, base, card_path, streaming):
    resolver = A2ACardResolver(http, base)
    card = await resolver.get_agent_card(relative_card_path=card_path)
    config = ClientConfig(
        streaming=streaming,
        supported_protocol_bindings=["HTTP+JSON"],
        httpx_client=http,
    )
    return card, ClientFactory(config).create(card)


async def only_task(client, message):
    """A blocking send: the one response, which must be a task."""
    responses = [r async for r in client.send_message(SendMessageRequest(message=message))]
    check(len(responses) == 1, "a blocking send answers once", responses)
    check(responses[0].HasField("task"), "a blocking send answers a task", responses[0])
    return responses[0].task


def kind(response):
    return response.WhichOneof("payload")


def check_stream_order(responses, final_state):
    """The task first, then updates of that task, exactly one final status, last."""
    check(responses and kind(responses[0]) == "task", "a stream opens with the task", responses)
    task_id = responses[0].task.id
    finals = []
    for r in responses[1:]:
        k = kind(r)
        check(k in ("status_update", "artifact_update"), "a stream's later events are updates", r)
        update = getattr(r, k)
        check(update.task_id == task_id, "every update is of the stream's task", r)
        if k == "status_update" and update.status.state not in (
            TaskState.TASK_STATE_WORKING,
            TaskState.TASK_STATE_SUBMITTED,
        ):
            finals.append(r)
    check(len(finals) == 1, "exactly one final status", [MessageToDict(f) for f in finals])
    check(responses[-1] is finals[0], "the final status ends the stream")
    check(
        TaskState.Name(finals[0].status_update.status.state) == final_state,
        f"the stream ends {final_state}",
        finals[0],
    )
    return task_id


async def discovery_and_send(http, base):
    card, client = await client_for(http, base, None, streaming=False)
    check(card.name == "helper", "the host's card is the default agent's", card.name)
    check(card.capabilities.streaming, "the card offers streaming", card.capabilities)
    iface = card.supported_interfaces[0]
    check(
        (iface.protocol_binding, iface.protocol_version, iface.url)
        == ("HTTP+JSON", "1.0", f"{base}/a2a/helper"),
        "the card's interface is HTTP+JSON 1.0 at /a2a/helper",
        iface,
    )

    task = await only_task(client, user_message("hello"))
    check(state(task) == "TASK_STATE_COMPLETED", "a blocking send ends completed", task)
    check(text_of(task.artifacts[0].parts) == "Hello from Awaken.", "the answer artifact", task)
    check(text_of(task.status.message.parts) == "Hello from Awaken.", "the status message", task)
    context = task.context_id
    check(context, "a context id was made", task)

    got = await client.get_task(GetTaskRequest(id=task.id))
    check(got.id == task.id and state(got) == "TASK_STATE_COMPLETED", "get_task", got)

    # A streamed send in the same context: a second task.
    _, streaming = await client_for(http, base, None, streaming=True)
    responses = [
        r async for r in streaming.send_message(
            SendMessageRequest(message=user_message("stream it", context_id=context))
        )
    ]
    second = check_stream_order(responses, "TASK_STATE_COMPLETED")
    pieces = [
        text_of(r.artifact_update.artifact.parts)
        for r in responses
        if kind(r) == "artifact_update" and not r.artifact_update.last_chunk
    ]
    check(pieces == ["Hello ", "from Awaken."], "the answer streams in pieces", pieces)
    last = [r for r in responses if kind(r) == "artifact_update" and r.artifact_update.last_chunk]
    check(
        len(last) == 1 and text_of(last[0].artifact_update.artifact.parts) == "Hello from Awaken.",
        "the last piece is the whole answer",
        last,
    )

    listed = await client.list_tasks(ListTasksRequest(context_id=context))
    check(
        [t.id for t in listed.tasks] == [second, task.id],
        "list_tasks shows the context's tasks, the newest first",
        listed,
    )

    try:
        await client.get_task(GetTaskRequest(id="run-unknown"))
        raise Mismatch("an unknown task is refused")
    except TaskNotFoundError:
        pass
    await streaming.close()


async def cancel_and_subscribe(http, base):
    _, client = await client_for(http, base, "/a2a/waiter/.well-known/agent-card.json", True)
    stream = client.send_message(SendMessageRequest(message=user_message("wait")))
    first = await anext(stream)
    check(kind(first) == "task", "the stream opens with the task", first)
    task_id = first.task.id
    working = await anext(stream)
    check(
        kind(working) == "status_update"
        and working.status_update.status.state == TaskState.TASK_STATE_WORKING,
        "then the task works",
        working,
    )

    followed = client.subscribe(SubscribeToTaskRequest(id=task_id))
    opened = await anext(followed)
    check(
        kind(opened) == "task" and opened.task.id == task_id,
        "a subscription opens with the task",
        opened,
    )

    canceled = await client.cancel_task(CancelTaskRequest(id=task_id))
    check(state(canceled) == "TASK_STATE_CANCELED", "cancel_task cancels", canceled)
    rest = [r async for r in stream]
    check_stream_order([first, working, *rest], "TASK_STATE_CANCELED")
    rest_followed = [r async for r in followed]
    check_stream_order([opened, *rest_followed], "TASK_STATE_CANCELED")
    try:
        await client.cancel_task(CancelTaskRequest(id=task_id))
        raise Mismatch("a canceled task cannot be canceled again")
    except TaskNotCancelableError:
        pass
    await client.close()


def waiting_call(task):
    check(state(task) == "TASK_STATE_INPUT_REQUIRED", "a call waiting for approval", task)
    data = [p for p in task.status.message.parts if p.HasField("data")]
    check(data, "the status names the waiting call as data", task)
    waiting = MessageToDict(data[0].data)["waiting"]
    check(
        len(waiting) == 1 and waiting[0]["tool"] == "append_file" and waiting[0]["argument_digest"],
        "one waiting call of append_file with its digest",
        waiting,
    )
    return waiting[0]


async def approvals(http, base):
    _, client = await client_for(http, base, "/a2a/scribe/.well-known/agent-card.json", False)

    # Approved by the text "yes".
    asked = await only_task(client, user_message("add milk"))
    waiting_call(asked)
    done = await only_task(
        client, user_message("yes", context_id=asked.context_id, task_id=asked.id)
    )
    check(done.id == asked.id, "the answer continues the same task", done)
    check(state(done) == "TASK_STATE_COMPLETED", "the approved task completes", done)
    check(text_of(done.artifacts[0].parts) == 'Added "buy milk" to todo.txt.', "its answer", done)

    # Denied by a decisions data part, naming the call.
    asked = await only_task(client, user_message("add milk again", context_id=asked.context_id))
    call = waiting_call(asked)
    decision = {"decisions": [{"call_id": call["call_id"], "approve": False}]}
    denied = await only_task(
        client,
        user_message("", context_id=asked.context_id, task_id=asked.id, data=decision),
    )
    check(state(denied) == "TASK_STATE_COMPLETED", "the denied task completes", denied)
    check(
        text_of(denied.artifacts[0].parts) == "I did not add it: the append was refused.",
        "its answer says the call was refused",
        denied,
    )
    await client.close()


async def main(base):
    async with httpx.AsyncClient(timeout=30) as http:
        await discovery_and_send(http, base)
        await cancel_and_subscribe(http, base)
        await approvals(http, base)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: a2a_client.py BASE_URL")
    try:
        asyncio.run(main(sys.argv[1].rstrip("/")))
    except (Mismatch, A2AError, A2AClientError) as e:
        print(f"a2a_client: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
    print(PASSED)
