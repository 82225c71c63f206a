"""A play's controls: pause and resume dispatch, change the window.

The play workflow exposes them as Temporal updates (``pause``, ``resume``,
``set_window``) whose validators are the ``check_*`` methods here: a request that
makes no sense (resume a play that is not paused, a window of 0, pause a finished
play) is rejected before anything enters history. An accepted one changes the
play's ``DispatchControl`` and is forwarded to the dataset run in flight by the
``playline.control`` signal; a dataset run started later starts with it.

Cancelling is Temporal's own cancellation (``playline runs cancel``, the UI's
"Request Cancellation", ``temporal workflow cancel``), handled gracefully by the
play and its dataset run: see :mod:`~playline.workflows.dataset_run`.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from playline.contract import MAX_WINDOW, BudgetChange, DispatchControl, RunOptions
    from playline.workflows.dataset_run import CONTROL_SIGNAL

__all__ = ["PlayControls"]


class PlayControls:
    """The dispatch controls of one play, and the dataset run they are forwarded to."""

    def __init__(self, play: str) -> None:
        self.play = play
        self.dispatch = DispatchControl()
        #: the dataset run in flight (a child workflow handle), if any
        self.child: workflow.ChildWorkflowHandle[Any, Any] | None = None
        #: set once the play has completed, failed or been cancelled
        self.ended: str | None = None

    def _check_open(self, action: str) -> None:
        if self.ended is not None:
            raise ValueError(f"cannot {action} play {self.play}: it has {self.ended}")
        if workflow.cancellation_reason() is not None:
            raise ValueError(f"cannot {action} play {self.play}: it is being cancelled")

    def check_pause(self) -> None:
        """Validator of ``pause``."""
        self._check_open("pause")
        if self.dispatch.paused:
            raise ValueError(f"play {self.play} is already paused")

    def check_resume(self) -> None:
        """Validator of ``resume``."""
        self._check_open("resume")
        if not self.dispatch.paused:
            raise ValueError(f"play {self.play} is not paused")

    def check_window(self, window: int) -> None:
        """Validator of ``set_window``."""
        self._check_open("change the window of")
        if isinstance(window, bool) or not isinstance(window, int):
            raise ValueError(f"the window must be a whole number of chunks, not {window!r}")
        if not 1 <= window <= MAX_WINDOW:
            raise ValueError(f"the window must be 1 to {MAX_WINDOW} chunks in flight, not {window}")

    def check_budget(self, change: BudgetChange, options: RunOptions | None) -> None:
        """Validator of ``budget``: one change, to a cap the run has."""
        self._check_open("change the budget of")
        given = [name for name in ("add", "set") if getattr(change, name) is not None]
        if change.retry:
            given.append("retry")
        if len(given) != 1:
            raise ValueError("give exactly one of --add N, --set N or --retry")
        if options is None or not options.budgeted:
            raise ValueError(
                f"play {self.play} runs without a budget (start it with --max-credits N)"
            )
        if change.retry:
            return
        if change.spend:
            if change.provider is not None:
                raise ValueError("a money cap is the run's, not a provider's: drop --provider")
            if options.max_spend is None:
                raise ValueError(
                    f"play {self.play} has no money cap (start it with --max-spend AMOUNT)"
                )
            return
        if change.provider is not None:
            if change.provider not in options.max_credits_by_provider:
                capped = ", ".join(sorted(options.max_credits_by_provider)) or "none"
                raise ValueError(
                    f"play {self.play} has no cap for provider {change.provider!r} "
                    f"(capped: {capped})"
                )
        elif options.max_credits is None:
            raise ValueError(
                f"play {self.play} has no run-wide cap; name the capped provider (--provider)"
            )

    async def apply(self, **changes: Any) -> None:
        """Change the controls and forward them to the dataset run in flight."""
        self.dispatch = self.dispatch.model_copy(update=changes)
        if self.child is None:
            return
        try:
            await self.child.signal(CONTROL_SIGNAL, self.dispatch)
        except Exception as err:  # the run ended meanwhile; the next one starts with it
            workflow.logger.info("%s: control not forwarded to the dataset run: %s", self.play, err)
