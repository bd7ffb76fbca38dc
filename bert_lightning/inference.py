"""Using a model: every command, the server, the zero-shot baseline and the brackets suite load
it here, from a `.ckpt` of ours or a Hugging Face BERT folder, as what they need (an MLM model,
a bare encoder, a bi-encoder) with its tokenizer; and run it here, in one batched loop per use
(score, embed, fill-mask, the zero-shot cosine), apart from loading, so a server that loads once
and a command that loads per call compute the same numbers. A fine-tuned model is loaded here
too (`load_finetuned`), from its task's own `build_model`: using a model needs no Lightning."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch
from tokenizers import Encoding, Tokenizer
from tqdm import tqdm

from bert_lightning.checkpoint import (
    FINETUNING,
    HUGGING_FACE,
    Checkpoint,
    check_origin,
    read_checkpoint,
)
from bert_lightning.choices import (
    EMBED_BATCH,
    EMBED_LENGTH,
    EMBED_POOLING,
    FINETUNE,
    SCORE_BATCH,
)
from bert_lightning.data.tables import collate, eval_loader
from bert_lightning.errors import UserError
from bert_lightning.interop import ST_POOLINGS, declared_by
from bert_lightning.model import BertForPreTraining, BertModel
from bert_lightning.model.heads import ZERO_SHOT_POOLING, BertBiEncoder, pool
from bert_lightning.ort import OrtModel, is_exported, load_exported
from bert_lightning.tasks.base import Task, encode_rows, inputs, truncating
from bert_lightning.tasks.kinds import make_task, stored_task
from bert_lightning.weights import ENCODER, POOLER, WHOLE, load_weights

# what a fine-tuned checkpoint that stores no max_seq_length is truncated to: the shipped one
DEFAULT_MAX_SEQ_LENGTH = FINETUNE.data.max_seq_length


# --- loading ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finetuned:
    """A fine-tuned model in eval mode, its task (labels, target scale, columns, how it scores)
    and what its tokenizer truncates to: the length it was fine-tuned on."""

    model: torch.nn.Module
    task: Task
    tokenizer_json: str
    max_seq_length: int

    def tokenizer(self, max_seq_length: int | None = None) -> Tokenizer:
        """Truncating to `max_seq_length` (None: as fine-tuned). Build it once per model, not
        per batch: copying a 30k-token vocabulary takes tens of ms."""
        bert = getattr(self.model, "bert", None)  # an ONNX export's graph has its own check
        positions = bert.config.max_position_embeddings if bert is not None else None
        if max_seq_length is not None and positions is not None and max_seq_length > positions:
            raise UserError(
                f"--max-seq-length {max_seq_length}: more than the model's {positions} positions"
            )
        return truncating(
            Tokenizer.from_str(self.tokenizer_json), max_seq_length or self.max_seq_length
        )

    def with_table_options(self, options: dict) -> Finetuned:
        """The same model reading tables with `options` (format, encoding, header, names) over
        its task's own, checked as the task config was."""
        if not options:
            return self
        task = make_task(asdict(self.task.cfg) | options)
        return Finetuned(self.model, task, self.tokenizer_json, self.max_seq_length)


def load_finetuned(path, use: str = "score", pre: Checkpoint | None = None) -> Finetuned:
    """The model of a `.ckpt` written by finetune.py (`pre`: it, read already), built by its
    task as fine-tuning built it, or of a folder `export-onnx` wrote from one (run by ONNX
    Runtime). `use`: what needs a fine-tuned checkpoint, for the message of another kind."""
    if pre is None and is_exported(path):
        model, spec, tokenizer_json = load_exported(path)
        if spec["use"] != "finetuned":
            raise UserError(f"{path}: an exported embedding model; {use} needs a fine-tuned one")
        task = stored_task(spec["task"], str(path))
        return Finetuned(model, task, tokenizer_json, spec["max_seq_length"])
    pre = pre or read_checkpoint(path)
    if pre.origin == HUGGING_FACE and (start := zero_shot_bi_encoder(path, pre)) is not None:
        return start
    check_origin(path, pre, FINETUNING, use)
    task = stored_task(pre.hparams["task"], str(path))
    model = task.build_model(pre.config)
    load_weights(model, pre, WHOLE)
    return Finetuned(model.eval(), task, pre.tokenizer.to_str(), fine_tuned_length(pre))


