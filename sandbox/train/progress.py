"""What a user watches while a run trains: each start-up phase on a line of its own as it happens (building the
model, compiling the step, capturing the CUDA graph), so the slow first seconds say why they are slow; then the
training bar, whose clocks are labelled (elapsed, remaining).

``Progress(enabled, title)``: ``phase(label)`` starts a phase (a spinner with its running time), ``phase_done(note)``
ends it with a line that keeps its seconds; ``training(total, completed)`` starts the bar, ``update(completed,
info)`` moves it. Disabled, it shows nothing (a sweep worker's runs, tests).
"""
from __future__ import annotations

import time


class Progress:
    def __init__(self, enabled: bool, title: str):
        self.enabled, self.title = enabled, title
        self.live = None                # the rich display showing now: a phase's spinner or the training bar
        self.task = None
        self.label, self.t_phase = None, 0.0

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self._stop()

    def phase(self, label: str) -> None:
        """Start a phase (ending the one before, if any, without a line); on a terminal a spinner shows it."""
        from rich import get_console
        from rich.progress import Progress as Bar, SpinnerColumn, TextColumn, TimeElapsedColumn
        self._stop()
        self.label, self.t_phase = label, time.perf_counter()
        if self.enabled and get_console().is_terminal:
            self.live = Bar(SpinnerColumn(), TextColumn(f"[bold]{self.title}[/]  {{task.description}}"),
                            TimeElapsedColumn(), transient=True)
            self.live.start()
            self.task = self.live.add_task(label, total=None)

    def phase_done(self, note: str = "") -> float:
        """End the current phase with a line: its label, its seconds and ``note``. Returns the seconds."""
        seconds = time.perf_counter() - self.t_phase
        self._stop()
        if self.enabled and self.label is not None:
            from rich import get_console
            from rich.markup import escape
            note = f" ({escape(note)})" if note else ""
            get_console().print(f"[bold]{escape(self.title)}[/]  {escape(self.label)}: {seconds:.1f} s{note}",
                                highlight=False)
        self.label = None
        return seconds

    def training(self, total: int, completed: int) -> None:
        """Start the training bar: its clocks count the training alone (the start-up has its lines), and the losses
        and accuracy go on a line of their own below it."""
        self._stop()
        if self.enabled:
            self.live = _bar(self.title)
            self.live.start()
            self.task = self.live.add_task("train", total=total, completed=completed, info="")

    def update(self, completed: int, info: str) -> None:
        if self.live is not None:
            self.live.update(self.task, completed=completed, info=info)

    def _stop(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


def _clock(seconds) -> str:
    if seconds is None:
        return "?"
    minutes, s = divmod(int(round(seconds)), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{s:02d}" if minutes >= 60 else f"{minutes}:{s:02d}"


def _bar(title: str):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, ProgressColumn, TextColumn
    from rich.text import Text

    class Clocks(ProgressColumn):
        """The training's elapsed and remaining time, each named (a bare clock reads as either)."""

        def render(self, task):
            return Text(f"elapsed {_clock(task.elapsed)}, remaining {_clock(task.time_remaining)}")

    class TwoLines(Bar):
        def get_renderables(self):
            yield self.make_tasks_table(self.tasks)
            for task in self.tasks:
                yield Text(f"  {task.fields.get('info', '')}", no_wrap=True, overflow="ellipsis")

    return TwoLines(TextColumn(f"[bold]{title}"), BarColumn(bar_width=24), MofNCompleteColumn(), Clocks())
