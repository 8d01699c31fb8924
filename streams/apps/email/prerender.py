"""PDFs rendered ahead, in processes, while the sender sends (docs/email.md, "Rendering
ahead").

Why: the email sender spends most of its time in WeasyPrint (a PDF per email, about
65 ms on an idle core for the one-page PDF; docs/benchmarks.md, "The email sender at
month end"), pure Python under the GIL, so a thread would not help and the emails of a
month end trail the invoices by a PDF after another. A :class:`Prerenderer` keeps a small
pool of processes (``settings.worker.email_render_processes``) and renders the PDFs of
the records the sender polled next while it claims, sends and commits the one in hand.

What does not change: the records are still handled one at a time in order, each
claimed, sent, marked and its offset committed before the next (the sender's commit
order); a PDF is a function of the stored document only (the same bytes in any process:
:mod:`streams.adapters.documents.pdf`), and a stored document never changes once issued,
so a PDF rendered ahead is the PDF the sender would have rendered. Only what the sender
renders moves, never what it decides.

Failures: a document whose PDF cannot be rendered raises the same
:class:`~streams.apps.email.errors.RenderError` from :meth:`Prerenderer.take` as it
would in the sender (recorded ``'skipped'``). A render process that dies (a crash of
the native layout code, a kill) breaks the pool: :meth:`take` answers None for every
PDF pending, the sender renders those itself as it would without a pool (so a document
that crashes the renderer crashes the sender's own process as before, never loops in
the pool), and the pool is started again for the next records.

A render process that hangs (the native layout code stuck, a process stopped) would
stall the sender for ever, so :meth:`take` waits at most ``timeout_s``
(``settings.worker.email_render_timeout_s``): past it the pool's processes are killed
(``SIGKILL``, which also ends a stopped one) and the pool started again, and the sender
renders the pending PDFs itself as for a broken pool (so a document that hangs the
renderer hangs the sender's own render, as without a pool, but the ERROR names it);
logged as an ERROR and counted in ``invoicing_email_render_timeouts_total``. The same
bound holds at :meth:`close`: a render still running ``timeout_s`` after the stop has
its process killed, so a hung one never holds the sender's stop.

Why kill the processes ourselves: :class:`~concurrent.futures.ProcessPoolExecutor` has
no public way to, and its ``shutdown`` (even ``wait=False``) only asks each process to
stop after its current task, which a hung one never finishes (its executor's thread
waits on it for ever; ``terminate`` is a ``SIGTERM``, which a stopped process does not
act on). The executor's own handles on its processes are killed (``_processes``, a
private CPython attribute, typed in typeshed; the hung-process tests of
tests/unit/documents/test_email_prerender.py fail if it changes). Not pebble's
``ProcessPool``, whose per-task timeout does kill the worker: a new dependency for a
few lines, and a different failure model (a dead worker replaced and one task failed,
instead of the broken pool the sender already falls back from).
"""

from __future__ import annotations

import logging
import multiprocessing
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.process import BaseProcess

import psycopg
from prometheus_client import Counter
from psycopg_pool import PoolTimeout

from streams.adapters.documents.source import DocumentSource
from streams.apps.email.attachments import DocumentFiles, stored_document, stored_pdf
from streams.apps.email.errors import RenderError, TransientEmailError
from streams.apps.email.render import DocumentRef, document_ref, is_zero_total
from streams.apps.email.store import Deliveries
from streams.core.domain.documents import Document
from streams.core.domain.events import CreditNoteIssued, InvoiceIssued

#: What looking ahead may meet; each leaves the record to the sender, which meets it
#: again with its own retries and outcomes.
_AHEAD_FAILURES = (RenderError, TransientEmailError, psycopg.Error, PoolTimeout)

__all__ = ["Prerenderer"]

logger = logging.getLogger(__name__)

#: How long a killed render process is waited for to be gone (seconds); a ``SIGKILL``
#: ends a process in milliseconds, this only bounds the wait.
_KILL_WAIT_S = 5.0

RENDER_TIMEOUTS = Counter(
    "invoicing_email_render_timeouts_total",
    "PDFs rendered ahead not ready within worker.email_render_timeout_s: the render "
    "processes were killed and started again, the sender rendered the PDF itself.",
)


def _warm() -> None:
    """A render process's start: load WeasyPrint and Pango once (about a second), not
    on its first PDF."""
    import weasyprint  # noqa: F401


