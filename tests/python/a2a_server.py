"""Serves four A2A agents built with the official A2A Python SDK (a2a-sdk, pinned in
.ci/requirements.txt) over its HTTP+JSON (REST) binding, protocol 1.0, on 127.0.0.1, for the
client tests of crates/awaken-a2a (tests/it/python.rs) and the crash-recovery test of
crates/awaken-cli (tests/cli/a2a.rs):

- `/echo`: answers "echo: <text> [context <context id>, message <message id>]" as an artifact
  streamed in two chunks, then completes;
- `/asker`: asks "Which city?" (input required) the first time a context writes to it, and
  answers "forecast for <text>" when the task is continued;
- `/slow`: streams "working" and then waits until its task is canceled;
- `/hold`: starts work and waits until `POST /hold/release`, then answers "held: <text>" as an
  artifact and completes (a release lets every held task, and every later one, go on).

Every agent recognises a message id it has seen before (on a message naming no task): rather
than starting a second task it re-attaches the request to the task that message started,
streaming that task (its snapshot, then its events) or, when it has ended, the stored task.
`GET /stats` answers, per agent, how many tasks it started and how many repeated message ids
it recognised: `{"hold": {"started": 1, "repeats": 1}, ...}`.

Usage: python3 tests/python/a2a_server.py

Prints "listening http://127.0.0.1:PORT" once the socket listens, then serves until killed.
"""

import asyncio
import socket
import sys
from contextlib import aclosing
from dataclasses import asdict, dataclass

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route

from a2a.helpers.proto_helpers import new_task, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.agent_execution.active_task import (
    INTERRUPTED_TASK_STATES,
    TERMINAL_TASK_STATES,
)
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_rest_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    GetTaskRequest,
    SubscribeToTaskRequest,
    Task,
    TaskState,
)
from a2a.utils.errors import UnsupportedOperationError

# The states a blocking send answers in: the task ended, or it waits for the client.
SETTLED_STATES = TERMINAL_TASK_STATES | INTERRUPTED_TASK_STATES


async def start_task(context: RequestContext, queue: EventQueue) -> TaskUpdater:
    """Publishes the task (new, or the one the message continues) and returns its updater."""
    if context.current_task is None:
        await queue.enqueue_event(
            new_task(
                context.task_id,
                context.context_id,
                TaskState.TASK_STATE_SUBMITTED,
                history=[context.message],
            )
        )
    return TaskUpdater(queue, context.task_id, context.context_id)


class Echo(AgentExecutor):
    async def execute(self, context: RequestContext, queue: EventQueue) -> None:
        updater = await start_task(context, queue)
        await updater.start_work()
        text = context.get_user_input()
        message_id = context.message.message_id if context.message else ""
        await updater.add_artifact(
            [new_text_part(f"echo: {text}")], artifact_id="answer", append=False
        )
        await updater.add_artifact(
            [new_text_part(f" [context {context.context_id}, message {message_id}]")],
            artifact_id="answer",
            append=True,
            last_chunk=True,
        )
        await updater.complete()

    async def cancel(self, context: RequestContext, queue: EventQueue) -> None:
        await TaskUpdater(queue, context.task_id, context.context_id).cancel()


class Asker(AgentExecutor):
    async def execute(self, context: RequestContext, queue: EventQueue) -> None:
        continued = context.current_task is not None
        updater = await start_task(context, queue)
        if not continued:
            await updater.requires_input(
                updater.new_agent_message([new_text_part("Which city?")])
            )
            return
        await updater.complete(
            updater.new_agent_message(
                [new_text_part(f"forecast for {context.get_user_input()}")]
            )
        )

    async def cancel(self, context: RequestContext, queue: EventQueue) -> None:
        await TaskUpdater(queue, context.task_id, context.context_id).cancel()


class Slow(AgentExecutor):
    async def execute(self, context: RequestContext, queue: EventQueue) -> None:
        updater = await start_task(context, queue)
        await updater.start_work()
        await updater.add_artifact([new_text_part("working")], artifact_id="progress")
        # Until the task is canceled (which cancels this coroutine).
        await asyncio.Event().wait()

    async def cancel(self, context: RequestContext, queue: EventQueue) -> None:
        await TaskUpdater(queue, context.task_id, context.context_id).cancel()


class Hold(AgentExecutor):
    def __init__(self) -> None:
        # Set once by `POST /hold/release`; held tasks, and later ones, then go on.
        self.released = asyncio.Event()

    async def execute(self, context: RequestContext, queue: EventQueue) -> None:
        updater = await start_task(context, queue)
        await updater.start_work()
        await self.released.wait()
        await updater.add_artifact(
            [new_text_part(f"held: {context.get_user_input()}")],
            artifact_id="answer",
            last_chunk=True,
        )
        await updater.complete()

    async def cancel(self, context: RequestContext, queue: EventQueue) -> None:
        await TaskUpdater(queue, context.task_id, context.context_id).cancel()