def zero_shot_bi_encoder(path, pre: Checkpoint) -> Finetuned | None:
    """A sentence-transformers folder without a score head (a model of the hub's, pooled by
    mean or max) as the bi-encoder a fine-tuning run starts from it
    (`task.architecture=bi_encoder`): the folder's pooling and length, the head untrained (20
    cos - 10), so its scores rank as the zero-shot cosine does; None for any other folder."""
    try:
        declared = declared_by(Path(path))
    except UserError:  # modules that compute no vector per text (no Pooling module)
        return None
    if declared is None or declared.pooling not in ST_POOLINGS:
        return None
    task = stored_task({"kind": "ad_relevance", "architecture": "bi_encoder", "mode": "max",
                        "pooling": declared.pooling}, str(path))  # fmt: skip
    model = task.build_model(pre.config)
    load_weights(model, pre, ENCODER)
    length = declared.max_seq_length or pre.config.max_position_embeddings
    return Finetuned(model.eval(), task, pre.tokenizer.to_str(), length)


def fine_tuned_length(pre: Checkpoint) -> int:
    """The length a fine-tuned checkpoint's texts are truncated to: what it was fine-tuned on."""
    return pre.hparams.get("max_seq_length") or DEFAULT_MAX_SEQ_LENGTH


def check_mlm_head(path, pre: Checkpoint, use: str = "fill-mask") -> None:
    """`use`: what needs the head, for the message."""
    if pre.rtd:
        raise UserError(
            f"{path}: an RTD (objective=rtd) checkpoint; its generator is a small helper of "
            f"pretraining, not a masked language model, so {use} does not serve it (fine-tune, "
            "embed or export-hf its encoder)"
        )
    if not pre.has_mlm_head:
        raise UserError(
            f"{path}: no MLM head (cls.predictions.*) in these weights; {use} needs one"
        )


def load_mlm(path, pre: Checkpoint | None = None) -> tuple[BertForPreTraining, Tokenizer]:
    """(BertForPreTraining in eval mode, tokenizer) of a checkpoint with an MLM head (`pre`: it,
    read already). A fine-tuned checkpoint's task head (`classifier.*`) has no place there."""
    pre = pre or read_checkpoint(path)
    check_mlm_head(path, pre)
    model = BertForPreTraining(pre.config)
    load_weights(model, pre)
    return model.eval(), pre.tokenizer


def encoder_from(ckpt: Checkpoint) -> BertModel:
    """A bare `BertModel` (for embeddings) with whatever encoder weights `ckpt` holds."""
    holder = torch.nn.Module()
    pooler = any(k.startswith(POOLER) for k in ckpt.state_dict)
    holder.bert = BertModel(ckpt.config, add_pooling_layer=pooler)
    load_weights(holder, ckpt, ENCODER)
    return holder.bert.eval()


def load_embedder(
    path, max_seq_length: int | None = None, pre: Checkpoint | None = None
) -> tuple[BertModel, Tokenizer]:
    """(bare encoder in eval mode, its tokenizer truncating to `max_seq_length` (None:
    `EMBED_LENGTH`, or a sentence-transformers folder's own, `Declared`), or to the positions
    the model has if fewer) of any checkpoint, or the embedding model of a folder `export-onnx`
    wrote, truncating to its length (None) or a shorter one: what `embed_texts` runs. A longer
    one than the export's is refused, not cut."""
    if pre is None and is_exported(path):
        model, spec, tokenizer_json = load_exported(path)
        if spec["use"] != "embed":
            raise UserError(
                f"{path}: an exported fine-tuned model; embedding needs an exported embedding "
                "model (export-onnx of a pretrained checkpoint or Hugging Face folder)"
            )
        n = spec["max_seq_length"]
        if (max_seq_length or n) > n:
            raise UserError(
                f"{path}: exported to truncate at {n}; --max-seq-length {max_seq_length} needs "
                f"an export with --max-seq-length {max_seq_length}"
            )
        return model, truncating(Tokenizer.from_str(tokenizer_json), max_seq_length or n)
    pre = pre or read_checkpoint(path)
    model, positions = encoder_from(pre), pre.config.max_position_embeddings
    model.declared = declared_by(Path(path))  # what `pooling_of` and `embed_texts` follow
    default = EMBED_LENGTH if model.declared is None else model.declared.max_seq_length
    return model, truncating(pre.tokenizer, min(max_seq_length or default or positions, positions))


