"""Task heads on the encoder, in plain torch, named as Hugging Face names them (`bert`,
`dropout`, `classifier`), so a fine-tuned state dict is a `BertForSequenceClassification` /
`BertForTokenClassification` one by key."""

from __future__ import annotations

from torch import nn

from bert_lightning.model import BertConfig, BertModel, init_weights


class BertForSequenceClassification(nn.Module):
    """One row of logits per sequence from the pooled `[CLS]` (num_labels=1: a score)."""

    def __init__(self, config: BertConfig, num_labels: int):
        super().__init__()
        self.config, self.num_labels = config, num_labels
        self.bert = BertModel(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        init_weights(self.classifier, config.initializer_range)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        pooled = self.bert(input_ids, token_type_ids, attention_mask).pooler_output  # (B, H)
        return self.classifier(self.dropout(pooled))  # (B, num_labels)


class BertForTokenClassification(nn.Module):
    """Logits for every token; HF's token model has no pooler, nor does this one."""

    def __init__(self, config: BertConfig, num_labels: int):
        super().__init__()
        self.config, self.num_labels = config, num_labels
        self.bert = BertModel(config, add_pooling_layer=False)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        init_weights(self.classifier, config.initializer_range)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        h = self.bert(input_ids, token_type_ids, attention_mask).last_hidden_state  # (B, T, H)
        return self.classifier(self.dropout(h))  # (B, T, num_labels)