@dataclass
class Stats:
    """What one agent did: tasks started, repeated message ids recognised."""

    started: int = 0
    repeats: int = 0


class Counted(AgentExecutor):
    """Runs `inner`, counting the executions that start a new task."""

    def __init__(self, inner: AgentExecutor, stats: Stats) -> None:
        self.inner = inner
        self.stats = stats

    async def execute(self, context: RequestContext, queue: EventQueue) -> None:
        if context.current_task is None:
            self.stats.started += 1
        await self.inner.execute(context, queue)

    async def cancel(self, context: RequestContext, queue: EventQueue) -> None:
        await self.inner.cancel(context, queue)


def task_id_of(event) -> str:
    """The id of the task an event names ("" when it names none)."""
    if isinstance(event, Task):
        return event.id
    return getattr(event, "task_id", "")


class OnceHandler(DefaultRequestHandler):
    """The SDK's handler, except that a message id seen before (on a message naming no task)
    re-attaches to the task that message started instead of starting another.

    A message id is remembered from the first event of its request that names a task; a
    repeat that arrives before then is not recognised."""

    def __init__(self, *, stats: Stats, **kwargs) -> None:
        super().__init__(**kwargs)
        self.stats = stats
        # Message id → the id of the task its first request started.
        self.started_by: dict[str, str] = {}

    def earlier_task(self, message) -> str | None:
        """The task an earlier request with this message's id started, counted as a repeat."""
        if message.task_id or not message.message_id:
            return None
        task_id = self.started_by.get(message.message_id)
        if task_id is not None:
            self.stats.repeats += 1
        return task_id

    def remember(self, message_id: str, event) -> None:
        task_id = task_id_of(event)
        if message_id and task_id:
            self.started_by.setdefault(message_id, task_id)

    async def reattach(self, task_id: str, context):
        """The task's events from now on: its snapshot first, then what follows; the stored
        task alone when it has ended."""
        yielded = False
        try:
            async for event in self.on_subscribe_to_task(
                SubscribeToTaskRequest(id=task_id), context
            ):
                yielded = True
                yield event
        except UnsupportedOperationError:
            # The task has ended: nothing further to stream.
            if yielded:
                raise
            yield await self.on_get_task(GetTaskRequest(id=task_id), context)

    async def on_message_send_stream(self, params, context):
        task_id = self.earlier_task(params.message)
        if task_id is not None:
            async for event in self.reattach(task_id, context):
                yield event
            return
        message_id = "" if params.message.task_id else params.message.message_id
        async for event in super().on_message_send_stream(params, context):
            self.remember(message_id, event)
            yield event

    async def on_message_send(self, params, context):
        task_id = self.earlier_task(params.message)
        if task_id is None:
            result = await super().on_message_send(params, context)
            if not params.message.task_id:
                self.remember(params.message.message_id, result)
            return result
        if not params.configuration.return_immediately:
            # Until the task ends or waits for the client, as the first request did.
            async with aclosing(self.reattach(task_id, context)) as events:
                async for event in events:
                    status = getattr(event, "status", None)
                    if status is not None and status.state in SETTLED_STATES:
                        break
        return await self.on_get_task(GetTaskRequest(id=task_id), context)


def card(name: str, url: str) -> AgentCard:
    return AgentCard(
        name=name,
        description=f"The `{name}` test agent.",
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding="HTTP+JSON", protocol_version="1.0")
        ],
        version="1.0.0",
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[
            AgentSkill(id=name, name=name, description=f"{name} skill", tags=["test"])
        ],
    )


def main() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    hold = Hold()
    stats: dict[str, Stats] = {}

    async def release(_: Request) -> Response:
        hold.released.set()
        return Response(status_code=204)

    async def stats_route(_: Request) -> Response:
        return JSONResponse({name: asdict(s) for name, s in stats.items()})

    # Before the agents' mounts, whose REST routes end in a catch-all tenant mount.
    routes = [
        Route("/hold/release", release, methods=["POST"]),
        Route("/stats", stats_route, methods=["GET"]),
    ]
    agents = (("echo", Echo()), ("asker", Asker()), ("slow", Slow()), ("hold", hold))
    for name, executor in agents:
        agent_card = card(name, f"{base}/{name}")
        stats[name] = Stats()
        handler = OnceHandler(
            stats=stats[name],
            agent_executor=Counted(executor, stats[name]),
            task_store=InMemoryTaskStore(),
            agent_card=agent_card,
        )
        # Each agent under its own mount (the REST routes end in a catch-all tenant mount).
        routes.append(
            Mount(
                f"/{name}",
                routes=create_agent_card_routes(agent_card) + create_rest_routes(handler),
            )
        )
    app = Starlette(routes=routes)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    print(f"listening {base}", flush=True)
    asyncio.run(server.serve(sockets=[sock]))


if __name__ == "__main__":
    sys.exit(main())
