"""Mailbox-simulator addresses: recipients the SMTP sink (and the mail twin) refuse on purpose.

After Amazon SES's mailbox simulator: a test that needs a refused recipient
sends to one of these instead of scripting the server. They live on the
reserved domain ``simulator.invalid`` (RFC 2606 §2: ``.invalid`` never resolves),
so no real recipient is ever refused. A ``+tag`` after the local part is
ignored (``bounce+inv-42@simulator.invalid`` bounces), so tests can keep their
addresses unique.

=============================  ======================================  ==========
recipient                      refusal at ``RCPT TO``                  meaning
=============================  ======================================  ==========
``bounce@simulator.invalid``   ``550 5.1.1 …``                         permanent
``defer@simulator.invalid``    ``451 4.3.0 …``                         transient
=============================  ======================================  ==========

Used by :mod:`streams.devtools.stack.smtp_sink` and :mod:`streams.adapters.memory.mail`,
so the SMTP transport against the sink and the twin refuse the same recipients
(the mail contract suite checks both). Standard library only.
"""

from __future__ import annotations

__all__ = ["BOUNCE", "DEFER", "SIMULATOR_DOMAIN", "simulated_refusal"]

SIMULATOR_DOMAIN = "simulator.invalid"
BOUNCE = f"bounce@{SIMULATOR_DOMAIN}"
DEFER = f"defer@{SIMULATOR_DOMAIN}"

_REFUSALS: dict[str, tuple[int, str]] = {
    "bounce": (550, "5.1.1 mailbox unavailable (simulated bounce)"),
    "defer": (451, "4.3.0 mailbox busy, try again later (simulated deferral)"),
}


def simulated_refusal(address: str) -> tuple[int, str] | None:
    """``(SMTP code, text)`` the sink answers to ``RCPT TO:<address>``, or ``None`` to
    accept it. Case-insensitive; a ``+tag`` in the local part is ignored."""
    local, at, domain = address.strip().strip("<>").rpartition("@")
    if not at or domain.lower() != SIMULATOR_DOMAIN:
        return None
    return _REFUSALS.get(local.split("+", 1)[0].lower())
