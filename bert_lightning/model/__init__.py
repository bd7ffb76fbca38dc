"""The model layer: plain torch, no Lightning, no Hydra. `bert` is the encoder with its
pretraining heads, `electra` replaced-token detection (generator and discriminator), `heads`
the fine-tuning heads and the token-pooling helper, `flops` the parameter and FLOP formulas.
Names mirror Hugging Face `modeling_bert.py`."""

from bert_lightning.model.bert import (
    BertConfig,
    BertForPreTraining,
    BertModel,
    EncoderOutput,
    PreTrainingOutput,
    init_weights,
)
from bert_lightning.model.electra import ElectraForPreTraining, RTDOutput, generator_config
from bert_lightning.model.flops import (
    distill_flops,
    encoder_parameter_formula,
    num_parameters,
    pretraining_flops,
    rtd_flops,
)

__all__ = [
    "BertConfig",
    "BertForPreTraining",
    "BertModel",
    "distill_flops",
    "ElectraForPreTraining",
    "EncoderOutput",
    "PreTrainingOutput",
    "RTDOutput",
    "encoder_parameter_formula",
    "init_weights",
    "num_parameters",
    "pretraining_flops",
    "generator_config",
    "rtd_flops",
]
