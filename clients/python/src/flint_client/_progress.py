"""The progress bar of ``Job.wait(progress=True)``: a ``tqdm.auto`` bar (a widget in
Jupyter, text in a terminal) fed by the job's events, shared by both clients."""

from __future__ import annotations

from typing import Any, Dict, Optional

from .models import TASK_FINAL_STATES, EndEvent, Event, JobEvent, JobView, LaggedEvent, TaskEvent


class Progress:
    """Follows a job's tasks from its events (or from polled views) on a bar.

    The counts are the job's at the first view, moved by each ``task`` event, and set
    exactly again from every job view (``end``, a poll, a resync after ``lagged``).
    """

    def __init__(self, job_id: str, enabled: bool = True, **tqdm_options: Any) -> None:
        self.job_id = job_id
        self.enabled = enabled
        self._options = tqdm_options
        self._bar: Any = None
        self._states: Dict[int, str] = {}
        self.counts: Dict[str, int] = {
            "waiting": 0,
            "pending": 0,
            "running": 0,
            "succeeded": 0,
            "failed": 0,
            "killed": 0,
        }
        self.total = 0
        self.state = ""

    def _ensure_bar(self) -> None:
        if self._bar is None and self.enabled:
            from tqdm.auto import tqdm  # type: ignore[import-untyped,unused-ignore]

            options = {"desc": self.job_id, "unit": "task", "dynamic_ncols": True}
            options.update(self._options)
            self._bar = tqdm(total=self.total, **options)

    def view(self, view: JobView) -> None:
        """Sets the counts from a job view."""
        self.total = view.tasks
        self.state = view.state
        self.counts = {
            "waiting": view.counts.waiting,
            "pending": view.counts.pending,
            "running": view.counts.running,
            "succeeded": view.counts.succeeded,
            "failed": view.counts.failed,
            "killed": view.counts.killed,
        }
        self._states.clear()
        self._show(force=view.ended)

    def event(self, event: Event) -> None:
        """Moves the counts by one event of the job's stream."""
        if isinstance(event, (JobEvent, EndEvent)):
            self.view(event.job)
        elif isinstance(event, TaskEvent):
            before = self._states.get(event.index)
            if before is None:
                before = self._came_from(event.state)
            if before in TASK_FINAL_STATES:
                return
            self._states[event.index] = event.state
            if self.counts.get(before, 0) > 0:
                self.counts[before] -= 1
            self.counts[event.state] = self.counts.get(event.state, 0) + 1
            self._show()
        elif isinstance(event, LaggedEvent):
            self._show()

    def _came_from(self, state: str) -> str:
        """The state a task not seen yet left for ``state``: running is entered from
        pending; pending from waiting (its inputs came) or from running (a retry); an
        end from running, or without running from waiting (``upstream_failed``, or its
        job killed) or pending (its job killed). The first of those the counts still
        hold a task in."""
        if state in ("running", "waiting"):
            return "pending" if state == "running" else "waiting"
        options = ("waiting", "running") if state == "pending" else ("running", "waiting", "pending")
        return next((s for s in options if self.counts.get(s, 0) > 0), options[0])

    def _show(self, force: bool = False) -> None:
        if not self.enabled:
            return
        self._ensure_bar()
        bar = self._bar
        if bar.total != self.total:
            bar.total = self.total
        done = min(self.total, self.counts["succeeded"] + self.counts["failed"] + self.counts["killed"])
        postfix = f"{self.counts['running']} running, {self.counts['failed']} failed"
        if self.counts["waiting"]:
            postfix = f"{self.counts['waiting']} waiting, " + postfix
        if self.state and self.state not in ("queued", "running"):
            postfix += f", {self.state}"
        bar.set_postfix_str(postfix, refresh=False)
        if done != bar.n:
            bar.update(done - bar.n)
        if force:
            bar.refresh()

    def close(self, view: Optional[JobView] = None) -> None:
        """Shows the final view, if given, and closes the bar."""
        if view is not None:
            self.view(view)
        if self._bar is not None:
            self._bar.close()
            self._bar = None
