"""`bert-lightning interpolate CKPT OUT`: WiSE-FT (Wortsman et al. 2022), a fine-tuned model's
encoder moved back towards the weights it started from, `(1 - a) * start + a * fine-tuned`
(the task head stays the fine-tuned one): it keeps more of what the start knew beyond the
fine-tuning data, at no cost at inference. `--alpha A` writes one; without it, a = 0, 0.1,
..., 1 are scored on the run's own validation split (or `--validation FILE`) and the best by
the task's main metric (`task.monitor`) is written, but a = 1, the fine-tuned model as it is,
only with `--write-anyway` (a line says so). The start is the one the checkpoint records (its
run's `init_from=`, kept through resumes and moves), or `--start`: with the tokenizer and, by
content, the weights the checkpoint records it started from (a start that went on training
since is refused)."""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from bert_lightning.errors import MissingFileError, UserError
from bert_lightning.fields import check_values
from bert_lightning.fingerprints import file_digest

if TYPE_CHECKING:  # torch and the model are imported when the command runs
    from bert_lightning.checkpoint import Checkpoint

ALPHAS = [i / 10 for i in range(11)]

log = logging.getLogger(__name__)


def table_metrics(model, table) -> dict:
    """`inference.table_metrics`, imported when the sweep scores an alpha; the sweep calls it
    by this module's name, which a test replaces."""
    from bert_lightning.inference import table_metrics

    return table_metrics(model, table)


