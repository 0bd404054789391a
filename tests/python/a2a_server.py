"""Serves three A2A agents built with the official A2A Python SDK (a2a-sdk, pinned in
.ci/requirements.txt) over its HTTP+JSON (REST) binding, protocol 1.0, on 127.0.0.1, for the
client tests of crates/awaken-a2a (tests/it/python.rs):

- `/echo`: answers "echo: <text> [context <context id>, message <message id>]" as an artifact
  streamed in two chunks, then completes;
- `/asker`: asks "Which city?" (input required) the first time a context writes to it, and
  answers "forecast for <text>" when the task is continued;
- `/slow`: streams "working" and then waits until its task is canceled.

Usage: python3 tests/python/a2a_server.py

Prints "listening http://127.0.0.1:PORT" once the socket listens, then serves until killed.
"""

import asyncio
import socket
import sys

import uvicorn
from starlette.applications import Starlette
from starlette.routing import Mount

from a2a.helpers.proto_helpers import new_task, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_rest_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    TaskState,
)


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
    routes = []
    for name, executor in (("echo", Echo()), ("asker", Asker()), ("slow", Slow())):
        agent_card = card(name, f"{base}/{name}")
        handler = DefaultRequestHandler(
            agent_executor=executor,
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
