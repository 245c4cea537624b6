"""Files written under a temporary name and renamed into place: a crash never leaves a half-written file under the
name the user asked for, nor destroys the previous one."""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def written_atomically(path) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` (hidden, same suffix, so writers that pick the format by it still
    do); on leaving the block it is renamed onto ``path``, or removed if the block raised. Parent folders are made.

        with written_atomically(out / "video.mp4") as temporary:
            write_video(temporary)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.stem}.partial{path.suffix}")
    try:
        yield temporary
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    os.replace(temporary, path)