def run_config(ckpt_path: str | Path) -> dict | None:
    """The config of the fine-tuning run that wrote `ckpt_path` (<run>/checkpoints/*.ckpt),
    None if its folder has none: plain YAML data (every interpolation was filled when it was
    written), read without OmegaConf's resolvers, typed where it is used."""
    from bert_lightning.run_folder import RESOLVED

    path = Path(ckpt_path).resolve().parent.parent / RESOLVED
    if not path.is_file():
        return None
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as e:
        raise UserError(f"{path}: not a YAML file ({str(e).splitlines()[0]})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("task"), dict):
        raise UserError(f"{path}: no task section; not the record of a fine-tuning run")
    check_values(raw, {"seed": int}, str(path))
    return raw


def validation_table(ckpt_path, task, cfg, validation: str | None) -> dict:
    """`--validation FILE` in the task's format, else the validation split the run drew."""
    from bert_lightning.tasks.base import load_splits
    from bert_lightning.tasks.kinds import stored_task

    if validation:
        from bert_lightning.data.tables import MissingColumn

        try:
            return task.with_labels(task.read(validation))
        except MissingColumn as e:  # no option maps a column here
            raise e.fixed_by(f"rename its column to {e.name!r}, as the run read it") from None
    if cfg is None:
        raise MissingFileError(
            f"{ckpt_path}: no config_resolved.yaml in its run folder to draw the run's "
            "validation split from; give --validation FILE or --alpha"
        )
    run_task = stored_task(cfg["task"], str(ckpt_path))
    check_split_files(ckpt_path)
    _, tables = load_splits(run_task, cfg["seed"])
    return tables["validation"]


def check_split_files(ckpt_path) -> None:
    """The files the run's validation split is drawn from again hold what it drew from (their
    contents, as the checkpoint's data record has them): an edited or reordered train file
    would give another split, with rows the model was trained on."""
    from bert_lightning.checkpoint import DATA_RECORD, torch_load

    record = torch_load(ckpt_path).get(DATA_RECORD)
    if record is None:
        log.warning("%s records no data: its files cannot be checked against the run's", ckpt_path)
        return
    for key in ("task.train_file", "task.validation_file"):
        for path, *_, digest in record.get(key) or []:
            if not Path(path).is_file() or file_digest(path) != digest:
                raise UserError(
                    f"{path}: not the {key} {ckpt_path} was fine-tuned with (its contents "
                    "changed or it is gone), so the run's validation split cannot be drawn "
                    "again; give --validation FILE"
                )


def check_start(ckpt_path, ft: Checkpoint, start, begin: Checkpoint) -> None:
    """`begin` (read from `start`) is where `ft` was fine-tuned from: the same tokenizer (same
    shapes are not the same ids), and the weights `ft` records it started from (`finetune`
    writes `start`: path, digest, step; a checkpoint without one is warned about)."""
    ids, other = ft.tokenizer.get_vocab(), begin.tokenizer.get_vocab()
    if ids != other:
        tokens, others = ({i: t for t, i in v.items()} for v in (ids, other))
        moved = sum(tokens.get(i) != others.get(i) for i in tokens.keys() | others.keys())
        raise UserError(
            f"{begin.source} is not where {ft.source} started: {moved} of {len(tokens)} token ids "
            "name other tokens in its tokenizer (interpolating would average their embeddings)"
        )
    record = ft.hparams.get("start")
    if record is None:
        log.warning(
            "%s records no start (fine-tuned before checkpoints did): that %s is where it "
            "started cannot be checked",
            ckpt_path,
            start,
        )
        return
    if file_digest(start) == record["digest"]:
        return
    then, now = record["step"], begin.step
    if os.path.abspath(start) == record["path"]:
        raise UserError(
            f"{start}: changed since {ckpt_path} was fine-tuned from it (step {then} then, step "
            f"{now} now: other weights); give --start with the weights it started from"
        )
    raise UserError(
        f"{start} is not where {ckpt_path} started ({record['path']} at step {then}): "
        f"step {now}, other weights"
    )


def interpolate(
    ckpt_path: str,
    out: str,
    alpha: float | None = None,
    start: str | None = None,
    validation: str | None = None,
    write_anyway: bool = False,
) -> dict:
    """Writes `out`, unless the sweep finds the fine-tuned model best as it is (a = 1: its
    copy is written only with `write_anyway`); returns the alpha picked, whether it was
    written and, for a sweep, on what rows and metric, each alpha's score."""
    from bert_lightning.checkpoint import FINETUNING, read_checkpoint, write_finetuned
    from bert_lightning.inference import load_finetuned
    from bert_lightning.progress import Waiting
    from bert_lightning.tasks.base import monitor_mode
    from bert_lightning.tasks.kinds import stored_task
    from bert_lightning.weights import interpolated

    ft = read_checkpoint(ckpt_path, FINETUNING, "interpolate")
    record = ft.hparams.get("start")
    start = start or (record and record["path"])
    if not start:
        raise UserError(
            f"{ckpt_path}: where its weights started is not known (it records no start: random "
            "weights, or fine-tuned before checkpoints kept one); give --start"
        )
    if start == (record and record["path"]) and not os.path.exists(start):
        raise UserError(
            f"{ckpt_path}: started from {start} (its record), which is not there now; give "
            "--start with where it is"
        )
    begin = read_checkpoint(start)
    check_start(ckpt_path, ft, start, begin)
    report: dict = {"start": str(start)}
    swept = alpha is None
    if swept:
        task = stored_task(ft.hparams["task"], str(ckpt_path))
        table = validation_table(ckpt_path, task, run_config(ckpt_path), validation)
        metric = task.cfg.monitor  # its direction by the metric, whatever an older record says
        sign = 1 if monitor_mode(metric) == "max" else -1
        data = f"{len(table['text']):,} rows of " + (validation or "the run's validation split")
        scores = {}
        for a in ALPHAS:
            with Waiting(f"alpha {a:.1f}: validation {metric} on {data}"):
                model = load_finetuned(ckpt_path, pre=interpolated(ft, begin, a))
                scores[a] = table_metrics(model, table)[metric]
            print(f"alpha {a:.1f}: validation {metric} {scores[a]:.4f}", flush=True)
        scored = [a for a in ALPHAS if not math.isnan(scores[a])]  # NaN: never the best
        if not scored:
            raise UserError(f"validation {metric} is NaN at every alpha ({data}): none to pick")
        alpha = max(scored, key=lambda a: (sign * scores[a], a))  # a tie: nearer fine-tuned
        report |= {"metric": metric, "data": data, "validation": scores}
    report |= {"alpha": alpha, "written": not swept or alpha != 1.0 or write_anyway}
    if report["written"]:
        write_finetuned(out, ckpt_path, interpolated(ft, begin, alpha), {"interpolation": report})
    return report


def picked(r: dict, out: str) -> str:
    """What `interpolate` did, in one line: the alpha, on what rows and metric, and where."""
    how = f"alpha {r['alpha']:.2f} from {r['start']}"
    if "metric" in r:
        how += f" (best validation {r['metric']} {r['validation'][r['alpha']]:.4f}, {r['data']})"
    if r["written"]:
        return f"{how} -> {out}"
    return (
        f"{how}: the fine-tuned model is best as it is; nothing written (--write-anyway: its copy)"
    )


def register(sub) -> None:
    p = sub.add_parser(
        "interpolate",
        help="a fine-tuned model's encoder moved back towards its start (WiSE-FT), one alpha "
        "or the best of 0, 0.1, ..., 1 on the run's validation split",
    )
    p.add_argument("ckpt", help="a .ckpt written by finetune.py")
    p.add_argument("out", help="the .ckpt to write")
    p.add_argument(
        "--alpha", type=float, help="0: the start's encoder, 1: the fine-tuned one (default: "
        "the best of 0, 0.1, ..., 1 on the validation split)"
    )  # fmt: skip
    p.add_argument("--start", help="the weights it started from (default: what it records)")
    p.add_argument("--validation", help="a file in the task's format (default: the run's split)")
    p.add_argument(
        "--write-anyway",
        action="store_true",
        help="write OUT also when the best alpha is 1 (a copy of the fine-tuned model)",
    )

    def run(a) -> None:
        print(
            picked(
                interpolate(a.ckpt, a.out, a.alpha, a.start, a.validation, a.write_anyway), a.out
            )
        )

    p.set_defaults(func=run)