def load_bi_encoder(path, max_seq_length: int, pooling: str) -> tuple[BertBiEncoder, Tokenizer]:
    """An untrained bi-encoder head on the encoder of `path` (what `task.architecture=bi_encoder`
    starts from), in eval mode, with its tokenizer truncating a pair to `max_seq_length`."""
    pre = read_checkpoint(path)
    model = BertBiEncoder(pre.config, pooling)
    load_weights(model, pre, ENCODER)
    return model.eval(), truncating(pre.tokenizer, max_seq_length)


# --- running: one batched loop per use --------------------------------------------------------


def device_of(model: torch.nn.Module) -> torch.device:
    """Where a model's inputs go: its weights' device (the CPU for an exported graph)."""
    return next(model.parameters(), torch.empty(0)).device


def per_row(
    fn: Callable[[dict[str, torch.Tensor]], Iterable],
    model: torch.nn.Module,
    tok: Tokenizer,
    encodings: list[Encoding],
    batch_size: int,
    desc: str | None = None,
) -> list:
    """`fn`'s one result per row of each batch, for `encodings` in their order. A batch holds
    `batch_size` rows of similar length, padded into input_ids, token_type_ids and
    attention_mask, each (B, T), on the model's device: it pads to its longest row, and an
    exported graph computes on every pad. `desc`: a progress bar's name."""
    device, pad_id = device_of(model), tok.token_to_id("[PAD]")
    order = sorted(range(len(encodings)), key=lambda i: len(encodings[i].ids))
    out: list = [None] * len(encodings)
    for start in tqdm(range(0, len(order), batch_size), disable=desc is None, desc=desc):
        rows = order[start : start + batch_size]
        feats = [
            {"input_ids": e.ids, "token_type_ids": e.type_ids} for e in (encodings[i] for i in rows)
        ]
        batch = {k: v.to(device) for k, v in collate(feats, pad_id).items()}
        for i, result in zip(rows, fn(batch), strict=True):
            out[i] = result
    return out


@torch.inference_mode()
def score_rows(
    model: torch.nn.Module,
    task: Task,
    tok: Tokenizer,
    rows: list,
    batch_size=SCORE_BATCH,
    progress=False,
) -> list[float]:
    """One score per row (a text, or a (query, ad) pair) of a fine-tuned `model` and its
    `task`: the relevance probability (ad_relevance), the predicted value (regression) or the
    second label's probability (two-class classification). `tok`: `Finetuned.tokenizer`."""

    def score(b: dict) -> list[float]:
        logits = model(b["input_ids"], b["token_type_ids"], b["attention_mask"])  # (B, L)
        return task.scores(logits).tolist()

    desc = "score" if progress else None
    return per_row(score, model, tok, encode_rows(tok, rows), batch_size, desc)


def table_scores(
    model: torch.nn.Module, task: Task, tok: Tokenizer, table: dict, max_seq_length: int,
    batch_size=SCORE_BATCH,
) -> torch.Tensor:  # fmt: skip
    """(N,) `score_rows` of a task table's rows, read as the task encodes them."""
    rows = inputs(table)
    return torch.tensor(score_rows(model, task, truncating(tok, max_seq_length), rows, batch_size))


