"""A directory built once into a cache: built in a temporary directory beside it, its summary
written to a marker file last, then renamed into place, so that a directory with its marker is
complete and two processes building the same one at once both end with it."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class CachedBuild:
    """One kind of cached directory (a warm start, a reward model)."""

    marker: str
    """The file, holding the build's summary, whose presence makes a directory complete."""
    what: str
    """Its name in the line saying a directory is reused."""
    temp_prefix: str
    """The prefix of the temporary directory a build fills."""

    def ensure(self, target: Path, build: Callable[[Path], dict[str, Any]], verbose: bool) -> Path:
        """``target``, reused when it holds the marker; else ``build(work)`` fills a fresh
        directory beside it, whose returned summary goes to the marker before the directory is
        renamed to ``target``."""
        if (target / self.marker).is_file():
            if verbose:
                print(f"[zbrl] {self.what}: reusing {target}", flush=True)
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():  # an interrupted earlier build: no marker, so rebuild it
            shutil.rmtree(target, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix=self.temp_prefix, dir=target.parent))
        try:
            summary = build(work)
            (work / self.marker).write_text(json.dumps(summary, indent=2) + "\n")
            try:
                os.rename(work, target)
            except OSError:  # another process finished the same build first
                if not (target / self.marker).is_file():
                    raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return target

    def summary(self, directory: str | Path) -> dict[str, Any]:
        """The summary a build of ``directory`` recorded in its marker."""
        return json.loads((Path(directory) / self.marker).read_text())
