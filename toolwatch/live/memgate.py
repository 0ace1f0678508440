"""One memory gate for a live process's heavy phases (parse, detection, compaction).

A live process runs two threads that each allocate a micro-batch's worth of memory: the
reader parses the next micro-batch (DuckDB's JSON parse and Arrow export, the transforms)
while the commit thread detects the previous one (window add and expiry, the passes),
writes it to the store and now and then compacts the store. Each phase alone adds ~25-100 MiB over
the process's base for a moment; the RSS peaks measured at 10k events/s were two of them
at once (``benchmarks/live_probe.py`` phases, docs/performance.md "Live memory").

:class:`MemoryGate` lets a heavy phase start beside another one only while the process's
RSS is below ``live.memory_gate_mib``; at or above it the phase waits until no other heavy
phase runs, and the phase that ends first hands freed heap pages back to the OS
(``malloc_trim``, Arrow's pool) before the next one starts. Below the threshold the two
threads overlap as before (catch-up speed); near it they take turns (memory). Waiting
phases are served in arrival order, so neither thread starves the other; a thread that
already holds the gate passes at once (nested phases). The store write of a micro-batch
is not gated: in small pages (``store.LIVE_PAGE_BYTES``) it adds ~5-9 MiB, and making
the commit thread wait for the reader costs catch-up speed.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from toolwatch.live.detection import rss_mib


@dataclass
class GateStats:
    """What the gate did (exported in the live status as ``memory_gate_*``)."""

    #: Heavy phases that started.
    entered: int = 0
    #: Phases that started beside another one (RSS below the threshold).
    overlapped: int = 0
    #: Phases that waited for another one to end (RSS at or above the threshold).
    waited: int = 0
    #: Seconds spent waiting, in total.
    wait_s: float = 0.0
    #: Seconds waited, by the phase that waited.
    wait_s_by_phase: dict[str, float] = field(default_factory=dict)
    #: Memory releases (``release``) after a phase ended with none other running.
    releases: int = 0
    #: Seconds those releases took, in total.
    release_s: float = 0.0
    #: Most heavy phases running at once (1 while the gate serializes).
    max_running: int = 0
    #: Phases by name, how often each started.
    by_phase: dict[str, int] = field(default_factory=dict)


class MemoryGate:
    """Serialize heavy phases while the RSS is at or above ``high_mib``.

    Parameters
    ----------
    high_mib
        RSS (MiB) from which a heavy phase waits for the running one instead of starting
        beside it. 0: off (phases always overlap, no RSS reads). A value below the
        process's base (e.g. 1) serializes every heavy phase.
    rss
        Reads the process's RSS in MiB (None: unknown, then the phase overlaps).
    release
        Called by a phase that ends while another waits, before the waiter starts
        (returns freed allocator memory to the OS). None: nothing.
    on_start
        Called (outside the gate's lock) as a heavy phase starts while the RSS is at or
        above ``high_mib`` (gate on):
        the live pipeline unmaps cold library code there (:mod:`toolwatch.codepages`),
        so a phase's peak counts the code it runs, not all code touched since start.
        None: nothing.
    """

    def __init__(
        self,
        high_mib: float,
        *,
        rss: Callable[[], float | None] = rss_mib,
        release: Callable[[], None] | None = None,
        on_start: Callable[[], object] | None = None,
    ):
        self.high_mib = high_mib
        self._rss = rss
        self._release = release
        self._on_start = on_start
        self._cv = threading.Condition()
        #: Running phases: thread id -> (phase name, nesting depth).
        self._running: dict[int, list[object]] = {}
        self._waiting: deque[int] = deque()
        self._ticket = 0
        self.stats = GateStats()

    @property
    def enabled(self) -> bool:
        """Whether the gate ever makes a phase wait."""
        return self.high_mib > 0

    def running(self) -> list[str]:
        """Names of the heavy phases running now (one per thread)."""
        with self._cv:
            return [str(v[0]) for v in self._running.values()]

    def _high(self) -> bool:
        rss = self._rss()
        return rss is not None and rss >= self.high_mib

    @contextmanager
    def hold(self, phase: str) -> Iterator[None]:
        """Run the body as heavy phase ``phase`` (waits while memory is high and one runs)."""
        me = threading.get_ident()
        with self._cv:
            mine = self._running.get(me)
            if mine is not None:  # nested on the same thread: already inside the gate
                mine[1] = int(mine[1]) + 1  # type: ignore[call-overload]
                nested = True
            else:
                nested = False
                self._enter(me, phase)
        if not nested and self._on_start is not None and self.enabled and self._high():
            # Only while memory is high: a drop makes the phase fault its code back in,
            # which in real time (a detection every second) cost alert latency (p99
            # 4.3 s vs 1.3 s at 10k events/s); a backlog's peaks are where it pays.
            self._on_start()
        try:
            yield
        finally:
            with self._cv:
                if nested:
                    mine = self._running[me]
                    mine[1] = int(mine[1]) - 1  # type: ignore[call-overload]
                else:
                    del self._running[me]
                    if self.enabled and self._release is not None and not self._running:
                        # The next phase starts from what this one freed, not on top of
                        # what the allocators kept of it (glibc keeps freed heap pages
                        # until a trim; the periodic trimmer runs every 5 s).
                        t = time.monotonic()
                        self._release()
                        self.stats.releases += 1
                        self.stats.release_s += time.monotonic() - t
                    self._cv.notify_all()

    def _enter(self, me: int, phase: str) -> None:
        """Block (holding ``self._cv``) until ``phase`` may start, then mark it running."""
        st = self.stats
        if self.enabled and (self._running or self._waiting) and (
            self._waiting or self._high()
        ):
            self._ticket += 1
            ticket = self._ticket
            self._waiting.append(ticket)
            t = time.monotonic()
            st.waited += 1
            try:
                # Served in arrival order, each once nothing else runs.
                while self._running or self._waiting[0] != ticket:
                    self._cv.wait()
            finally:
                self._waiting.remove(ticket)
                waited = time.monotonic() - t
                st.wait_s += waited
                st.wait_s_by_phase[phase] = st.wait_s_by_phase.get(phase, 0.0) + waited
            self._cv.notify_all()  # the next waiter re-checks (it still waits for this one)
        if self._running:
            st.overlapped += 1
        self._running[me] = [phase, 0]
        st.entered += 1
        st.by_phase[phase] = st.by_phase.get(phase, 0) + 1
        st.max_running = max(st.max_running, len(self._running))


def release_memory() -> None:
    """Hand freed heap memory back to the OS: glibc's free pages, Arrow's unused pool."""
    from toolwatch.allocator import release_memory as _release

    _release()
