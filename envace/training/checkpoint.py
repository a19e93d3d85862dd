"""What a training run saves: `state.pt` to resume from, and the final weights in `<run>/checkpoint`.

    state.pt     the trainable weights, the optimiser, the next GRPO step and the kept policy versions
                 (`grpo.max_staleness`); after SFT and every `grpo.save_every` steps; all a killed run needs,
                 since step k's tasks and seeds derive from (seed, k) alone
    shards-<k>/  under FSDP, the weights and optimiser instead, each process's own shards (state.pt names it)
    checkpoint/  the final weights (LoRA merged), the tokenizer and the task groups SFT saw (`pool.SEEN_FILE`),
                 loadable by `--model`

Both are written beside and renamed, so a kill mid-write leaves the previous one whole. `write_checkpoint` is
the one writer: the single-process loop and Ray's learner rank 0 both call it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from envace.config import TrainConfig
from envace.errors import UsageError
from envace.store import Run
from envace.training.distributed import Processes
from envace.training.pool import write_seen
from envace.training.sft import sft_place


def save_state(learner, procs: Processes, run: Run, next_step: int,
               versions: dict[int, dict[str, torch.Tensor]] | None = None) -> None:
    """Every process calls this (sharded weights or moments are gathered); process 0 writes `state.pt`, with the
    earlier policy versions the next steps are sampled with (`grpo.max_staleness`). A learner whose ranks see the
    run folder writes it there itself (`save_in_place`: Ray's ranks), so the state never passes through here."""
    path = run.path / "state.pt"
    if learner.save_in_place(path, next_step, versions or {}):
        return
    write_learner_state(learner, procs, path, next_step,
                        lambda: {v: learner.held(w) for v, w in (versions or {}).items()})


def write_learner_state(learner, procs: Processes, path: Path, next_step: int, kept: Callable[[], dict],
                        shards: bool | None = None) -> None:
    """`state.pt` at `path` for the learner these processes share (every process calls; `kept()`, on process 0:
    the kept policy versions). Under FSDP (`shards`, unless False) each process writes its own shards of the
    weights and optimiser state into `shards-<next_step>/` beside it (`Learner.save_shards`) and `state.pt` names
    that folder, so no process gathers a whole copy; otherwise the state is gathered on process 0 (FSDP's shards,
    ZeRO-1's moments), which writes it whole.
    The folder is written under another name and renamed before `state.pt` names it, and the folders of earlier
    saves go only after: a kill at any point leaves the last `state.pt` and what it names whole."""
    if not (procs.fsdp if shards is None else shards):
        state = learner.state()
        if procs.main:
            write_state(path, next_step, state, kept())
        return
    folder = path.with_name(f"shards-{next_step}")
    partial = path.with_name(f".{folder.name}.partial")
    if procs.main:
        shutil.rmtree(partial, ignore_errors=True)  # what a save killed midway left
    procs.wait()
    learner.save_shards(partial)
    if procs.main:
        shutil.rmtree(folder, ignore_errors=True)  # one a save killed before `state.pt` named it left
        os.replace(partial, folder)
        write_state(path, next_step, {"fsdp": True, "shards": folder.name}, kept())
        for earlier in path.parent.glob("shards-*"):
            if earlier != folder:
                shutil.rmtree(earlier)
    procs.wait()


def write_state(path: Path, next_step: int, state: dict, versions: dict) -> None:
    """`state.pt`: the next GRPO step, the learner's `state()` (weights and optimiser) and the kept policy versions;
    written beside and renamed, so a kill mid-write leaves the previous state loadable."""
    tmp = path.with_name(f".state.{os.getpid()}.partial")
    torch.save({"next_step": next_step, **state, "versions": versions}, tmp)
    os.replace(tmp, path)


def read_state(path: Path, learner, device: Any = "cpu") -> tuple[int, dict]:
    """`write_learner_state`'s file put into `learner` (`load`, or `load_shards` from the folder it names: weights
    and optimiser); (next GRPO step, kept versions)."""
    state = torch.load(path, weights_only=True, map_location=device)
    if "shards" in state:
        if not (shards := path.with_name(state["shards"])).is_dir():
            raise UsageError(f"this run's state.pt names FSDP shards in {shards}, which this process does not see: "
                             "resume it where every learner rank sees the run folder (a --root every node mounts)")
        learner.load_shards(shards)
    else:
        learner.load(state)
    return state["next_step"], state.get("versions", {})


def load_state(learner, run: Run, device: Callable[[], Any]) -> tuple[int, dict] | None:
    """(next GRPO step, the kept policy versions) of a saved run, its weights and optimiser put into `learner`
    (which reads the file itself where it can: `load_in_place`); None when no `state.pt` exists."""
    path = run.path / "state.pt"
    if not path.exists():
        return None
    loaded = learner.load_in_place(path)
    return loaded if loaded is not None else read_state(path, learner, device())


def start_or_resume(cfg: TrainConfig, run: Run, procs: Processes, learner, say: Callable[[str], None], resume: bool,
                    device: Callable[[], Any], warm: Callable[[], dict]) -> tuple[int, dict, dict]:
    """(next GRPO step, the kept policy versions, the run's summary so far), the learner holding its starting
    weights: a resumed run's `state.pt`, else the base after SFT (`warm()` returns SFT's summary), saved as
    `state.pt` before the first step. Whether `state.pt` exists is read once: saving is a collective."""
    summary: dict[str, Any] = dict(run.meta().get("summary") or {}) if resume else {}
    saved = (run.path / "state.pt").exists()
    loaded = load_state(learner, run, device) if resume and saved else None
    start, versions = loaded or (0, {})
    if loaded:
        say(f"resuming at GRPO step {start + 1} (SFT already done)")
    elif cfg.sft.tasks and cfg.sft.epochs:
        summary.update(warm())
        if procs.main:
            run.update(summary=summary)
    if not saved:
        save_state(learner, procs, run, 0)
    if procs.main:
        sft_place(cfg, run.path, procs).clear()  # SFT's result is in state.pt now
    return start, versions, summary


def final_checkpoint(run: Run, procs: Processes, model, tokenizer, seen: set[str], lora: bool) -> Path:
    """`<run>/checkpoint`, written by process 0 while the others wait (every process calls)."""
    out = run.path / "checkpoint"
    if procs.main:
        write_checkpoint(out, model, tokenizer, seen, lora)
    procs.wait()
    return out


def write_checkpoint(out: Path, model, tokenizer, seen: set[str], lora: bool) -> Path:
    """`model` (LoRA merged into plain weights) and `tokenizer` saved as `out`, which a resumed run replaces."""
    partial = out.with_name(f".{out.name}.{os.getpid()}.partial")
    (model.merge_and_unload() if lora else model).save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    write_seen(partial, seen)
    return replace_folder(partial, out)


PIECE = 64 * 2**20  # bytes a piece of a file sent between processes (`pieces`): what the receiver holds at once


def pieces(folder: Path) -> Iterator[tuple[str, bytes]]:
    """Every file under `folder` as (path relative to it, bytes), each file in order in pieces of at most `PIECE`
    bytes (an empty file as one empty piece); `folder` removed once all are sent."""
    try:
        for file in sorted(p for p in folder.rglob("*") if p.is_file()):
            name = str(file.relative_to(folder))
            yield from ((name, piece) for piece in file_pieces(file))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def file_pieces(file: Path) -> Iterator[bytes]:
    """`file` in pieces of at most `PIECE` bytes (an empty file as one empty piece)."""
    with file.open("rb") as f:
        piece = f.read(PIECE)
        yield piece
        while piece := f.read(PIECE):
            yield piece


def receive(sent: Iterable[tuple[str, bytes]], folder: Path) -> Path:
    """What `pieces` sent, written under `folder` as it comes: one piece in memory at a time."""
    folder.mkdir(parents=True, exist_ok=True)
    name, out = None, None
    try:
        for piece_of, piece in sent:
            if piece_of != name:
                if out is not None:
                    out.close()
                (folder / piece_of).parent.mkdir(parents=True, exist_ok=True)
                name, out = piece_of, (folder / piece_of).open("wb")
            out.write(piece)
    finally:
        if out is not None:
            out.close()
    return folder


def replace_folder(partial: Path, out: Path) -> Path:
    """`partial`, written in full, as `out`."""
    if out.exists():  # a resumed run replaces its earlier checkpoint
        shutil.rmtree(out)
    os.replace(partial, out)  # a kill mid-save leaves no half-written checkpoint behind
    return out
