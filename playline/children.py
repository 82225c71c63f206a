"""Child processes that do not outlive the process that started them.

``playline dev`` and ``playline demo`` start a Temporal dev server and the local
provider server as child processes. Stopped normally (Ctrl-C, SIGTERM, SIGHUP) they
stop their children themselves; killed outright (SIGKILL, an IDE's hard stop, the OOM
killer) they cannot, and the children would keep their ports. On Linux the kernel
sends a child SIGTERM when its parent dies (``PR_SET_PDEATHSIG``), which closes that
gap; elsewhere it is a no-op and the next ``playline dev`` names what is left.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import signal
import sys

__all__ = ["die_with_parent"]

#: ``prctl(2)``'s option: the signal this process gets when its parent dies.
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """``preexec_fn`` for ``subprocess.Popen``: SIGTERM the child when the parent dies."""
    if not sys.platform.startswith("linux"):
        return
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return
    try:
        libc = ctypes.CDLL(libc_name, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        return
