"""Read the Maildir the SMTP sink writes (:mod:`streams.devtools.stack.smtp_sink`), for tests and the demo.

* :func:`list_messages` — every stored message as an :class:`email.message.EmailMessage`
  (modern policy: ``msg.get_body(("html",))``, decoded headers), oldest first.
* :func:`count_by_header` — how many messages carry each value of a header, e.g.
  ``count_by_header(maildir, "X-Invoice-Id")`` to check one email per invoice.

The sink adds the SMTP envelope as headers ``X-MailFrom``, ``X-RcptTo``, ``X-Peer``.
Reading is safe while the sink writes (Maildir delivers by atomic rename).
"""

from __future__ import annotations

import email
import email.policy
import mailbox
import re
from collections import Counter
from email.message import EmailMessage
from pathlib import Path

#: Python's Maildir names: ``<seconds>.M<microseconds>P<pid>Q<counter>.<host>``.
_KEY = re.compile(r"^(\d+)\.M(\d+)P\d+Q(\d+)\.")


def _delivery_order(key: str) -> tuple[int, int, int]:
    match = _KEY.match(key)
    return (int(match[1]), int(match[2]), int(match[3])) if match else (0, 0, 0)


def list_messages(maildir: Path) -> list[EmailMessage]:
    """Every message in ``maildir`` (``new/`` and ``cur/``), ordered by delivery time
    (file modification time, then the time and counter in the Maildir name).

    Raises:
        FileNotFoundError: ``maildir`` is not a Maildir (the sink creates it at start,
            so this means a wrong path).
    """
    if not (maildir / "new").is_dir() or not (maildir / "cur").is_dir():
        raise FileNotFoundError(f"{maildir} is not a Maildir (no new/ and cur/)")
    box = mailbox.Maildir(maildir, factory=None, create=False)
    found: list[tuple[float, tuple[int, int, int], str, EmailMessage]] = []
    for key in box.iterkeys():
        try:
            delivered = box.get_message(key).get_date()
            data = box.get_bytes(key)
        except KeyError:  # removed between listing and reading
            continue
        message = email.message_from_bytes(data, policy=email.policy.default)
        if not isinstance(message, EmailMessage):  # pragma: no cover - policy.default makes one
            raise TypeError(f"message {key} did not parse as an EmailMessage")
        found.append((delivered, _delivery_order(key), key, message))
    found.sort(key=lambda item: item[:3])
    return [item[3] for item in found]


def count_by_header(maildir: Path, header: str) -> dict[str, int]:
    """Number of messages per value of ``header`` (first occurrence, surrounding
    whitespace stripped); messages without the header are not counted.

    Raises:
        FileNotFoundError: see :func:`list_messages`.
    """
    counts: Counter[str] = Counter()
    for message in list_messages(maildir):
        value = message.get(header)
        if value is not None:
            counts[str(value).strip()] += 1
    return dict(counts)
