"""SMTP transport of the email sender (stdlib :mod:`smtplib`): the real adapter of the
:class:`~streams.core.billing.ports.MailTransport` port, with the transient / permanent
split of SMTP failures. Its in-memory twin is
:class:`streams.adapters.memory.mail.InMemoryMailTransport`; both pass the mail
contract suite (``tests/contracts/mail.py``).

One connection per message: the sender sends one email per invoice, the relay is
local or near, and a fresh connection has no stale state to recover from (an idle
connection the server closed, a half-finished transaction after a timeout).

Classification (:func:`classify_smtp_error`), source RFC 5321 §4.2.1 (4yz =
transient negative completion, 5yz = permanent):

* **permanent** only when the refusal is about *this message*: a recipient
  refused with 5xx (``SMTPRecipientsRefused``), the data refused with 5xx
  (``SMTPDataError``), or a feature the message needs that the server lacks
  (``SMTPNotSupportedError``, e.g. SMTPUTF8);
* **transient** for everything else: connection refused/reset/timeout, a 4xx
  reply, and refusals that would hit *every* email (5xx at connect or HELO, the
  sender refused, authentication, STARTTLS or AUTH not offered, a TLS handshake or
  certificate failure) — those are configuration faults; stalling
  with an alert is better than marking a month of invoices as not emailed.
"""

from __future__ import annotations

import smtplib
import ssl
from email.message import EmailMessage

from streams.core.billing.mail_errors import EmailError, SmtpPermanentError, SmtpTransientError
from streams.settings import SmtpSettings


class SmtpTransport:
    """:class:`~streams.core.billing.ports.MailTransport` through the SMTP relay of ``smtp``
    (host, port, per-operation ``timeout_s``), with its ``security``: "none" (the local
    sink), "starttls" (STARTTLS after EHLO; a relay that does not offer it is refused,
    never used in clear) or "tls" (implicit TLS, :class:`smtplib.SMTP_SSL`); the relay's
    certificate and host name are checked (``ca_file``, else the system's CAs), then
    ``AUTH`` with ``username``/``password`` when set (docs/production.md "TLS and
    authentication")."""

    def __init__(self, smtp: SmtpSettings) -> None:
        self._smtp = smtp

    def tls_context(self) -> ssl.SSLContext:
        """The client TLS context: certificate and host name required, ``ca_file`` or the
        system's trust store."""
        ca = self._smtp.ca_file
        return ssl.create_default_context(cafile=str(ca) if ca is not None else None)

    def connect(self) -> smtplib.SMTP:
        """An open connection, TLS started and logged in as the settings say.

        Raises:
            smtplib.SMTPException, OSError: as :mod:`smtplib` raises them
                (``SMTPNotSupportedError`` when STARTTLS or AUTH is not offered).
        """
        smtp = self._smtp
        conn: smtplib.SMTP
        if smtp.security == "tls":
            conn = smtplib.SMTP_SSL(
                smtp.host, smtp.port, timeout=smtp.timeout_s, context=self.tls_context()
            )
        else:
            conn = smtplib.SMTP(smtp.host, smtp.port, timeout=smtp.timeout_s)
        try:
            if smtp.security == "starttls":
                conn.starttls(context=self.tls_context())
            if smtp.username is not None:
                password = smtp.password.get_secret_value() if smtp.password else ""
                conn.login(smtp.username, password)
        except BaseException:
            conn.close()
            raise
        return conn

    def send(self, message: EmailMessage, *, from_address: str, to_address: str) -> None:
        """Deliver ``message`` to the relay with the given envelope addresses.

        Raises:
            SmtpTransientError: see the module docstring (retry later).
            SmtpPermanentError: the relay refused this message for good (5xx).
        """
        try:
            conn = self.connect()
        except smtplib.SMTPNotSupportedError as exc:
            # STARTTLS or AUTH missing hits every email: a configuration fault, transient.
            raise SmtpTransientError(f"relay lacks what the settings need: {exc}") from exc
        except (smtplib.SMTPException, OSError) as exc:
            raise classify_smtp_error(exc) from exc
        try:
            conn.send_message(message, from_addr=from_address, to_addrs=[to_address])
        except (smtplib.SMTPException, OSError) as exc:
            raise classify_smtp_error(exc) from exc
        finally:
            # Once DATA was accepted the message is delivered: a failing QUIT must not
            # turn that into a retry (which would send it twice).
            try:
                conn.quit()
            except (smtplib.SMTPException, OSError):
                conn.close()


def _is_permanent(code: int) -> bool:
    return 500 <= code <= 599


def classify_smtp_error(exc: BaseException) -> EmailError:
    """The :class:`SmtpTransientError` or :class:`SmtpPermanentError` for an ``smtplib``
    or socket error (see the module docstring for the rule)."""
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        codes = [code for code, _ in exc.recipients.values()]
        refusals = "; ".join(
            f"{rcpt}: {code} {_text(resp)}" for rcpt, (code, resp) in exc.recipients.items()
        )
        if codes and any(_is_permanent(code) for code in codes):
            return SmtpPermanentError(
                f"smtp_rejected: recipient refused: {refusals}", code=max(codes)
            )
        return SmtpTransientError(f"recipient refused: {refusals}", code=max(codes, default=None))
    if isinstance(exc, smtplib.SMTPDataError) and _is_permanent(exc.smtp_code):
        return SmtpPermanentError(
            f"smtp_rejected: data refused: {exc.smtp_code} {_text(exc.smtp_error)}",
            code=exc.smtp_code,
        )
    if isinstance(exc, smtplib.SMTPNotSupportedError):
        return SmtpPermanentError(f"smtp_rejected: not supported by the relay: {exc}", code=500)
    if isinstance(exc, smtplib.SMTPResponseException):
        return SmtpTransientError(
            f"{type(exc).__name__}: {exc.smtp_code} {_text(exc.smtp_error)}", code=exc.smtp_code
        )
    return SmtpTransientError(f"{type(exc).__name__}: {exc}")


def _text(value: bytes | str) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value
