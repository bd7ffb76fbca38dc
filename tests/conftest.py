"""pytest's fixtures and settings of the whole suite; what tests import is in helpers.py."""

import logging
import os

import pytest
import torch

from bert_lightning.data.corpus import iter_documents
from bert_lightning.data.tokenizer import train_wordpiece
from helpers import SAMPLE


@pytest.fixture(scope="session")
def tiny_tokenizer():
    docs = list(iter_documents([SAMPLE]))[:200]
    return train_wordpiece(lambda: iter(docs), vocab_size=800)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _root_log_handlers():
    """A Hydra run in process sets the root logger's handlers, on the streams of that test's
    capture: they go with the test, so that no later test's log line writes to a closed one."""
    before = logging.root.handlers[:]
    yield
    logging.root.handlers[:] = before


# tiny models gain nothing from intra-op threads, and lose a lot on a busy machine
torch.set_num_threads(1)


os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach a hub
os.environ.setdefault("WANDB_SILENT", "true")
