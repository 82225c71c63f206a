"""``PlaylinePlugin``: the whole playline integration as one Temporal plugin.

Add it to ``Client.connect(..., plugins=[PlaylinePlugin()])`` and every worker built
from that client registers the plays and playline's activities, uses the pydantic
data converter, passes playline's own (deterministic) modules through the sandbox,
and opens the worker's services (governor, stores, HTTP client) for as long as it
runs. With a payload codec (``codec=``, or ``settings.codec_keys``, which
``Settings.from_env()`` fills from ``PLAYLINE_CODEC_KEYS`` when no settings are given)
the client, its workers and replays encrypt and decrypt every payload, and failure
messages travel encoded too.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.metadata
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from temporalio import workflow
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import (
    DataConverter,
    DefaultFailureConverterWithEncodedAttributes,
    PayloadCodec,
)
from temporalio.plugin import SimplePlugin
from temporalio.worker import Worker, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from playline.activities import (
    BalanceActivities,
    BudgetActivities,
    ChunkActivities,
    DatasetActivities,
    EstimateActivities,
    ScalarActivities,
    SyncActivities,
    VisibilityActivities,
    WidthActivities,
)
from playline.codec import AesGcmCodec
from playline.config import Settings
from playline.errors import PlaylineError
from playline.interceptors import ErrorTranslation
from playline.published_plays import publish_plays
from playline.services import Services, ServicesHolder
from playline.workflows.dataset_run import DatasetRunWorkflow
from playline.workflows.play import registered_plays
from playline.workflows.registry import PlaysRegistry

PASSTHROUGH_MODULES = ("playline", "pydantic", "pydantic_core", "annotated_types")


class PlaylinePlugin(SimplePlugin):
    """Registers plays and playline activities and manages the worker's services.

    Workflows the worker or replayer was given already (``Worker(...,
    workflows=[my_play])``) are not added again: the plugin adds only the plays (and
    ``playline.DatasetRun``) whose workflow name the caller did not pass.

    Args:
        plays: play workflow classes to register; defaults to every play imported
            so far (import your plays module before building the worker).
        settings: where state lives and whom to call; defaults to the services'
            settings, else ``Settings.from_env()`` read once here, so a bare
            ``PlaylinePlugin()`` on a client encrypts exactly as the workers do.
            Its ``codec_keys`` (``PLAYLINE_CODEC_KEYS``) turn on payload encryption.
        services: already-open services to use instead (the caller closes them).
        codec: a payload codec for every payload of the client, its workers and
            replays (overrides ``settings.codec_keys``); put the same one on every
            client and worker of a namespace.
    """

    def __init__(
        self,
        *,
        plays: Sequence[type] | None = None,
        settings: Settings | None = None,
        services: Services | None = None,
        codec: PayloadCodec | None = None,
    ) -> None:
        self.holder = ServicesHolder(services)
        chunk = ChunkActivities(self.holder)
        datasets = DatasetActivities(self.holder)
        scalar = ScalarActivities(self.holder)
        width = WidthActivities(self.holder)
        visibility = VisibilityActivities()
        budgets = BudgetActivities(self.holder)
        estimate = EstimateActivities(self.holder)
        balances = BalanceActivities(self.holder)
        sync = SyncActivities(self.holder)
        activities: list[Callable[..., Any]] = [
            chunk.run_chunk,
            estimate.estimate_chunk,
            estimate.estimate_tool,
            estimate.estimate_waterfall,
            budgets.adjust_budget,
            budgets.end_run_budgets,
            balances.read_balances,
            datasets.load_csv,
            datasets.load_rows,
            datasets.prepare_run,
            datasets.finalize_run,
            datasets.peek,
            datasets.export,
            scalar.call_tool,
            scalar.call_waterfall,
            scalar.run_step,
            sync.sync_dataset,
            width.suggest_width,
            visibility.registered_search_attributes,
        ]

        def workflows(existing: Sequence[type] | None) -> list[type]:
            # Resolved when a worker is built, so plays imported after the client
            # was connected are still registered.
            chosen = list(plays) if plays is not None else list(registered_plays().values())
            return with_missing(existing or [], [DatasetRunWorkflow, PlaysRegistry, *chosen])

        owned = services is None
        # One reading of the environment for the codec and the services alike: a client
        # must encrypt with the keys its workers use, or it writes plaintext.
        resolved = settings or (services.settings if services is not None else Settings.from_env())

        @asynccontextmanager
        async def run_context() -> AsyncIterator[None]:
            if not owned:
                yield
                return
            opened = await Services.open(resolved)
            self.holder.set(opened)
            try:
                yield
            finally:
                self.holder.set(None)
                await opened.close()

        def workflow_runner(runner: WorkflowRunner | None) -> WorkflowRunner:
            if isinstance(runner, SandboxedWorkflowRunner):
                return dataclasses.replace(
                    runner,
                    restrictions=runner.restrictions.with_passthrough_modules(*PASSTHROUGH_MODULES),
                )
            return runner or SandboxedWorkflowRunner()

        if codec is None and resolved.codec_keys:
            codec = AesGcmCodec.from_spec(resolved.codec_keys)
        self.codec = codec

        super().__init__(
            "playline.PlaylinePlugin",
            data_converter=data_converter(codec),
            activities=activities,
            workflows=workflows,
            workflow_runner=workflow_runner,
            workflow_failure_exception_types=[PlaylineError],
            interceptors=[ErrorTranslation(self.holder)],
            run_context=run_context,
        )

    async def run_worker(self, worker: Worker, next: Callable[[Worker], Awaitable[None]]) -> None:
        """Run the worker, and publish its plays on its task queue as it starts (see
        :mod:`playline.published_plays`), so clients can tell what it registered."""
        config = worker.config(active_config=True)
        plays = registered_plays()
        names = [
            name
            for cls in config.get("workflows") or []
            if (name := workflow_name(cls)) is not None and name in plays
        ]
        client = config["client"]
        identity = config.get("identity") or client.identity
        columns = {name: plays[name].required_columns for name in names}
        publishing = asyncio.ensure_future(
            publish_plays(client, config["task_queue"], identity, names, _version(), columns)
        )
        try:
            await super().run_worker(worker, next)
        finally:
            if not publishing.done():
                publishing.cancel()
            with contextlib.suppress(BaseException):
                await publishing

    @asynccontextmanager
    async def run_replayer(self, replayer, histories, next):  # type: ignore[no-untyped-def]
        """Replaying needs no services: workflows only see recorded results."""
        async with next(replayer, histories) as results:
            yield results


def with_missing(existing: Sequence[type], ours: Sequence[type]) -> list[type]:
    """``existing`` followed by those of ``ours`` whose workflow name it lacks.

    The SDK refuses two workflows of one name ("More than one workflow named ..."),
    so a play the caller registered itself is kept as given and not added twice.
    """
    taken = {name for cls in existing if (name := workflow_name(cls)) is not None}
    added: list[type] = []
    for cls in ours:
        name = workflow_name(cls)
        if name is None or name not in taken:
            added.append(cls)
            if name is not None:
                taken.add(name)
    return [*existing, *added]


def _version() -> str:
    try:
        return importlib.metadata.version("playline")
    except importlib.metadata.PackageNotFoundError:
        return ""


def workflow_name(cls: type) -> str | None:
    """The workflow type name ``@workflow.defn`` gave ``cls`` (``None``: dynamic or none)."""
    defn = workflow._Definition.from_class(cls)
    return defn.name if defn is not None else None


def data_converter(codec: PayloadCodec | None) -> DataConverter:
    """The pydantic converter; with a codec, payloads and failure messages are encoded."""
    if codec is None:
        return pydantic_data_converter
    return dataclasses.replace(
        pydantic_data_converter,
        payload_codec=codec,
        failure_converter_class=DefaultFailureConverterWithEncodedAttributes,
    )