@torch.inference_mode()
def task_metrics(
    ft: Finetuned,
    path,
    batch_size: int = SCORE_BATCH,
    max_seq_length: int | None = None,
    progress=False,
    zero_shot=None,
) -> dict:
    """The task's loss and metrics of a fine-tuned model on a file in its task's format, as a
    run's test computes them (`table_metrics`), and its `test_report` (`zero_shot`: a baseline
    encoder's, `Task.test_report`): `results.json`'s numbers for a test file."""
    table = ft.task.with_labels(ft.task.read(path))
    out = table_metrics(ft, table, batch_size, max_seq_length, progress)
    tok, length = Tokenizer.from_str(ft.tokenizer_json), max_seq_length or ft.max_seq_length
    score = partial(table_scores, ft.model, ft.task, tok, table, length, batch_size)
    return out | ft.task.test_report(table, score, zero_shot)


@torch.inference_mode()
def table_metrics(
    ft: Finetuned,
    table: dict,
    batch_size: int = SCORE_BATCH,
    max_seq_length: int | None = None,
    progress=False,
) -> dict:
    """The task's loss and metrics of a fine-tuned model on a task table, as a run's
    validation and test compute them (the task's encoding, loss and metrics over
    `data.tables.eval_loader`): the loss of all its rows, whatever `batch_size`."""
    task, device = ft.task, device_of(ft.model)
    tok, length = Tokenizer.from_str(ft.tokenizer_json), max_seq_length or ft.max_seq_length
    rows = task.encode(table, tok, length)
    metrics, loss = task.metrics().to(device), task.loss_metric().to(device)
    loader = eval_loader(rows, batch_size, tok.token_to_id("[PAD]"))
    for batch in tqdm(loader, disable=not progress, desc="evaluate"):
        batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
        logits, items = task.logits_and_rows(ft.model, batch)
        loss.update(items)
        task.update(metrics, logits, batch)
    out = {"rows": len(rows), "loss": float(loss.compute())}
    return out | {k: float(v) for k, v in task.compute(metrics).items()}


def pooling_of(model: torch.nn.Module, pooling: str | None) -> str:
    """The pooling `embed_texts` applies: an export's own (its `onnx.json` says it) or a
    sentence-transformers folder's (`Declared`), another one asked refused; else the one
    asked, else `EMBED_POOLING`."""
    declared = getattr(model, "declared", None)  # set by `load_embedder`
    if declared is not None:
        if pooling not in (None, declared.pooling):
            raise UserError(
                f"{declared.source}: the model pools by {declared.pooling}; --pooling {pooling} "
                "would give other vectors than its own (leave --pooling out)"
            )
        return declared.pooling
    if not isinstance(model, OrtModel):
        return pooling or EMBED_POOLING
    exported = model.spec["pooling"]
    if pooling not in (None, exported):
        raise UserError(
            f"{model.folder}: exported with pooling {exported}; "
            f"pooling {pooling} needs an export with --pooling {pooling}"
        )
    return exported


@torch.inference_mode()
def embed_texts(
    model: BertModel,
    tok: Tokenizer,
    texts: list[str],
    pooling: str | None = None,
    batch_size=EMBED_BATCH,
    progress=False,
) -> torch.Tensor:
    """(N, H) one vector per text, pooled by `POOLINGS` ((N, 4H) for last4), on the CPU;
    `pooling` None: `pooling_of`'s default; unit length where the model's folder declares it."""
    exported = isinstance(model, OrtModel)
    pooling = pooling_of(model, pooling)
    declared = getattr(model, "declared", None)
    unit = declared is not None and declared.normalize

    def embed(b: dict) -> torch.Tensor:
        mask = b["attention_mask"]  # (B, T)
        if exported:  # pooled in the graph
            return model(b["input_ids"], b["token_type_ids"], mask).float()  # (B, H)
        o = model(b["input_ids"], b["token_type_ids"], mask, output_hidden_states=True)
        v = pool(o.hidden_states, mask, pooling).float()  # (B, H) or (B, 4H)
        return (torch.nn.functional.normalize(v, dim=-1) if unit else v).cpu()  # as v

    desc = "embed" if progress else None
    out = per_row(embed, model, tok, tok.encode_batch(texts), batch_size, desc)
    if not out:  # no texts
        return torch.zeros(0, model.spec["width"] if exported else model.config.hidden_size)
    return torch.stack(out)  # (N, H)


