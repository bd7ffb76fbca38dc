"""The vocabularies and defaults the command line shows (`--pooling`, `--packing`,
`--batch-size`, `--max-seq-length`), kept apart from the modules that use them, which import
torch: `bert-lightning --help` builds every command's parser and answers at once. Low in the
layers (the model layer's poolings), so each module that uses one imports it from here."""

from __future__ import annotations

from omegaconf import OmegaConf

from bert_lightning.shipped import CONFIG_DIR

# One vocabulary of poolings for the sequence head (`task.pooling`) and `bert-lightning embed`
# (`--pooling`): what vector of the encoder's output stands for the sequence.
POOLINGS = {
    "cls": "the last layer's [CLS] row (the sequence head passes it through BERT's pooler, "
    "dense + tanh, as HF's classifier does; embed returns the row itself)",
    "mean": "the mean of the last layer over the real tokens",
    "max": "the max of the last layer over the real tokens",
    "last4": "the [CLS] rows of the last four layers, concatenated (embed only)",
}
# packed: documents concatenated and cut into full blocks, attending across their joins;
# packed_isolated: each document framed [CLS] ... [SEP] before the cut, and attention kept
# within it (the collator's position_ids restart at each [CLS]); document: one per example
PACKINGS = ("packed", "packed_isolated", "document")

FINETUNE = OmegaConf.load(CONFIG_DIR / "finetune.yaml")  # what a fine-tuning run evaluates with
EMBED_LENGTH = 128  # what `embed` and /embed truncate a checkpoint's texts to by default
SCORE_BATCH = FINETUNE.data.eval_batch_size  # rows per forward pass of `score`, as a run evaluates
EMBED_BATCH = 32  # rows per forward pass of the other uses
EF_SEARCH = 128  # an HNSW index's breadth of search: recall@10 near exact's on product titles
# what `embed` and /embed pool a checkpoint's texts by default: the pooled [CLS], as BERT (an
# ONNX export pools as it was exported, a sentence-transformers folder as it declares)
EMBED_POOLING = "cls"
# what an embedding model that declares no pooling (not a sentence-transformers folder) is
# exported pooled by unless told: the mean, as sentence-transformers' models pool
EXPORT_POOLING = "mean"
