"""`envace export RUN --format hf-datasets|parquet|jsonl DIR`: one run's tables, to load elsewhere.

`hf-datasets` writes a `datasets.DatasetDict` (`datasets.load_from_disk(DIR)`) with one split per table that
has rows: episodes, generations (prompt and completion ids, log-probs, reward, advantage, trained), calls,
pairs, memories, imagined, metrics, judgements. `parquet` and `jsonl` write one file per table.
"""

from __future__ import annotations

from pathlib import Path

from envace.errors import UsageError
from envace.store import SCHEMAS, connect, get_run

FORMATS = ("hf-datasets", "parquet", "jsonl")


def export_run(root: str | Path, run_id: str, fmt: str, out: str | Path) -> dict[str, int]:
    """Write `run_id`'s tables to `out`; returns the rows per table written."""
    if fmt not in FORMATS:
        raise UsageError(f"--format: unknown choice {fmt!r} (choose from {', '.join(FORMATS)})")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"{out} exists and is not empty")
    meta = get_run(root, run_id)
    con = connect(root)
    frames = {t: con.execute(f"SELECT * FROM {t} WHERE run_id = ?", [meta["run_id"]]).df()
              for t in SCHEMAS if t != "sweep"}
    frames = {t: f for t, f in frames.items() if len(f)}
    if not frames:
        raise UsageError(f"run '{run_id}' has no stored rows to export")
    out.mkdir(parents=True, exist_ok=True)
    if fmt == "hf-datasets":
        from datasets import Dataset, DatasetDict

        DatasetDict({t: Dataset.from_pandas(f, preserve_index=False) for t, f in frames.items()}).save_to_disk(out)
    for table, frame in frames.items():
        if fmt == "parquet":
            frame.to_parquet(out / f"{table}.parquet", index=False)
        elif fmt == "jsonl":
            frame.to_json(out / f"{table}.jsonl", orient="records", lines=True)
    return {t: len(f) for t, f in frames.items()}