def unmaskable(
    model: BertForPreTraining, tok: Tokenizer, texts: list[str], encodings: list[Encoding]
) -> str | None:
    """Why `fill_masks` cannot read `texts` (`encodings`: theirs): the first one it cannot."""
    mask_id, n = tok.token_to_id("[MASK]"), model.config.max_position_embeddings
    for text, e in zip(texts, encodings, strict=True):
        if mask_id not in e.ids:
            return f"no [MASK] in {text!r}"
        if len(e.ids) > n:
            return f"{len(e.ids)} word pieces; the model reads at most {n}"
    return None


@torch.inference_mode()
def fill_masks(
    model: BertForPreTraining,
    tok: Tokenizer,
    encodings: list[Encoding],
    top_k: int | list[int] = 5,
    batch_size=EMBED_BATCH,
) -> list[list[list[dict]]]:
    """For each text (encoded; texts that `unmaskable` passes), for each `[MASK]` in order,
    the `top_k` {token, prob} best first (`top_k`: one per text, a server's batch of requests,
    so that each text's answers are only as many as it asked). Over the tokenizer's ids only:
    a vocabulary padded to a multiple of 64 (`weights.padded_vocab`) has rows no text has."""
    mask_id, n = tok.token_to_id("[MASK]"), tok.get_vocab_size()
    ks = [min(k, n) for k in (top_k if isinstance(top_k, list) else [top_k] * len(encodings))]

    def fill(b: dict) -> list[tuple[torch.Tensor, torch.Tensor]]:
        ids = b["input_ids"]  # (B, T)
        h = model.bert(ids, b["token_type_ids"], b["attention_mask"]).last_hidden_state  # (B, T, H)
        logits = model.cls.predictions(h[ids == mask_id])[:, :n]  # (M, n), the padding rows cut
        p, idx = logits.float().softmax(-1).topk(max(ks), dim=-1)  # (M, k), rows' masks in order
        counts = (ids == mask_id).sum(1).tolist()
        return list(zip(p.cpu().split(counts), idx.cpu().split(counts), strict=True))

    tops = per_row(fill, model, tok, encodings, batch_size)  # per text: (M_i, k) twice
    return [
        [
            [{"token": tok.id_to_token(t), "prob": q} for t, q in zip(ts, qs, strict=True)]
            for ts, qs in zip(idx[:, :k].tolist(), p[:, :k].tolist(), strict=True)
        ]
        for (p, idx), k in zip(tops, ks, strict=True)
    ]


@torch.inference_mode()
def cosines(
    model: BertBiEncoder, tok: Tokenizer, pairs: list[tuple[str, str]], batch_size=SCORE_BATCH
) -> torch.Tensor:
    """(N,) cosine of the pooled query and ad of each pair, each encoded alone (the pair
    truncated as one row by `tok`)."""

    def cosine(b: dict) -> torch.Tensor:
        return model.cosine(b["input_ids"], b["token_type_ids"], b["attention_mask"]).cpu()  # (B,)

    out = per_row(cosine, model, tok, encode_rows(tok, pairs), batch_size)
    return torch.stack(out) if out else torch.zeros(0)


def zero_shot_cosines(
    path, pairs: list[tuple[str, str]], max_seq_length: int, batch_size=SCORE_BATCH
) -> torch.Tensor:
    """(N,) the cosine of each pair's two texts, mean-pooled and each encoded alone, by the
    encoder of `path` as it is (how sentence-transformers models are meant to be used):
    the untrained bi-encoder head, a baseline of what fine-tuning adds."""
    model, tok = load_bi_encoder(path, max_seq_length, ZERO_SHOT_POOLING)
    return cosines(model, tok, pairs, batch_size)


def split(flat: list, sizes: Iterable[int]) -> list[list]:
    """`flat` cut into consecutive pieces of `sizes` (the rows of each text or request)."""
    out, start = [], 0
    for n in sizes:
        out.append(flat[start : start + n])
        start += n
    return out
