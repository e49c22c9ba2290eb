"""Files that other processes read while they may be rewritten (results, the sweep's name, paces): written
to a temporary file of this process and renamed, so a reader sees the old or the new content, never a part."""
from __future__ import annotations

import json
import os
from pathlib import Path


def write_json(path: Path, obj, **dumps) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, **dumps))
    os.replace(tmp, path)
