# SPDX-License-Identifier: MIT
"""The exceptions every client call raises."""

from __future__ import annotations

import errno as _errno
import os


class BelayerError(Exception):
    """Any failure of a Belayer call. errno: the errno value (0 when none applies)."""

    def __init__(self, message: str, errno: int = 0) -> None:
        super().__init__(message)
        self.errno = errno
        self.message = message


class SupervisorError(BelayerError):
    """The supervisor refused the request (PROTO_ERROR): errno and its own message.
    in_reply_to: the request's message type."""

    def __init__(self, errno: int, message: str, in_reply_to: int = 0) -> None:
        name = _errno.errorcode.get(errno, str(errno))
        super().__init__(f"{message} ({name}: {os.strerror(errno)})", errno)
        self.supervisor_message = message
        self.in_reply_to = in_reply_to


class ProtocolError(BelayerError):
    """A reply that is not what the protocol allows (bad msgpack, a wrong type or range, an
    oversize packet, the wrong fds). The connection is closed."""

    def __init__(self, message: str, errno: int = _errno.EBADMSG) -> None:
        super().__init__(message, errno)


class ConnectionLost(BelayerError, ConnectionError):
    """The supervisor could not be reached, or went away before the reply was complete."""

    def __init__(self, message: str, errno: int = _errno.ECONNRESET) -> None:
        BelayerError.__init__(self, message, errno)


class Timeout(BelayerError, TimeoutError):
    """The call's explicit timeout passed before the reply was complete."""

    def __init__(self, message: str) -> None:
        BelayerError.__init__(self, message, _errno.ETIMEDOUT)


class PrefixMismatch(BelayerError):
    """A restored checkpoint's token prefix is not the framework's: the context and the
    environment disagree, and continuing would break prefix consistency."""

    def __init__(self, message: str) -> None:
        super().__init__(message, _errno.ESTALE)