class Prerenderer:
    """A pool of ``processes`` processes rendering the PDFs (and CSV of lines) of stored
    documents ahead of the sender, keyed by ``document_key``; at most ``limit`` pending;
    :meth:`take` waits at most ``timeout_s`` seconds for one (default 30.0, the default
    of ``settings.worker.email_render_timeout_s``; the attribute may be changed between
    calls). The wait counts from :meth:`take`, so it includes a fresh process's start
    (about a second) when the pool was just started.

    Processes are started with ``spawn`` (the sender's process holds librdkafka and
    psycopg threads, which ``fork`` would copy mid-state).

    Raises:
        ValueError: ``processes`` < 1, ``limit`` < 1 or ``timeout_s`` <= 0.
    """

    def __init__(self, processes: int, *, limit: int = 16, timeout_s: float = 30.0) -> None:
        if processes < 1 or limit < 1 or not timeout_s > 0:
            raise ValueError(
                "a prerenderer needs processes >= 1, limit >= 1 and timeout_s > 0, "
                f"got {processes}, {limit}, {timeout_s}"
            )
        self._processes = processes
        self.limit = limit
        self.timeout_s = timeout_s
        self._pool = self._start()
        self._pending: dict[str, Future[DocumentFiles]] = {}

    def _start(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            self._processes, mp_context=multiprocessing.get_context("spawn"), initializer=_warm
        )

    def __len__(self) -> int:
        return len(self._pending)

    def submit(self, stored: Document, ref: DocumentRef) -> bool:
        """Start rendering ``stored``'s files (named after ``ref``), unless ``limit`` are
        pending or this document is already; returns whether it was started."""
        key = ref.document_key
        if key in self._pending or len(self._pending) >= self.limit:
            return False
        try:
            self._pending[key] = self._pool.submit(stored_pdf, stored, ref)
        except BrokenProcessPool:  # broke since the last take: render in the sender
            self._restart()
            return False
        return True

    def prepare(
        self,
        announced: Iterable[InvoiceIssued | CreditNoteIssued],
        *,
        deliveries: Deliveries,
        documents: DocumentSource,
        domain: str,
    ) -> int:
        """Start rendering the PDFs of the ``announced`` documents (the events of the
        records the sender polled, in order) that it will email: a total that is not zero
        and a delivery row not final yet (a redelivered record renders nothing); each read
        from ``documents``. One read of the delivery row and one of the document each, no
        retries: a document that cannot be looked at ahead (the database failing, an
        unknown currency) is left to the sender, which meets it again with its own
        retries and outcomes. Returns how many were started.
        """
        started = 0
        for data in announced:
            try:
                if is_zero_total(data):
                    continue
                ref = document_ref(data, domain=domain)
                row = deliveries.get(document_key=ref.document_key)
                if row is not None and row.final:
                    continue
                stored = stored_document(documents, ref)
            except _AHEAD_FAILURES as exc:
                logger.debug("a PDF not rendered ahead: %s", exc)
                continue
            if stored is not None and self.submit(stored, ref):
                started += 1
        return started

    def take(self, ref: DocumentRef) -> DocumentFiles | None:
        """The files of ``ref``'s document rendered ahead (waiting up to :attr:`timeout_s`
        seconds for them), or None when they were not submitted, the pool broke, or they
        were not ready in time (the caller renders them itself). Not ready in time: the
        render processes are taken as hung, logged (ERROR) and counted, killed (every
        pending render is dropped) and started again.

        Raises:
            RenderError: the document's PDF or CSV cannot be rendered (as in the sender).
        """
        future = self._pending.pop(ref.document_key, None)
        if future is None:
            return None
        if not wait([future], timeout=self.timeout_s).done:
            logger.error(
                "PDF of %s not rendered ahead within %.1f s (email_render_timeout_s): its "
                "render processes are killed and started again, the sender renders the "
                "pending PDFs",
                ref.document_key,
                self.timeout_s,
            )
            RENDER_TIMEOUTS.inc()
            self._kill(self._running())
            self._restart()
            return None
        try:
            return future.result()
        except BrokenProcessPool as exc:
            logger.error("PDF render process died (%s): the sender renders the pending PDFs", exc)
            self._restart()
            return None

    def discard(self) -> None:
        """Forget every pending render (records sought back, or the sender stopping);
        renders already running finish and are dropped."""
        for future in self._pending.values():
            future.cancel()
        self._pending.clear()

    def _running(self) -> list[BaseProcess]:
        """The pool's processes, by the executor's own handles (none once shut down)."""
        return list((self._pool._processes or {}).values())

    @staticmethod
    def _kill(processes: Sequence[BaseProcess]) -> None:
        """``SIGKILL`` ``processes`` (a pool's) and wait (up to ``_KILL_WAIT_S`` in all)
        until they are gone; their executor then fails its pending renders as for a dead
        process (:class:`BrokenProcessPool`)."""
        for process in processes:
            process.kill()
        deadline = time.monotonic() + _KILL_WAIT_S
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                logger.error("PDF render process %s still alive after SIGKILL", process.pid)

    def _restart(self) -> None:
        self.discard()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = self._start()

    def close(self) -> None:
        """Stop the processes: a render in progress gets up to :attr:`timeout_s` seconds
        to finish, then its process is killed (a hung render would hold the sender's stop
        for ever)."""
        self.discard()
        processes = self._running()
        self._pool.shutdown(wait=False, cancel_futures=True)
        deadline = time.monotonic() + self.timeout_s
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
        hung = [process for process in processes if process.is_alive()]
        if hung:
            logger.error(
                "%d PDF render process(es) still rendering %.1f s after the stop "
                "(email_render_timeout_s): killed",
                len(hung),
                self.timeout_s,
            )
            self._kill(hung)
