"""The pretraining step has static shapes and reads nothing back to the host: every objective's
forward and loss compiles to one graph (`fullgraph=True`) that 20 batches of the real loader
reuse, the compiled loss equals the eager one, and a training step that does not log makes no
host-device synchronisation (what a GPU would wait on), checked by intercepting the ops that
make one."""

import traceback

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounterWithBackend
from torch.utils._python_dispatch import TorchDispatchMode

from bert_lightning.checkpoint import Checkpoint
from bert_lightning.config import compose
from bert_lightning.model import BertConfig, BertForPreTraining
from bert_lightning.training.distill_module import DistillModule
from bert_lightning.training.pretrain import train
from bert_lightning.training.pretrain_module import BertPretrainModule
from bert_lightning.training.rtd_module import RTDPretrainModule
from helpers import OPTIM, TINY_MODEL, data_module, tiny_overrides, write_corpus

NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
DISTILL = dict(attention=1.0, value_relation=1.0, hidden=1.0, embedding=1.0, soft_mlm=1.0)
DISTILL_ARGS = dict(temperature=2.0, relation_heads=None, student_layers=None)


def make_module(objective: str, vocab_size: int, **config):
    """The LightningModule of `objective` on the tiny model; the distillation's teacher a tiny
    BertForPreTraining twice as wide."""
    torch.manual_seed(0)
    c = dict(TINY_MODEL, vocab_size=vocab_size, **config)
    if objective in ("mlm", "mlm_nsp"):
        return BertPretrainModule(c, OPTIM, nsp=objective == "mlm_nsp")
    if objective == "rtd":
        return RTDPretrainModule(c, OPTIM, 0.5, 50.0, nsp=False)
    wide = BertConfig(**dict(c, hidden_size=64, intermediate_size=128))
    teacher = Checkpoint(wide, BertForPreTraining(wide).state_dict(), None, source="teacher")
    weights = DISTILL | {"mlm": 1.0}
    return DistillModule(
        c, OPTIM, "teacher", **weights, **DISTILL_ARGS, embeddings_from_teacher=False,
        nsp=False, teacher_ckpt=teacher,
    )  # fmt: skip


def loss_of(module, batch: dict) -> torch.Tensor:
    out = module(batch)
    return out["loss"] if isinstance(out, dict) else out.loss


@pytest.fixture(scope="module")
def loaders(tiny_tokenizer, tmp_path_factory):
    """21 training batches of the packed default data and of NSP pairs (padded rows), on the
    first 120 documents of the sample."""
    corpus = write_corpus(tmp_path_factory.mktemp("static") / "corpus.jsonl", 120)

    def batches(option: str) -> list[dict]:
        sizes = {"max_seq_length": 32, "batch_size": 8, "val_docs": 5}
        dm = data_module(option, given_tokenizer=tiny_tokenizer, train_files=str(corpus), **sizes)
        dm.setup()
        got = [b for _, b in zip(range(21), dm.train_dataloader(), strict=False)]
        assert len(got) == 21, option
        return got

    return {"c4_sample": batches("c4_sample"), "c4_nsp": batches("c4_nsp")}


@pytest.mark.parametrize(
    ("objective", "data"),
    [("mlm", "c4_sample"), ("mlm_nsp", "c4_nsp"), ("rtd", "c4_sample"), ("distill", "c4_sample")],
)
def test_each_objective_compiles_to_one_graph_for_20_real_batches(
    objective, data, loaders, tiny_tokenizer
):
    """`fullgraph=True`: a graph break is an error; one frame compiled for the 21 batches:
    no recompilation after the first (packed blocks have no mask, padded rows run padded in
    a captured graph, the heads gather (B, K))."""
    batches = loaders[data]
    assert ("attention_mask" in batches[0]) == (data == "c4_nsp")  # the data option says
    module = make_module(objective, tiny_tokenizer.get_vocab_size()).train()
    counter = CompileCounterWithBackend("eager")
    torch._dynamo.reset()
    step = torch.compile(lambda b: loss_of(module, b), fullgraph=True, backend=counter)
    for b in batches:
        step(b).backward()
    assert counter.frame_count == 1


