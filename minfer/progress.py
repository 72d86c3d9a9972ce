"""Progress bars, shown only where a person watches: stderr a terminal.

Every bar in minfer comes from `bar()`, so a piped or logged run (`minfer run ... 2> log`, CI, a
server under a supervisor) never gets tqdm's carriage returns in its output; a caller's
`show=False` turns a bar off on a terminal too.
"""

from __future__ import annotations

import sys
from typing import Any


def on_terminal() -> bool:
    """Whether stderr is a terminal (where a progress bar goes)."""
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stream
        return False


def bar(*, show: bool = True, **kw: Any):
    """A tqdm bar on stderr; disabled unless `show` and stderr is a terminal."""
    from tqdm import tqdm

    return tqdm(file=sys.stderr, disable=not (show and on_terminal()), **kw)