@pytest.mark.parametrize("objective", ["mlm", "rtd", "distill"])
def test_the_compiled_loss_equals_the_eager_one_over_3_steps(objective, loaders, tiny_tokenizer):
    """fp32, no dropout: two copies trained 3 steps side by side, one eager and one compiled
    (AOTAutograd, forward and backward graphs), have losses within 1e-4."""
    V, batches = tiny_tokenizer.get_vocab_size(), loaders["c4_sample"][:3]
    eager, compiled = (
        make_module(objective, V, **NO_DROPOUT),
        make_module(objective, V, **NO_DROPOUT),
    )
    torch._dynamo.reset()
    step = torch.compile(lambda b: loss_of(compiled, b), fullgraph=True, backend="aot_eager")
    optims = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (eager, compiled)]
    for i, b in enumerate(batches):
        torch.manual_seed(i)  # RTD's generator samples from the global RNG
        a = loss_of(eager, b)
        torch.manual_seed(i)
        c = step(b)
        assert abs(a.item() - c.item()) < 1e-4, (i, a.item(), c.item())
        for loss, opt in zip((a, c), optims, strict=True):
            loss.backward()
            opt.step()
            opt.zero_grad()


# ops after which the host waits for the device: a scalar read (`.item()`, `int()`, `bool()`,
# `float()`), a size that depends on the data (`nonzero`, boolean selection, `unique`)
SYNCING = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2"}
SYNCING_METHODS = ("tolist", "cpu", "numpy")
# where reading on the host is by design: the data loader's collation runs there (workers on
# a GPU machine), and torch's AdamW keeps its step counts there unless fused
ON_THE_HOST = ("bert_lightning/data/", "torch/utils/data/", "torchdata/", "torch/optim/")


class HostReads(TorchDispatchMode):
    """Records each syncing op with the training step it happened in, and the line of ours (or
    of a library) that made it; reads in the data loader and the optimizer's host state are
    left out."""

    def __init__(self):
        super().__init__()
        self.step, self.seen = None, []

    def record(self, name: str) -> None:
        if self.step is None:
            return
        stack = [f"{f.filename}:{f.lineno}" for f in traceback.extract_stack()[:-3]]
        if any(part in frame for frame in stack for part in ON_THE_HOST):
            return
        ours = [f for f in stack if "bert_lightning" in f or "lightning/" in f]
        self.seen.append((self.step, name, " <- ".join(ours[::-1][:6])))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        is_bool_index = name == "index" and any(
            t is not None and t.dtype == torch.bool for t in args[1]
        )
        if name in SYNCING or is_bool_index:
            self.record(name)
        return func(*args, **(kwargs or {}))


def test_a_training_step_reads_nothing_back_but_to_log(tmp_path, monkeypatch):
    """A tiny pretraining run (packed data, MLM, logging and a progress line every 4 steps,
    validations and a checkpoint between): the ops that would make a GPU's host wait happen
    on logging steps alone, and on the first, which starts the throughput's clock and prints
    the first progress line."""
    import lightning as L

    reads = HostReads()
    for method in SYNCING_METHODS:
        original = getattr(torch.Tensor, method)

        def patched(self, *args, _original=original, _name=method, **kwargs):
            reads.record(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, method, patched)
    logging_steps = set()

    class Watch(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            reads.step = trainer.global_step + 1  # the step being taken
            if reads.step % trainer.log_every_n_steps == 0:
                logging_steps.add(reads.step)

        def on_validation_start(self, trainer, pl_module):
            reads.step = None  # a validation is no training step

        def on_train_end(self, trainer, pl_module):
            reads.step = None

    import bert_lightning.training.pretrain as pretrain

    build = pretrain.build_trainer

    def with_watch(cfg):
        trainer = build(cfg)
        trainer.callbacks.append(Watch())
        return trainer

    monkeypatch.setattr(pretrain, "build_trainer", with_watch)
    write_corpus(tmp_path / "corpus.jsonl")
    overrides = [
        "trainer.max_steps=12",
        "trainer.log_every_n_steps=4",
        "callbacks.progress_bar.every=4",
        "callbacks.progress_bar.seconds=1000",
    ]
    with reads:
        train(compose(overrides=tiny_overrides(tmp_path, *overrides)))
    assert logging_steps == {4, 8, 12}
    off = [r for r in reads.seen if r[0] not in logging_steps | {1}]
    assert not off, "\n".join(map(str, off))
